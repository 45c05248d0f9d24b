package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/replay"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// DefaultTestEventType and DefaultTestData are what `kubectl webhooks test` sends without
// --type and --data.
const (
	DefaultTestEventType = "webhook.test"
	DefaultTestData      = `{"test":true}`
)

// TestResult is what `kubectl webhooks test` reports: the delivery it created and, with
// --wait, its outcome.
type TestResult struct {
	DeliveryID string `json:"deliveryId"`
	EventID    string `json:"eventId"`
	EventType  string `json:"eventType"`
	Namespace  string `json:"namespace"`
	Endpoint   string `json:"endpoint"`
	Subject    string `json:"subject"`
	// Outcome is the delivery-log record of its one attempt (--wait only).
	Outcome *records.LogRecord `json:"outcome,omitempty"`
}

type testOptions struct {
	eventType string
	data      string
	wait      bool
	timeout   time.Duration
}

func newTestCommand(o *Options) *cobra.Command {
	to := &testOptions{}
	cmd := &cobra.Command{
		Use:   "test <endpoint> [--type T] [--data JSON] [--wait]",
		Short: "Send one test delivery to one endpoint",
		Long: `Send a one-shot test delivery to one endpoint only: it goes straight onto the endpoint's
delivery subject (no other endpoint sees it, whatever its event types), is signed and
reported like any delivery (delivery log, health), and gets exactly one attempt: when it
fails it is dead-lettered with reason test_failed, never retried. It carries no
webhook-sequence (it is not an event of the events stream).

--wait waits for the outcome (up to --timeout) and exits 1 when the attempt failed. A
disabled or suspended endpoint refuses test deliveries (exit 3).`,
		Example: `  kubectl webhooks test orders
  kubectl webhooks test orders --type order.created --data '{"order_id":"ord_test"}' --wait`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return to.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVar(&to.eventType, "type", DefaultTestEventType, "the test event's type (webhook-event-type)")
	f.StringVarP(&to.data, "data", "d", DefaultTestData, "the test event's JSON body: @file, - for standard input, or the JSON itself")
	f.BoolVar(&to.wait, "wait", false, "wait for the outcome of the attempt and report it")
	f.DurationVar(&to.timeout, "timeout", time.Minute, "how long --wait waits")
	return cmd
}

func (to *testOptions) run(ctx context.Context, o *Options, name string) error {
	if err := ValidateEventType(to.eventType); err != nil {
		return &Error{Code: ExitUsage, Err: fmt.Errorf("--type: %w", err)}
	}
	body, err := readBody("--data", to.data, o.IO.In)
	if err != nil {
		return err
	}
	if !json.Valid(body) {
		return usagef("--data is not valid JSON")
	}
	if to.timeout <= 0 || to.timeout > time.Hour {
		return usagef("--timeout must be positive and at most 1h")
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	ep, err := o.GetEndpoint(ctx, ns, name)
	if err != nil {
		return err
	}
	if why := replay.Refusal(ep); why != "" {
		// A test delivery is a new delivery: refused as a replay is.
		return refusedf("%s", why)
	}
	if ep.Spec.Suspend {
		return refusedf("endpoint %s/%s is suspended (spec.suspend): a test delivery would wait until it is resumed", ns, name)
	}
	_, js, err := o.JetStream(ctx)
	if err != nil {
		return err
	}

	now := o.Now().UTC()
	eventID := newEventID()
	res := TestResult{DeliveryID: records.DeliveryID(eventID, ns, name), EventID: eventID, EventType: to.eventType,
		Namespace: ns, Endpoint: name, Subject: o.Set(ns).DeliveryTarget(name, streams.LaneOf(&ep.Spec))}
	msg := nats.NewMsg(res.Subject)
	msg.Header.Set(records.HeaderContentType, "application/json")
	records.SetDeliveryMeta(msg.Header, records.DeliveryMeta{DeliveryID: res.DeliveryID, EventID: eventID, EventType: to.eventType,
		EventTime: now, Namespace: ns, Endpoint: name, Created: now, Test: true})
	msg.Header.Set(records.HeaderMsgID, res.DeliveryID)
	msg.Data = body
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return o.deliveriesRateRestricted(ctx, ns, fmt.Errorf("publishing the test delivery to %s: %w", res.Subject, err))
	}
	if err := checkAck(ack, o.Set(ns).DeliveriesStream()); err != nil {
		return err
	}
	if to.wait {
		rec, err := to.outcome(ctx, o, res)
		if err != nil {
			return err
		}
		res.Outcome = rec
	}
	if err := o.print(res, func(w io.Writer) { printTest(w, res) }); err != nil {
		return err
	}
	if res.Outcome != nil && res.Outcome.State != records.StateSucceeded {
		return &Error{Code: ExitError, Err: fmt.Errorf("the test delivery %s failed", res.DeliveryID)}
	}
	return nil
}

// outcome polls the delivery through the data API (webhookdeliveries) until it succeeded or
// was dead-lettered, for at most --timeout.
func (to *testOptions) outcome(ctx context.Context, o *Options, res TestResult) (*records.LogRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, to.timeout)
	defer cancel()
	what := fmt.Sprintf("test delivery %s (%s)", res.DeliveryID, datav1alpha1.ResourceDeliveries)
	for {
		var d datav1alpha1.WebhookDelivery
		err := o.getData(ctx, res.Namespace, datav1alpha1.ResourceDeliveries, res.DeliveryID, "", &d)
		switch {
		case err == nil && (d.Status.State == datav1alpha1.StateSucceeded || d.Status.State == datav1alpha1.StateDeadLettered):
			return outcomeRecord(&d), nil
		case err != nil && !objectNotFound(err) && ctx.Err() == nil:
			return nil, dataError(err, "get/list", what, res.Namespace)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no outcome of test delivery %s within %s: it is still queued or in flight (is a dispatcher running, is the circuit open?); follow it with `kubectl webhooks log %s`",
				res.DeliveryID, to.timeout, res.Endpoint)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// outcomeRecord is a finished delivery of the data API as the delivery-log record of its
// outcome (without the response's body and the request's headers, which are its payload's).
func outcomeRecord(d *datav1alpha1.WebhookDelivery) *records.LogRecord {
	e := logEntryOf(d, false)
	rec := &records.LogRecord{DeliveryID: e.ID, EventID: e.EventID, EventType: e.EventType, Namespace: d.Namespace, Endpoint: d.Spec.Endpoint,
		State: e.Status, Attempt: e.Attempts, Reason: e.Reason, DeadLetterReason: e.DeadLetterReason, ReplayOf: e.ReplayOfID, Test: e.Test,
		LatencyMS: deref(e.LatencyMS), LatencyUS: deref(e.LatencyUS)}
	if e.LastAttemptAt != nil {
		rec.Time = *e.LastAttemptAt
	}
	if e.LastResponse != nil {
		rec.Response = *e.LastResponse
	}
	return rec
}

func printTest(w io.Writer, res TestResult) {
	writeLine(w, "sent test delivery %s (event %s, type %s) to %s/%s on %s", res.DeliveryID, res.EventID, res.EventType, res.Namespace, res.Endpoint, res.Subject)
	r := res.Outcome
	if r == nil {
		return
	}
	status := "no response"
	if r.Response.StatusCode != 0 {
		status = fmt.Sprintf("HTTP %d", r.Response.StatusCode)
	}
	if r.State == records.StateSucceeded {
		writeLine(w, "succeeded: %s in %s", status, latency(r.LatencyMS, r.LatencyUS))
		return
	}
	why := r.Reason
	if r.Response.Error != "" {
		why += ": " + short(r.Response.Error, 120)
	}
	writeLine(w, "failed: %s (%s); dead-lettered as %s: kubectl webhooks dlq show %s", status, why, r.DeadLetterReason, res.DeliveryID)
}
