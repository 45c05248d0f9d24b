// Package tracing makes each delivery attempt an OpenTelemetry span and exports spans with
// OTLP when, and only when, the standard OTEL_* environment asks for it (FromEnv).
//
// A span is the child of the producer's trace when the event carries a valid W3C
// `traceparent` (and `tracestate`), and a new root otherwise: there is no producer context to
// link to, and the attributes (delivery id, event id) find every attempt of a delivery. The
// receiver gets the attempt span's own context in `traceparent`, so its spans are children of
// the attempt.
//
// The ingress makes each event it publishes a span too (StartPublish, webhook.publish, of kind
// PRODUCER), the child of the caller's trace context; the event carries the publish span's
// context in its traceparent, so every delivery attempt of the event is a child of its
// publish, in the caller's trace.
//
// A nil *Tracer traces nothing and costs nothing: StartAttempt returns at once, no span is
// made and nothing is allocated (TestOffAllocatesNothing), and the request carries the
// producer's trace context unchanged, as it did before tracing existed.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// SpanName is the name of every attempt span.
const SpanName = "webhook.attempt"

// PublishSpanName is the name of the ingress's span of one published event.
const PublishSpanName = "webhook.publish"

// Attribute keys of an attempt span (besides http.request.method, http.response.status_code
// and server.address of the HTTP semantic conventions).
const (
	AttrNamespace        = attribute.Key("webhook.namespace")
	AttrEndpoint         = attribute.Key("webhook.endpoint")
	AttrDeliveryID       = attribute.Key("webhook.delivery_id")
	AttrEventID          = attribute.Key("webhook.event_id")
	AttrEventType        = attribute.Key("webhook.event_type")
	AttrAttempt          = attribute.Key("webhook.attempt")
	AttrReplayOf         = attribute.Key("webhook.replay_of")
	AttrOutcome          = attribute.Key("webhook.outcome")
	AttrFailureReason    = attribute.Key("webhook.failure_reason")
	AttrDeadLetterReason = attribute.Key("webhook.dead_letter_reason")
	AttrLatencyMS        = attribute.Key("webhook.latency_ms")
	// AttrStream and AttrSequence say where the ingress's publish stored the event;
	// AttrDuplicate that it was stored before (the same id within the duplicate window).
	AttrStream    = attribute.Key("webhook.stream")
	AttrSequence  = attribute.Key("webhook.stream_sequence")
	AttrDuplicate = attribute.Key("webhook.duplicate")
)

// Tracer makes attempt spans. A nil *Tracer traces nothing.
type Tracer struct {
	tracer trace.Tracer
}

// New returns a Tracer over a tracer provider (tests pass one with an in-memory exporter).
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer("github.com/webhook-operator/webhook-operator/dispatcher", trace.WithInstrumentationVersion(version.Version))}
}

// Start describes the attempt a span is started for.
type Start struct {
	Namespace, Endpoint, DeliveryID, EventID, EventType, ReplayOf string
	Attempt                                                       int
	// TraceParent and TraceState are the producer's W3C trace context, if any.
	TraceParent, TraceState string
}

// Attempt is the span of one attempt (or of one publish, StartPublish); the zero value records
// nothing.
type Attempt struct {
	span trace.Span
}

// StartAttempt starts the span of an attempt, the child of the producer's trace when s
// carries one. The returned context holds the span, so Outcome can annotate it.
func (t *Tracer) StartAttempt(ctx context.Context, s Start) (context.Context, Attempt) {
	if t == nil {
		return ctx, Attempt{}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		AttrNamespace.String(s.Namespace), AttrEndpoint.String(s.Endpoint), AttrDeliveryID.String(s.DeliveryID),
		AttrEventID.String(s.EventID), AttrEventType.String(s.EventType), AttrAttempt.Int(s.Attempt),
		semconv.HTTPRequestMethodPost)}
	if s.ReplayOf != "" {
		opts = append(opts, trace.WithAttributes(AttrReplayOf.String(s.ReplayOf)))
	}
	parent := propagation.TraceContext{}.Extract(ctx, carrier{parent: s.TraceParent, state: s.TraceState})
	if !trace.SpanContextFromContext(parent).IsValid() {
		opts = append(opts, trace.WithNewRoot())
		parent = ctx
	}
	ctx, span := t.tracer.Start(parent, SpanName, opts...)
	return ctx, Attempt{span: span}
}

// Publish describes an event the ingress publishes.
type Publish struct {
	Namespace, EventID, EventType string
	// TraceParent and TraceState are the caller's W3C trace context, if any.
	TraceParent, TraceState string
}

// StartPublish starts the span of one published event, the child of the caller's trace
// context when p carries one. Its Context is what the event's traceparent holds.
func (t *Tracer) StartPublish(ctx context.Context, p Publish) (context.Context, Attempt) {
	if t == nil {
		return ctx, Attempt{}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		AttrNamespace.String(p.Namespace), AttrEventID.String(p.EventID), AttrEventType.String(p.EventType))}
	parent := propagation.TraceContext{}.Extract(ctx, carrier{parent: p.TraceParent, state: p.TraceState})
	if !trace.SpanContextFromContext(parent).IsValid() {
		opts = append(opts, trace.WithNewRoot())
		parent = ctx
	}
	ctx, span := t.tracer.Start(parent, PublishSpanName, opts...)
	return ctx, Attempt{span: span}
}

