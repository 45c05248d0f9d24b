package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/plugin/jsread"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Outcomes of replaying one dead letter.
const (
	// ReplayCreated: a new delivery was published.
	ReplayCreated = "created"
	// ReplayAlreadyReplayed: the idempotency key (or JetStream's de-duplication) says this
	// dead letter was already replayed; nothing new was created.
	ReplayAlreadyReplayed = "already_replayed"
	// ReplayRefused: the dead letter cannot be replayed faithfully (its payload was cut).
	ReplayRefused = "refused"
	// ReplayFailed: publishing failed.
	ReplayFailed = "failed"
)

// ReplayResult is the outcome of replaying one dead letter.
type ReplayResult struct {
	// Original is the dead letter's delivery id; DeliveryID the new delivery's.
	Original   string `json:"original"`
	DeliveryID string `json:"deliveryId,omitempty"`
	EventID    string `json:"eventId,omitempty"`
	Status     string `json:"status"`
	// IdempotentReplay is true when an earlier replay with the same key is reported instead
	// of a new one (like an Idempotent-Replay: true response header).
	IdempotentReplay bool   `json:"idempotentReplay"`
	Message          string `json:"message,omitempty"`
	// Sequence of the new delivery in the deliveries stream.
	Sequence uint64 `json:"sequence,omitempty"`
}

// ReplayReport is what replay reports.
type ReplayReport struct {
	Namespace string         `json:"namespace"`
	Endpoint  string         `json:"endpoint"`
	Subject   string         `json:"subject"`
	Results   []ReplayResult `json:"results"`
	Created   int            `json:"created"`
	Already   int            `json:"alreadyReplayed"`
	Refused   int            `json:"refused"`
	Failed    int            `json:"failed"`
}

func (r *ReplayReport) add(res ReplayResult) {
	r.Results = append(r.Results, res)
	switch res.Status {
	case ReplayCreated:
		r.Created++
	case ReplayAlreadyReplayed:
		r.Already++
	case ReplayRefused:
		r.Refused++
	default:
		r.Failed++
	}
}

// replayKeyValue is what the key-value bucket remembers of an idempotent replay.
type replayKeyValue struct {
	DeliveryID     string    `json:"deliveryId"`
	ReplayOf       string    `json:"replayOf"`
	IdempotencyKey string    `json:"idempotencyKey"`
	CreatedAt      time.Time `json:"createdAt"`
}

type replayOptions struct {
	id    string
	all   bool
	since string
	key   string

	ns, ep string
	sinceT time.Time
	kv     jetstream.KeyValue
}

func newReplayCommand(o *Options) *cobra.Command {
	ro := &replayOptions{}
	cmd := &cobra.Command{
		Use:   "replay <endpoint> (--id ID | --all | --since TIME)",
		Short: "Replay dead letters of an endpoint as new deliveries",
		Long: `Replay dead letters of one endpoint. Each becomes a new pending delivery of that endpoint
only, pointing at the original (replayOfId), and runs the full retry schedule; the original
dead letter stays as it is.

With --idempotency-key, replaying again with the same key creates nothing new and reports
the earlier replay (Idempotent-Replay). Without one, every replay creates a new delivery.

A disabled endpoint refuses replays (exit code 3): re-enable it first with
` + "`kubectl webhooks enable <endpoint>`" + `. A dead letter of another endpoint is not found (4).`,
		Example: `  kubectl webhooks replay orders --id whdl_0123456789abcdefghjkmnpqrs
  kubectl webhooks replay orders --all --idempotency-key after-fix-2026-07-19
  kubectl webhooks replay orders --since 2h
  kubectl webhooks replay orders --since 2026-07-19T09:00:00Z`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return ro.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVar(&ro.id, "id", "", "replay the dead letter with this delivery id")
	f.BoolVar(&ro.all, "all", false, "replay every dead letter of the endpoint")
	f.StringVar(&ro.since, "since", "", "replay dead letters dead-lettered at or after this time (RFC 3339) or this long ago (e.g. 2h)")
	f.StringVar(&ro.key, "idempotency-key", "", "make the replay idempotent: the same key never replays a dead letter twice")
	return cmd
}

func (ro *replayOptions) run(ctx context.Context, o *Options, name string) error {
	n := 0
	for _, set := range []bool{ro.id != "", ro.all, ro.since != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return usagef("say which dead letters to replay: exactly one of --id, --all or --since")
	}
	if ro.id != "" {
		if err := checkDeliveryID("--id", ro.id); err != nil {
			return err
		}
	}
	if ro.since != "" {
		t, err := parseSince(ro.since, o.Now())
		if err != nil {
			return err
		}
		ro.sinceT = t
	}
	if strings.TrimSpace(ro.key) != ro.key || len(ro.key) > 255 {
		return usagef("--idempotency-key must have no surrounding spaces and at most 255 characters")
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	ro.ns, ro.ep = ns, name
	ep, err := o.GetEndpoint(ctx, ns, name)
	if err != nil {
		return err
	}
	if err := refuseDisabled(ep); err != nil {
		return err
	}
	st, err := o.openDLQ(ctx, ns)
	if err != nil {
		return err
	}
	_, js, err := o.JetStream(ctx)
	if err != nil {
		return err
	}
	if ro.key != "" {
		if ro.kv, err = js.KeyValue(ctx, o.Set(ns).Bucket()); err != nil {
			return o.streamError(err, "the key-value bucket "+o.Set(ns).Bucket())
		}
	}
	report := &ReplayReport{Namespace: ns, Endpoint: name, Subject: o.Set(ns).DeliverySubject(name), Results: []ReplayResult{}}
	if ro.id != "" {
		m, err := st.Last(ctx, o.Set(ns).DeadLetterSubject(name, ro.id))
		if errors.Is(err, jsread.ErrNotFound) {
			return ro.notHere(ctx, o, st)
		}
		if err != nil {
			return err
		}
		report.add(ro.replayOne(ctx, o, js, m))
	} else if err := ro.replayMany(ctx, o, js, st, report); err != nil {
		return err
	}
	if err := o.printReplay(report, ro); err != nil {
		return err
	}
	switch {
	case report.Failed > 0:
		return fmt.Errorf("%d of %d replays failed", report.Failed, len(report.Results))
	case report.Refused > 0:
		return refusedf("%d of %d dead letters were refused", report.Refused, len(report.Results))
	}
	return nil
}

// refuseDisabled refuses a replay to a disabled endpoint.
func refuseDisabled(ep *v1alpha1.WebhookEndpoint) error {
	c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionDisabled)
	if c == nil || c.Status != metav1.ConditionTrue {
		return nil
	}
	since := c.LastTransitionTime.UTC()
	if h := ep.Status.Health; h != nil && h.DisabledSince != nil {
		since = h.DisabledSince.UTC()
	}
	why := c.Reason
	if c.Message != "" {
		why += ": " + c.Message
	}
	pendingEnable := ""
	if v := ep.Annotations[v1alpha1.AnnotationEnable]; v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.After(since) {
			pendingEnable = fmt.Sprintf(" (re-enabling was requested at %s; the dispatcher has not confirmed it yet: retry in a moment)", v)
		}
	}
	return refusedf("endpoint %s/%s is disabled since %s (%s): re-enable it with `kubectl webhooks enable %s` first%s",
		ep.Namespace, ep.Name, since.Format(time.RFC3339), why, ep.Name, pendingEnable)
}

