package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// Routes of the ingress.
const (
	// EventsPath is the JSON form: one event, or an array of them.
	EventsPath = "/v1/namespaces/{namespace}/events"
	// CloudEventsPath takes CloudEvents 1.0 in binary, structured or batched mode.
	CloudEventsPath = "/v1/namespaces/{namespace}/cloudevents"
)

// Defaults of the bounds.
const (
	DefaultMaxBatchEvents = 500
	DefaultMaxBatchBytes  = 4 << 20
	DefaultMaxConcurrent  = 512
	DefaultPublishTimeout = 5 * time.Second
	// envelopeBytes is what a single event's body may hold beyond its data: the id, type,
	// attributes and JSON framing.
	envelopeBytes = 64 << 10
)

// Options configure the handler.
type Options struct {
	// JS publishes; its connection's MaxPayload bounds a message (MaxPayload).
	JS jetstream.JetStream
	// MaxPayload is the server's maximum message size (nats.Conn.MaxPayload).
	MaxPayload func() int64
	// Names are the JetStream names (events subject prefix, events stream prefix).
	Names streams.Names
	// Auth decides who may publish where.
	Auth *Authorizer
	// RateLimit bounds each namespace's events per second on this replica (nil: unbounded).
	RateLimit *RateLimiter
	// MaxEventBytes bounds one event's data (the installation's --max-event-bytes).
	MaxEventBytes int
	// MaxBatchEvents and MaxBatchBytes bound a batch.
	MaxBatchEvents int
	MaxBatchBytes  int64
	// MaxConcurrent bounds the requests handled at once (authenticated first); more are
	// answered 503 at once.
	MaxConcurrent int
	// MaxBodyBytesInFlight bounds the bytes of request bodies held at once, and
	// MaxBodyBytesPerNamespace those of one namespace (default a quarter of it); a body that
	// would need more is answered 503 with Retry-After.
	MaxBodyBytesInFlight     int64
	MaxBodyBytesPerNamespace int64
	// PublishTimeout bounds waiting for JetStream's acknowledgements of one request.
	PublishTimeout time.Duration
	Tracer         *tracing.Tracer
	Metrics        *Metrics
	Log            logr.Logger
}

