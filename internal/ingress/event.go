package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	ce "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// Event is one event of the JSON form: POST /v1/namespaces/<ns>/events with one of these, or
// an array of them.
type Event struct {
	// ID is the event id: JetStream's Nats-Msg-Id (publishing it again within the namespace's
	// duplicate window stores nothing new) and the receivers' webhook-id. Required.
	ID string `json:"id"`
	// Type is the event type, e.g. order.created: dot-separated subject tokens. Required.
	Type string `json:"type"`
	// Data is the event's body, any JSON value. Required.
	Data json.RawMessage `json:"data"`
	// Time is the event's time (RFC 3339); default: when it is stored.
	Time string `json:"time,omitempty"`
	// Subject is what the event is about (CloudEvents' subject attribute).
	Subject string `json:"subject,omitempty"`
	// OrderingKey orders the events of one key for a PerKey endpoint (ordering.key.header:
	// Ce-Partitionkey); stored as the CloudEvents partitionkey extension.
	OrderingKey string `json:"orderingKey,omitempty"`
	// Headers are forwarded to receivers, as a NATS producer's headers are.
	Headers map[string]string `json:"headers,omitempty"`
}

// Result is what became of one event.
type Result struct {
	// Status is 202 when the event is stored (or was already), else the event's error status.
	Status int    `json:"status"`
	ID     string `json:"id,omitempty"`
	Type   string `json:"type,omitempty"`
	// Stream and Sequence are where JetStream stored it.
	Stream   string `json:"stream,omitempty"`
	Sequence uint64 `json:"sequence,omitempty"`
	// Duplicate: an event of this id was already stored within the duplicate window; nothing
	// new was stored.
	Duplicate bool   `json:"duplicate,omitempty"`
	Error     string `json:"error,omitempty"`
}

// BatchResult answers a batch: one result per event, in order.
type BatchResult struct {
	Results []Result `json:"results"`
}

// inputError is bad input: its status and what is wrong.
type inputError struct {
	status int
	msg    string
}

func (e *inputError) Error() string { return e.msg }