// Published records where the publish of the span held by ctx stored its event, or why it
// failed.
func Published(ctx context.Context, stream string, seq uint64, duplicate bool, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return
	}
	span.SetAttributes(AttrStream.String(stream), AttrSequence.Int64(int64(seq)), AttrDuplicate.Bool(duplicate))
}

// ValidTraceParent reports whether traceparent (with tracestate) is a W3C trace context a
// span can continue.
func ValidTraceParent(traceparent, tracestate string) bool {
	if traceparent == "" {
		return false
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), carrier{parent: traceparent, state: tracestate})
	return trace.SpanContextFromContext(ctx).IsValid()
}

// Context is the W3C trace context the request carries: the attempt span's own, or, when
// nothing is traced, the producer's (traceparent and tracestate as given).
func (a Attempt) Context(traceparent, tracestate string) (string, string) {
	if a.span == nil {
		return traceparent, tracestate
	}
	sc := a.span.SpanContext()
	if !sc.IsValid() {
		return traceparent, tracestate
	}
	flags := "00"
	if sc.IsSampled() {
		flags = "01"
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + flags, sc.TraceState().String()
}

// End ends the span.
func (a Attempt) End() {
	if a.span != nil {
		a.span.End()
	}
}

// Outcome records what an attempt came to (the delivery-log record of its outcome) on the
// attempt span held by ctx, if any: outcome, reasons, status code and latency.
func Outcome(ctx context.Context, rec *records.LogRecord) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{AttrOutcome.String(rec.State), AttrLatencyMS.Float64(float64(rec.LatencyUS) / 1000)}
	if rec.Response.StatusCode != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(rec.Response.StatusCode))
	}
	if rec.Reason != "" {
		attrs = append(attrs, AttrFailureReason.String(rec.Reason))
	}
	if rec.DeadLetterReason != "" {
		attrs = append(attrs, AttrDeadLetterReason.String(rec.DeadLetterReason))
	}
	span.SetAttributes(attrs...)
	if rec.State != records.StateSucceeded {
		desc := rec.Reason
		if rec.DeadLetterReason != "" {
			desc = "dead_letter: " + rec.DeadLetterReason
		}
		span.SetStatus(codes.Error, desc)
	}
}

// carrier holds the producer's two W3C headers for the propagator.
type carrier struct{ parent, state string }

func (c carrier) Get(key string) string {
	switch key {
	case records.HeaderTraceParent:
		return c.parent
	case records.HeaderTraceState:
		return c.state
	}
	return ""
}
func (c carrier) Set(string, string) {}
func (c carrier) Keys() []string {
	return []string{records.HeaderTraceParent, records.HeaderTraceState}
}

// Settings is what FromEnv reads of the standard OTEL_* environment.
type Settings struct {
	// Enabled says spans are exported.
	Enabled bool
	// Protocol is "grpc" or "http/protobuf".
	Protocol string
}

// Environment variables FromEnv reads itself; the exporter reads the rest of the standard
// set (OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS, _TIMEOUT, _CERTIFICATE, _INSECURE... and their
// _TRACES_ forms), the SDK OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*, and the resource
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
const (
	EnvSDKDisabled       = "OTEL_SDK_DISABLED"
	EnvTracesExporter    = "OTEL_TRACES_EXPORTER"
	EnvEndpoint          = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint    = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol          = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol    = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvServiceName       = "OTEL_SERVICE_NAME"
	EnvResourceAttribute = "OTEL_RESOURCE_ATTRIBUTES"
)

// ReadSettings decides from the environment (getenv) whether spans are exported: not when
// OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is "none"; yes when it is "otlp", or when
// it is unset and an OTLP endpoint is set. The protocol is OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL,
// "http/protobuf" by default as the specification says.
func ReadSettings(getenv func(string) string) (Settings, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return Settings{}, nil
	}
	s := Settings{}
	switch exp := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter))); exp {
	case "none":
		return Settings{}, nil
	case "otlp":
		s.Enabled = true
	case "":
		s.Enabled = getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != ""
	default:
		return Settings{}, fmt.Errorf("%s=%q: only otlp and none are supported", EnvTracesExporter, exp)
	}
	if !s.Enabled {
		return s, nil
	}
	s.Protocol = strings.TrimSpace(getenv(EnvTracesProtocol))
	if s.Protocol == "" {
		s.Protocol = strings.TrimSpace(getenv(EnvProtocol))
	}
	switch s.Protocol {
	case "":
		s.Protocol = "http/protobuf"
	case "grpc", "http/protobuf":
	default:
		return Settings{}, fmt.Errorf("OTLP protocol %q: only grpc and http/protobuf are supported", s.Protocol)
	}
	return s, nil
}

// FromEnv returns the Tracer the standard OTEL_* environment asks for, and the function that
// flushes and stops its exporter; a nil Tracer (and a no-op shutdown) when the environment
// asks for none. service is the default service.name (OTEL_SERVICE_NAME wins); attrs are
// resource attributes of this process (OTEL_RESOURCE_ATTRIBUTES wins).
func FromEnv(ctx context.Context, service string, attrs ...attribute.KeyValue) (*Tracer, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	s, err := ReadSettings(os.Getenv)
	if err != nil || !s.Enabled {
		return nil, none, err
	}
	var exp sdktrace.SpanExporter
	if s.Protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, none, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(append([]attribute.KeyValue{semconv.ServiceName(service), semconv.ServiceVersion(version.Version)}, attrs...)...),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, none, fmt.Errorf("the trace resource (%s, %s): %w", EnvServiceName, EnvResourceAttribute, err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return New(tp), tp.Shutdown, nil
}