func (o *Options) defaults() {
	if o.MaxEventBytes <= 0 {
		o.MaxEventBytes = 1 << 20
	}
	if o.MaxBatchEvents <= 0 {
		o.MaxBatchEvents = DefaultMaxBatchEvents
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = DefaultMaxConcurrent
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	// Each budget holds at least the largest body, which would otherwise never be read.
	largest := max(int64(o.MaxEventBytes)+envelopeBytes, o.MaxBatchBytes)
	if o.MaxBodyBytesInFlight <= 0 {
		o.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	o.MaxBodyBytesInFlight = max(o.MaxBodyBytesInFlight, largest)
	if o.MaxBodyBytesPerNamespace <= 0 {
		o.MaxBodyBytesPerNamespace = o.MaxBodyBytesInFlight / 4
	}
	o.MaxBodyBytesPerNamespace = min(max(o.MaxBodyBytesPerNamespace, largest), o.MaxBodyBytesInFlight)
	if o.MaxPayload == nil {
		o.MaxPayload = func() int64 { return 0 }
	}
}

// handler serves the routes.
type handler struct {
	o      Options
	limits eventLimits
	slots  chan struct{}
	bodies *bodyBudget
}

// NewHandler returns the ingress's HTTP handler: the two routes, each authenticated,
// authorized, bounded and rate-limited, answering 202 only after JetStream acknowledged
// every event of the request.
func NewHandler(o Options) http.Handler {
	o.defaults()
	h := &handler{o: o, limits: eventLimits{maxEventBytes: o.MaxEventBytes}, slots: make(chan struct{}, o.MaxConcurrent),
		bodies: &bodyBudget{total: o.MaxBodyBytesInFlight, perNamespace: o.MaxBodyBytesPerNamespace, metrics: o.Metrics}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+EventsPath, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, "events") })
	mux.HandleFunc("POST "+CloudEventsPath, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, "cloudevents") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if isRoute(r.URL.Path) {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "events are published with POST")
			return
		}
		noRoute(w)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The mux would answer a path it cleans (.., ., //) with a redirect to the clean one:
		// no route of the ingress is reached that way.
		if p := r.URL.Path; p == "" || p[0] != '/' || path.Clean(p) != p {
			noRoute(w)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// isRoute says whether p is one of the routes' paths, whatever the method.
func isRoute(p string) bool {
	seg := strings.Split(p, "/")
	return len(seg) == 5 && seg[0] == "" && seg[1] == "v1" && seg[2] == "namespaces" && seg[3] != "" &&
		(seg[4] == "events" || seg[4] == "cloudevents")
}

func noRoute(w http.ResponseWriter) {
	writeError(w, http.StatusNotFound, "no such route: POST "+EventsPath+" (JSON events) or "+CloudEventsPath+" (CloudEvents)")
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request, route string) {
	start := time.Now()
	status := h.handle(w, r, route)
	h.o.Metrics.request(route, status, time.Since(start).Seconds())
}

// handle answers one request and returns its status. The order bounds what a caller costs
// before it is known: the path and headers are checked, the caller authenticated and
// authorized (a token that cannot be one is refused without asking the API server), the
// namespace's rate asked, and only then is a slot taken and the body read, into a buffer that
// grows as bytes arrive within the budget of bodies held at once.
func (h *handler) handle(w http.ResponseWriter, r *http.Request, route string) int {
	ns := r.PathValue("namespace")
	if err := streams.ValidateNamespace(ns); err != nil {
		h.o.Metrics.reject(RejectInvalid, 1)
		return writeError(w, http.StatusNotFound, err.Error())
	}
	for k := range r.Header {
		if records.IsOperatorHeader(k) {
			h.o.Metrics.reject(RejectInvalid, 1)
			return writeError(w, http.StatusBadRequest, fmt.Sprintf("header %s: Nats-* and Whk-* headers belong to JetStream and the operator; a producer may not set them", records.Bound(k, 64)))
		}
	}
	d, err := h.o.Auth.Authorize(r.Context(), bearerToken(r.Header), ns)
	if errors.Is(err, ErrBusy) {
		h.o.Metrics.reject(RejectOverloaded, 1)
		w.Header().Set("Retry-After", "1")
		return writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the ingress is verifying %d new callers at once, its bound (--max-reviews-in-flight): retry", h.o.Auth.maxReviews()))
	}
	if err != nil {
		h.o.Metrics.reject(RejectUnavailable, 1)
		h.o.Log.Info("cannot authorize a request now", "namespace", ns, "error", err.Error())
		w.Header().Set("Retry-After", "1")
		return writeError(w, http.StatusServiceUnavailable, "cannot verify the caller now (the Kubernetes API server did not answer): retry")
	}
	if d.Status != 0 {
		if d.Status == http.StatusUnauthorized {
			h.o.Metrics.reject(RejectUnauthenticated, 1)
			w.Header().Set("WWW-Authenticate", `Bearer realm="webhook-operator"`)
		} else {
			h.o.Metrics.reject(RejectForbidden, 1)
		}
		return writeError(w, d.Status, d.Reason)
	}
	// Over its rate, a namespace's request is refused before its body is read.
	if ok, wait := h.o.RateLimit.Ready(ns, time.Now()); !ok {
		return h.rateLimited(w, ns, 1, wait)
	}
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		h.o.Metrics.reject(RejectOverloaded, 1)
		w.Header().Set("Retry-After", "1")
		return writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the ingress handles %d requests at once and is at that bound: retry (with the same event ids, which are de-duplicated)", h.o.MaxConcurrent))
	}
	if m := h.o.Metrics; m != nil {
		m.inflight.Inc()
		defer m.inflight.Dec()
	}

	limit := int64(h.o.MaxEventBytes) + envelopeBytes
	if h.o.MaxBatchBytes > limit {
		limit = h.o.MaxBatchBytes
	}
	body, held, err := h.bodies.readBody(w, r, ns, limit)
	defer h.bodies.give(ns, held)
	if err != nil {
		var tooLarge *http.MaxBytesError
		var budget *budgetError
		switch {
		case errors.As(err, &tooLarge):
			h.o.Metrics.reject(RejectTooLarge, 1)
			return writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", limit))
		case errors.As(err, &budget):
			h.o.Metrics.reject(RejectOverloaded, 1)
			w.Header().Set("Retry-After", "1")
			return writeError(w, http.StatusServiceUnavailable, budget.msg)
		}
		return writeError(w, http.StatusBadRequest, "reading the body: "+err.Error())
	}

	if len(body) > h.o.MaxEventBytes+envelopeBytes && !isBatch(route, r.Header, body) {
		h.o.Metrics.reject(RejectTooLarge, 1)
		return writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes (one event: --max-event-bytes of data and its envelope)", h.o.MaxEventBytes+envelopeBytes))
	}
	var (
		events []*pending
		errs   []*inputError
		batch  bool
		perr   *inputError
	)
	if route == "events" {
		events, errs, batch, perr = parseJSON(body, h.limits, h.o.MaxBatchEvents)
		parent, state := r.Header.Get(records.HeaderTraceParent), r.Header.Get(records.HeaderTraceState)
		for _, p := range events {
			if p != nil && tracing.ValidTraceParent(parent, state) {
				p.traceparent, p.tracestate = parent, state
			}
		}
	} else {
		events, errs, batch, perr = parseCloudEvents(r, body, h.limits, h.o.MaxBatchEvents)
	}
	if perr != nil {
		h.o.Metrics.reject(rejectReason(perr.status), 1)
		return writeError(w, perr.status, perr.msg)
	}
	results := make([]Result, len(events))
	bad := 0
	for i, e := range errs {
		if e != nil {
			results[i] = Result{Status: e.status, Error: e.msg}
			bad++
		}
	}
	for i, p := range events {
		if p == nil {
			continue
		}
		results[i].ID, results[i].Type = p.id, p.eventType
		if e := h.address(ns, p); e != nil {
			results[i].Status, results[i].Error = e.status, e.msg
			bad++
		}
	}
	if bad > 0 {
		// Bad input publishes nothing, not even the good events of its batch: fix and resend.
		h.o.Metrics.reject(RejectInvalid, bad)
		if !batch {
			return writeError(w, results[0].Status, results[0].Error)
		}
		status := 0
		for i := range results {
			if results[i].Status == 0 {
				results[i].Status, results[i].Error = http.StatusFailedDependency, "not published: another event of the batch is invalid"
			} else if status == 0 {
				status = results[i].Status
			}
		}
		return writeJSON(w, status, BatchResult{Results: results})
	}
	if perSecond, burst := h.o.RateLimit.Limits(ns); perSecond > 0 && len(events) > burst {
		// No wait would let it through: say the largest batch that can pass, not when to retry.
		h.o.Metrics.reject(RejectTooLarge, len(events))
		return writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the batch holds %d events; namespace %s publishes at most %d at once through this ingress replica (its burst, at %g events per second): send batches of at most %d events",
			len(events), ns, burst, perSecond, burst))
	}
	if ok, wait := h.o.RateLimit.Reserve(ns, len(events), time.Now()); !ok {
		return h.rateLimited(w, ns, len(events), wait)
	}

	h.publish(r.Context(), ns, events, results)
	if !batch {
		if results[0].Status != http.StatusAccepted {
			if results[0].Status == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			return writeError(w, results[0].Status, results[0].Error)
		}
		return writeJSON(w, http.StatusAccepted, results[0])
	}
	status := worst(results)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	return writeJSON(w, status, BatchResult{Results: results})
}

// rateLimited answers 429: namespace is over its rate for n events, which it may retry after
// wait.
func (h *handler) rateLimited(w http.ResponseWriter, ns string, n int, wait time.Duration) int {
	h.o.Metrics.reject(RejectRateLimited, n)
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(wait.Seconds()))), 10))
	perSecond, burst := h.o.RateLimit.Limits(ns)
	return writeError(w, http.StatusTooManyRequests, fmt.Sprintf("namespace %s publishes at most %g events per second through this ingress replica (burst %d): retry after %s",
		ns, perSecond, burst, wait.Round(time.Millisecond)))
}

// isBatch says whether a body is a batch: a JSON array, or CloudEvents' batched mode.
func isBatch(route string, h http.Header, body []byte) bool {
	if route == "cloudevents" {
		return cehttp.IsHTTPBatch(h)
	}
	b := bytes.TrimLeft(body, " \t\r\n")
	return len(b) > 0 && b[0] == '['
}

// publish publishes every event and waits for JetStream's acknowledgements, filling results.
func (h *handler) publish(ctx context.Context, ns string, events []*pending, results []Result) {
	ctx, cancel := context.WithTimeout(ctx, h.o.PublishTimeout)
	defer cancel()
	type inFlight struct {
		ctx   context.Context
		span  tracing.Attempt
		start time.Time
		ack   jetstream.PubAckFuture
		err   error
	}
	flights := make([]inFlight, len(events))
	for i, p := range events {
		f := &flights[i]
		f.ctx, f.span = h.o.Tracer.StartPublish(ctx, tracing.Publish{Namespace: ns, EventID: p.id, EventType: p.eventType,
			TraceParent: p.traceparent, TraceState: p.tracestate})
		if tp, ts := f.span.Context(p.traceparent, p.tracestate); tp != "" {
			p.msg.Header[records.HeaderTraceParent] = []string{tp}
			if ts != "" {
				p.msg.Header[records.HeaderTraceState] = []string{ts}
			}
		}
		f.start = time.Now()
		if len(events) == 1 {
			// One event: a synchronous publish, no future to track.
			ack, err := h.o.JS.PublishMsg(ctx, p.msg)
			h.settle(f.ctx, ns, &results[i], ack, err, f.start)
			f.span.End()
			return
		}
		f.ack, f.err = h.o.JS.PublishMsgAsync(p.msg)
	}
	for i := range flights {
		f := &flights[i]
		var ack *jetstream.PubAck
		err := f.err
		if err == nil {
			select {
			case ack = <-f.ack.Ok():
			case err = <-f.ack.Err():
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		h.settle(f.ctx, ns, &results[i], ack, err, f.start)
		f.span.End()
	}
}

// settle turns one publish's acknowledgement or error into its result.
func (h *handler) settle(ctx context.Context, ns string, res *Result, ack *jetstream.PubAck, err error, start time.Time) {
	if err == nil && ack == nil {
		err = errors.New("no acknowledgement")
	}
	tracing.Published(ctx, streamOf(ack), seqOf(ack), ack != nil && ack.Duplicate, err)
	if err != nil {
		res.Status, res.Error = h.publishError(ns, err)
		h.o.Metrics.reject(rejectReason(res.Status), 1)
		return
	}
	res.Status, res.Stream, res.Sequence, res.Duplicate = http.StatusAccepted, ack.Stream, ack.Sequence, ack.Duplicate
	h.o.Metrics.stored(ns, ack.Duplicate, time.Since(start).Seconds())
}

func streamOf(a *jetstream.PubAck) string {
	if a == nil {
		return ""
	}
	return a.Stream
}

func seqOf(a *jetstream.PubAck) uint64 {
	if a == nil {
		return 0
	}
	return a.Sequence
}

// publishError is the status and message of a publish that JetStream did not acknowledge.
func (h *handler) publishError(ns string, err error) (int, string) {
	set := h.o.Names.For(ns)
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrStreamNotFound):
		return http.StatusNotFound, fmt.Sprintf("namespace %s has no events stream %s: webhook-operator creates it with the namespace's first WebhookEndpoint; create one there first", ns, set.EventsStream())
	case errors.Is(err, nats.ErrMaxPayload):
		return http.StatusRequestEntityTooLarge, "the event is larger than the NATS server accepts: " + err.Error()
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, fmt.Sprintf("JetStream did not acknowledge the event within %s: retry with the same id (a duplicate is stored once)", h.o.PublishTimeout)
	}
	h.o.Log.Info("publish failed", "namespace", ns, "error", err.Error())
	return http.StatusServiceUnavailable, "JetStream did not store the event (" + records.Bound(err.Error(), 256) + "): retry with the same id (a duplicate is stored once)"
}

// worst is a batch's status: the one status all results share, else 207.
func worst(results []Result) int {
	status := 0
	for _, r := range results {
		switch {
		case status == 0:
			status = r.Status
		case status != r.Status:
			return http.StatusMultiStatus
		}
	}
	return status
}

func rejectReason(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return RejectTooLarge
	case http.StatusForbidden:
		return RejectForbidden
	case http.StatusNotFound:
		return RejectNoStream
	case http.StatusServiceUnavailable:
		return RejectUnavailable
	}
	return RejectInvalid
}

// errorBody is the body of every refusal.
type errorBody struct {
	Status int    `json:"status"`
	Error  string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) int {
	return writeJSON(w, status, errorBody{Status: status, Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"status":500,"error":"encoding the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return status
}

// ErrorOf reads a refusal's message from a response body (for clients: the plugin, tests).
func ErrorOf(body []byte) string {
	var e errorBody
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(body))
}