func badRequest(format string, a ...any) *inputError {
	return &inputError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

// pending is an event ready to publish.
type pending struct {
	id, eventType string
	msg           *nats.Msg
	traceparent   string
	tracestate    string
}

// limits of one event.
type eventLimits struct {
	maxEventBytes int
}

// check validates what every event must satisfy, whichever form it came in: id, type (a
// subject token, not an operational event's), its attributes and the size of its data.
func (l eventLimits) check(id, eventType string, attrs cloudevent.Event, data []byte) *inputError {
	switch {
	case id == "":
		return badRequest("the event has no id: the id de-duplicates a retried publish, so a producer that retries on any error loses nothing and stores nothing twice")
	case strings.TrimSpace(id) != id:
		return badRequest("the event id %q has surrounding spaces", records.Bound(id, 64))
	}
	if err := records.ValidateEventType(eventType); err != nil {
		return badRequest("the event type cannot be a subject token: %v", err)
	}
	if eventType == records.OpsTypePrefix || strings.HasPrefix(eventType, records.OpsTypePrefix+".") {
		return &inputError{status: http.StatusForbidden, msg: fmt.Sprintf("event types %s.* are the operator's own operational events: no producer may publish them", records.OpsTypePrefix)}
	}
	if why := records.InvalidEvent(id, eventType, nil); why != "" {
		return badRequest("%s", why)
	}
	if err := attrs.Validate(); err != nil {
		return badRequest("%v", err)
	}
	if len(data) > l.maxEventBytes {
		return &inputError{status: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("the event's data is %d bytes; the installation delivers at most %d (--max-event-bytes)", len(data), l.maxEventBytes)}
	}
	return nil
}

// newPending builds the message of an event.
func newPending(id, eventType string, attrs cloudevent.Event, data []byte, forward http.Header, traceparent, tracestate string) *pending {
	h := make(nats.Header, 6+len(forward)+len(attrs.Extensions))
	for k, v := range forward {
		h[k] = v
	}
	attrs.SetHeaders(h)
	h[records.HeaderMsgID] = []string{id}
	if !tracing.ValidTraceParent(traceparent, tracestate) {
		traceparent, tracestate = "", ""
	}
	return &pending{id: id, eventType: eventType, msg: &nats.Msg{Header: h, Data: data}, traceparent: traceparent, tracestate: tracestate}
}

// parseJSON reads the JSON form: one event (an object) or a batch (an array).
func parseJSON(body []byte, l eventLimits, maxBatch int) (events []*pending, errs []*inputError, batch bool, err *inputError) {
	body = bytes.TrimSpace(body)
	var list []Event
	switch {
	case len(body) == 0:
		return nil, nil, false, badRequest("the body is empty: send an event as JSON {\"id\": ..., \"type\": ..., \"data\": ...}, or an array of them")
	case body[0] == '[':
		batch = true
		if e := strictDecode(body, &list); e != nil {
			return nil, nil, true, badRequest("the body is not a JSON array of events: %v", e)
		}
		if len(list) == 0 {
			return nil, nil, true, badRequest("the batch is empty")
		}
		if len(list) > maxBatch {
			return nil, nil, true, &inputError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the batch holds %d events; at most %d are allowed", len(list), maxBatch)}
		}
	default:
		var one Event
		if e := strictDecode(body, &one); e != nil {
			return nil, nil, false, badRequest("the body is not a JSON event {\"id\": ..., \"type\": ..., \"data\": ...}: %v", e)
		}
		list = []Event{one}
	}
	events, errs = make([]*pending, len(list)), make([]*inputError, len(list))
	for i := range list {
		events[i], errs[i] = fromJSON(&list[i], l)
	}
	return events, errs, batch, nil
}

func strictDecode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// fromJSON validates one event of the JSON form.
func fromJSON(e *Event, l eventLimits) (*pending, *inputError) {
	if len(e.Data) == 0 {
		return nil, badRequest("event %s has no data: data is any JSON value (null included)", records.Bound(e.ID, 64))
	}
	attrs := cloudevent.Event{Subject: e.Subject, ContentType: "application/json"}
	if e.Time != "" {
		t, err := time.Parse(time.RFC3339Nano, e.Time)
		if err != nil {
			return nil, badRequest("event %s: time %q is not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)", records.Bound(e.ID, 64), records.Bound(e.Time, 64))
		}
		attrs.Time = t
	}
	if e.OrderingKey != "" {
		attrs.Extensions = map[string]string{cloudevent.PartitionKey: e.OrderingKey}
	}
	if err := l.check(e.ID, e.Type, attrs, e.Data); err != nil {
		return nil, err
	}
	forward, err := producerHeaders(e.Headers)
	if err != nil {
		return nil, badRequest("event %s: %v", records.Bound(e.ID, 64), err)
	}
	return newPending(e.ID, e.Type, attrs, e.Data, forward, "", ""), nil
}

// producerHeaders checks the JSON form's headers: those a NATS producer may set
// (records.CheckProducerHeader), bounded as receivers get them.
func producerHeaders(in map[string]string) (http.Header, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(in) > records.MaxForwardedHeaders {
		return nil, fmt.Errorf("%d headers; at most %d are forwarded to receivers", len(in), records.MaxForwardedHeaders)
	}
	names := make([]string, 0, len(in))
	size := 0
	for k, v := range in {
		names = append(names, k)
		size += len(k) + len(v)
	}
	if size > records.MaxForwardedHeaderBytes {
		return nil, fmt.Errorf("the headers take %d bytes; at most %d are forwarded to receivers", size, records.MaxForwardedHeaderBytes)
	}
	slices.Sort(names)
	out := make(http.Header, len(in))
	for _, k := range names {
		switch strings.ToLower(k) {
		case records.HeaderTraceParent, records.HeaderTraceState:
			return nil, fmt.Errorf("header %s: send the trace context as the request's own traceparent and tracestate headers", k)
		case strings.ToLower(records.HeaderEventTime):
			return nil, fmt.Errorf("header %s: the event's time is its time field", k)
		}
		if err := records.CheckProducerHeader(k, in[k]); err != nil {
			return nil, fmt.Errorf("header %s: %v", records.Bound(k, 64), err)
		}
		out[http.CanonicalHeaderKey(k)] = []string{in[k]}
	}
	return out, nil
}

// parseCloudEvents reads CloudEvents 1.0 in the HTTP binding's binary, structured or batched
// mode (the SDK decides by the Content-Type).
func parseCloudEvents(r *http.Request, body []byte, l eventLimits, maxBatch int) (events []*pending, errs []*inputError, batch bool, err *inputError) {
	r.Body = nopCloser{bytes.NewReader(body)}
	var list []ce.Event
	// What the SDK lets through of a structured body: data and data_base64 together.
	var structErrs []error
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == ce.ApplicationCloudEventsJSON || mt == ce.ApplicationCloudEventsBatchJSON {
		structErrs = cloudevent.CheckStructured(body, mt == ce.ApplicationCloudEventsBatchJSON)
	}
	if cehttp.IsHTTPBatch(r.Header) {
		batch = true
		evs, e := cehttp.NewEventsFromHTTPRequest(r)
		if e != nil {
			return nil, nil, true, badRequest("the body is not a batch of CloudEvents (application/cloudevents-batch+json): %v", e)
		}
		if len(evs) == 0 {
			return nil, nil, true, badRequest("the batch is empty")
		}
		if len(evs) > maxBatch {
			return nil, nil, true, &inputError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the batch holds %d events; at most %d are allowed", len(evs), maxBatch)}
		}
		list = evs
	} else {
		// Binary mode's ce-* values are percent-encoded (the HTTP binding, 3.1.3.2).
		if e := cloudevent.DecodeBinaryHeaders(r.Header); e != nil {
			return nil, nil, false, badRequest("not a CloudEvent: %v", e)
		}
		ev, e := cehttp.NewEventFromHTTPRequest(r)
		if e != nil {
			return nil, nil, false, badRequest("not a CloudEvent (binary mode: ce-specversion, ce-id, ce-source and ce-type headers; structured: application/cloudevents+json): %v", e)
		}
		list = []ce.Event{*ev}
	}
	// Trace context: the event's distributed-tracing extension, else the request's W3C headers.
	reqParent, reqState := r.Header.Get(records.HeaderTraceParent), r.Header.Get(records.HeaderTraceState)
	events, errs = make([]*pending, len(list)), make([]*inputError, len(list))
	for i := range list {
		ev := &list[i]
		if i < len(structErrs) && structErrs[i] != nil {
			errs[i] = badRequest("event %s: %v", records.Bound(ev.ID(), 64), structErrs[i])
			continue
		}
		if verr := ev.Validate(); verr != nil {
			errs[i] = badRequest("not a valid CloudEvent: %v", verr)
			continue
		}
		if ev.SpecVersion() != ce.CloudEventsVersionV1 {
			errs[i] = badRequest("CloudEvents specversion %q: the ingress takes 1.0", records.Bound(ev.SpecVersion(), 16))
			continue
		}
		attrs, parent, state, cerr := cloudevent.FromSDK(ev)
		if cerr != nil {
			errs[i] = badRequest("event %s: %v", records.Bound(ev.ID(), 64), cerr)
			continue
		}
		if parent == "" {
			parent, state = reqParent, reqState
		}
		data := attrs.Data
		attrs.Data = nil
		if err := l.check(attrs.ID, attrs.Type, attrs, data); err != nil {
			errs[i] = err
			continue
		}
		if data == nil {
			data = []byte{}
		}
		events[i] = newPending(attrs.ID, attrs.Type, attrs, data, nil, parent, state)
	}
	return events, errs, batch, nil
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }
