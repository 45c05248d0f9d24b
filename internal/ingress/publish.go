package ingress

import (
	"context"
	"net/http"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Publisher publishes one event of the JSON form with the rules and answers of
// POST /v1/namespaces/<ns>/events, for another front end that authorized its caller itself:
// the data API server's create of a WebhookEvent (internal/dataapi). Validation and publishing
// are the handler's own, so the two never disagree.
type Publisher struct{ h *handler }

// NewPublisher returns a Publisher with o's limits, JetStream and names (Auth is not used).
func NewPublisher(o Options) *Publisher {
	o.defaults()
	return &Publisher{h: &handler{o: o, limits: eventLimits{maxEventBytes: o.MaxEventBytes}}}
}

// Publish validates e as the ingress validates one event of the JSON form (traceparent and
// tracestate as a request's headers would carry them) and publishes it into namespace ns's
// events stream. The Result's Status is what the ingress answers: 202 once JetStream stored
// it (or had it already: Duplicate), else the error's status and message.
func (p *Publisher) Publish(ctx context.Context, ns string, e Event, traceparent, tracestate string) Result {
	h := p.h
	if err := streams.ValidateNamespace(ns); err != nil {
		return Result{Status: http.StatusNotFound, ID: e.ID, Type: e.Type, Error: err.Error()}
	}
	pend, bad := fromJSON(&e, h.limits)
	if bad != nil {
		h.o.Metrics.reject(rejectReason(bad.status), 1)
		return Result{Status: bad.status, ID: e.ID, Type: e.Type, Error: bad.msg}
	}
	pend.traceparent, pend.tracestate = traceparent, tracestate
	res := Result{ID: pend.id, Type: pend.eventType}
	if bad := h.address(ns, pend); bad != nil {
		h.o.Metrics.reject(RejectInvalid, 1)
		res.Status, res.Error = bad.status, bad.msg
		return res
	}
	if ok, wait := h.o.RateLimit.Reserve(ns, 1, time.Now()); !ok {
		h.o.Metrics.reject(RejectRateLimited, 1)
		res.Status, res.Error = http.StatusTooManyRequests, "namespace "+ns+" publishes more events per second than its rate allows: retry after "+wait.Round(time.Millisecond).String()
		return res
	}
	results := []Result{res}
	h.publish(ctx, ns, []*pending{pend}, results)
	return results[0]
}

// address puts an event on its subject in namespace ns and checks that it fits the server's
// maximum message.
func (h *handler) address(ns string, p *pending) *inputError {
	p.msg.Subject = h.o.Names.For(ns).EventSubject(p.eventType)
	if maxPayload := h.o.MaxPayload(); !records.Fits(p.msg, maxPayload) {
		return &inputError{status: http.StatusRequestEntityTooLarge, msg: records.TooLarge(records.MsgSize(p.msg), maxPayload)}
	}
	return nil
}