// notHere explains why --id names no dead letter of this endpoint.
func (ro *replayOptions) notHere(ctx context.Context, o *Options, st *jsread.Stream) error {
	m, err := st.Last(ctx, o.Set(ro.ns).DeadLetterIDFilter(ro.id))
	if err == nil {
		other := ""
		if dl, perr := records.ParseDeadLetter(m.Header); perr == nil {
			other = dl.Endpoint
		}
		return notFoundf("dead letter %s belongs to endpoint %q, not %q: a replay only targets the endpoint it was dead-lettered for",
			ro.id, other, ro.ep)
	}
	return notFoundf("dead letter %s not found for endpoint %s/%s", ro.id, ro.ns, ro.ep)
}

// replayMany replays every dead letter of the endpoint (--all), or those since a time, oldest
// first, up to the last one stored when it started.
func (ro *replayOptions) replayMany(ctx context.Context, o *Options, js jetstream.JetStream, st *jsread.Stream, report *ReplayReport) error {
	filter := o.Set(ro.ns).DeadLetterFilter(ro.ep)
	last := st.LastSeq
	var batch []jsread.Msg
	var err error
	if ro.all {
		batch, err = st.Forward(ctx, filter, st.FirstSeq, 256)
	} else {
		batch, err = st.ForwardFrom(ctx, filter, ro.sinceT, 256)
	}
	total, _ := st.Count(ctx, filter, ro.sinceT)
	done := 0
	progress := func(final bool) {
		if total < 50 || (!final && done%100 != 0) {
			return
		}
		writeLine(o.IO.ErrOut, "replayed %d/%d dead letters of %s/%s (created %d, already replayed %d, refused %d, failed %d)",
			done, total, ro.ns, ro.ep, report.Created, report.Already, report.Refused, report.Failed)
	}
	for err == nil && len(batch) > 0 {
		for i := range batch {
			m := &batch[i]
			if m.Seq > last {
				progress(true)
				return nil
			}
			done++
			if !ro.sinceT.IsZero() {
				if dl, perr := records.ParseDeadLetter(m.Header); perr == nil && !dl.DeadLetteredAt.IsZero() && dl.DeadLetteredAt.Before(ro.sinceT) {
					progress(false)
					continue
				}
			}
			report.add(ro.replayOne(ctx, o, js, m))
			progress(false)
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		batch, err = st.Forward(ctx, filter, batch[len(batch)-1].Seq+1, 256)
	}
	if err != nil {
		return err
	}
	progress(true)
	return nil
}

// replayOne replays one dead-letter message.
func (ro *replayOptions) replayOne(ctx context.Context, o *Options, js jetstream.JetStream, m *jsread.Msg) ReplayResult {
	dl, err := records.ParseDeadLetter(m.Header)
	if err != nil {
		return ReplayResult{Status: ReplayFailed, Message: fmt.Sprintf("unreadable dead letter at sequence %d: %v", m.Seq, err)}
	}
	res := ReplayResult{Original: dl.DeliveryID, EventID: dl.EventID}
	if dl.PayloadTruncated {
		res.Status, res.Message = ReplayRefused, "the payload was cut when it was dead-lettered: replaying it would deliver a different body"
		return res
	}
	key, kvKey := ro.key, ""
	if key == "" {
		// No key, no idempotency: every replay is a new delivery with its own id.
		key = "auto/" + randomToken()
	} else {
		kvKey = streams.ReplayKey(ro.ep, ro.key+"/"+dl.DeliveryID)
		if prev, ok, err := ro.lookup(ctx, kvKey); err != nil {
			res.Status, res.Message = ReplayFailed, err.Error()
			return res
		} else if ok {
			res.Status, res.DeliveryID, res.IdempotentReplay = ReplayAlreadyReplayed, prev, true
			return res
		}
	}
	newID := records.ReplayDeliveryID(dl.DeliveryID, key)
	// The record contract makes the delivery: the event's own headers as the dead letter kept
	// them (never an operator's or JetStream's), the new delivery's metadata, its id as the
	// message id.
	msg := records.NewDelivery(o.Set(ro.ns).DeliverySubject(ro.ep), nats.Header(dl.Headers), m.Data, records.DeliveryMeta{
		DeliveryID: newID,
		EventID:    dl.EventID,
		EventType:  dl.EventType,
		EventTime:  dl.EventTime,
		EventSeq:   dl.EventSeq,
		Namespace:  ro.ns,
		Endpoint:   ro.ep,
		Created:    o.Now().UTC(),
		ReplayOf:   dl.DeliveryID,
	})
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		res.Status, res.Message = ReplayFailed, fmt.Sprintf("publishing to %s: %v", msg.Subject, err)
		return res
	}
	res.DeliveryID, res.Sequence = newID, ack.Sequence
	res.Status = ReplayCreated
	if ack.Duplicate {
		// The same key raced with another replay: JetStream kept one delivery.
		res.Status, res.IdempotentReplay = ReplayAlreadyReplayed, true
	}
	if kvKey != "" {
		v, _ := json.Marshal(replayKeyValue{DeliveryID: newID, ReplayOf: dl.DeliveryID, IdempotencyKey: ro.key, CreatedAt: o.Now().UTC()})
		if _, err := ro.kv.Create(ctx, kvKey, v, o.Set(ro.ns).ReplayKeyTTL()...); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			res.Message = fmt.Sprintf("replayed, but recording the idempotency key failed (a repeat within the de-duplication window still creates nothing): %v", err)
		}
	}
	return res
}

// lookup reads a recorded replay: the delivery id it created.
func (ro *replayOptions) lookup(ctx context.Context, kvKey string) (string, bool, error) {
	e, err := ro.kv.Get(ctx, kvKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("reading the idempotency key: %w", err)
	}
	var v replayKeyValue
	if json.Unmarshal(e.Value(), &v) == nil && v.DeliveryID != "" {
		return v.DeliveryID, true, nil
	}
	return strings.TrimSpace(string(e.Value())), true, nil
}

// parseSince reads --since: an RFC 3339 time or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, usagef("--since %q: want an RFC 3339 time (2026-07-19T09:00:00Z) or a duration such as 2h", s)
}

func (o *Options) printReplay(r *ReplayReport, ro *replayOptions) error {
	return o.print(r, func(w io.Writer) {
		if ro.id != "" && len(r.Results) == 1 {
			res := r.Results[0]
			switch res.Status {
			case ReplayCreated:
				writeLine(w, "replayed dead letter %s as delivery %s (pending, replayOf %s) on %s", res.Original, res.DeliveryID, res.Original, r.Subject)
			case ReplayAlreadyReplayed:
				writeLine(w, "dead letter %s was already replayed as %s (Idempotent-Replay: true): nothing new created", res.Original, res.DeliveryID)
			default:
				writeLine(w, "dead letter %s not replayed: %s", res.Original, res.Message)
			}
			return
		}
		if len(r.Results) == 0 {
			writeLine(w, "no dead letters of %s/%s to replay", r.Namespace, r.Endpoint)
			return
		}
		row(w, "ORIGINAL", "REPLAY", "STATUS", "MESSAGE")
		for _, res := range r.Results {
			row(w, orDash(res.Original), orDash(res.DeliveryID), res.Status, orDash(short(res.Message, 80)))
		}
		writeLine(w, "")
		writeLine(w, "%s/%s: %d replayed as new deliveries, %d already replayed, %d refused, %d failed",
			r.Namespace, r.Endpoint, r.Created, r.Already, r.Refused, r.Failed)
	})
}
