package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/replay"
)

// ReplayReport is what replay and recover report: the WebhookReplay they created (or found
// under the same idempotency key) and, with --wait, how it ended.
type ReplayReport struct {
	Namespace string `json:"namespace"`
	Endpoint  string `json:"endpoint"`
	// Replay is the WebhookReplay's name (the idempotency key).
	Replay string `json:"replay"`
	// Created is false when a WebhookReplay with this idempotency key existed already: it
	// replays nothing twice, and this command made nothing new.
	Created bool `json:"created"`
	// Deliveries are the new delivery ids the replay of each dead letter named by --id gets.
	Deliveries []ReplayedDelivery `json:"deliveries,omitempty"`
	// Complete, Reason and Message are the WebhookReplay's Complete condition.
	Complete bool   `json:"complete"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	Selected int64  `json:"selected"`
	Replayed int64  `json:"replayed"`
	Skipped  int64  `json:"skipped"`
	Failed   int64  `json:"failed"`
	// Problems are the first deliveries refused or failed.
	Problems []v1alpha1.ReplayProblem `json:"problems,omitempty"`
}

// ReplayedDelivery names the delivery the replay of a dead letter makes.
type ReplayedDelivery struct {
	Original   string `json:"original"`
	DeliveryID string `json:"deliveryId"`
}

type replayOptions struct {
	recover bool
	ids     []string
	all     bool
	since   string
	until   string
	reasons []string
	key     string
	rate    int32
	wait    bool
	timeout time.Duration
	// relative is set when --since or --until was a duration (2h): the time it stands for
	// moves from one run to the next.
	relative bool
}

func newReplayCommand(o *Options) *cobra.Command {
	ro := &replayOptions{}
	cmd := &cobra.Command{
		Use:   "replay <endpoint> (--id ID... | --all | --since TIME [--until TIME]) [--reason R]... [--idempotency-key KEY] [--rate N] [--wait]",
		Short: "Replay dead letters of an endpoint: creates a WebhookReplay",
		Long: `Replay dead letters of one endpoint by creating a WebhookReplay, which the controller runs.
Each dead letter becomes a new delivery of that endpoint only, pointing at the original
(replayOfId), and runs the full retry schedule; the original dead letter stays as it is.

--idempotency-key names the WebhookReplay (a Kubernetes name: lowercase letters, digits, '-'
and '.'): a dead letter is replayed at most once per key, so the same command again creates
nothing new. Without one, every replay is a new WebhookReplay with a generated name.

--wait prints the replay's progress until it is complete (up to --timeout); it exits 1 when
some deliveries could not be replayed. A disabled endpoint refuses replays (exit code 3) and
nothing is created: re-enable it first with ` + "`kubectl webhooks enable <endpoint>`" + `.

Kubernetes RBAC decides who may replay: creating webhookreplays in the namespace.`,
		Example: `  kubectl webhooks replay orders --id whdl_0123456789abcdefghjkmnpqrs --wait
  kubectl webhooks replay orders --all --idempotency-key after-fix-2026-07-19
  kubectl webhooks replay orders --since 2h --reason exhausted --rate 50
  kubectl webhooks replay orders --since 2026-07-19T09:00:00Z --until 2026-07-19T12:00:00Z`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return ro.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringArrayVar(&ro.ids, "id", nil, "replay the dead letter with this delivery id (repeatable, up to 100)")
	f.BoolVar(&ro.all, "all", false, "replay every dead letter of the endpoint")
	f.StringVar(&ro.since, "since", "", "replay dead letters dead-lettered at or after this time (RFC 3339) or this long ago (e.g. 2h)")
	f.StringVar(&ro.until, "until", "", "with --since: only those dead-lettered before this time (RFC 3339) or this long ago")
	f.StringArrayVar(&ro.reasons, "reason", nil, "with --all or --since: only dead letters of this reason, e.g. exhausted (repeatable)")
	ro.addCommon(f)
	return cmd
}

func newRecoverCommand(o *Options) *cobra.Command {
	ro := &replayOptions{recover: true}
	cmd := &cobra.Command{
		Use:   "recover <endpoint> --since TIME [--until TIME] [--idempotency-key KEY] [--rate N] [--wait]",
		Short: "Send an endpoint's deliveries of a time range again, succeeded ones included: creates a WebhookReplay",
		Long: `Recover sends again every delivery of one endpoint whose outcome the delivery log recorded
between --since and --until (until now without it), succeeded and dead-lettered ones alike:
for a receiver that lost what it had acknowledged. It creates a WebhookReplay with source
DeliveryLog, which the controller runs; each delivery is sent once more, as a new delivery of
that endpoint pointing at the original, with the event's body from the events stream (kept
72h by default) or its dead letter. Test deliveries are left out.

--idempotency-key, --rate, --wait and the refusal of a disabled endpoint are as for replay.`,
		Example: `  kubectl webhooks recover orders --since 2026-07-19T09:00:00Z --until 2026-07-19T12:00:00Z --wait
  kubectl webhooks recover orders --since 3h --idempotency-key orders-outage-0719 --rate 20`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return ro.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVar(&ro.since, "since", "", "recover what was attempted at or after this time (RFC 3339) or this long ago (e.g. 3h); required")
	f.StringVar(&ro.until, "until", "", "recover what was attempted before this time (RFC 3339) or this long ago; default: now")
	ro.addCommon(f)
	return cmd
}

func (ro *replayOptions) addCommon(f interface {
	StringVar(*string, string, string, string)
	Int32Var(*int32, string, int32, string)
	BoolVar(*bool, string, bool, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}) {
	f.StringVar(&ro.key, "idempotency-key", "", "name of the WebhookReplay: the same key never replays a delivery twice")
	f.Int32Var(&ro.rate, "rate", 0, "create at most this many deliveries per second (1 to 10000; default: as fast as the controller writes them)")
	f.BoolVar(&ro.wait, "wait", false, "print the replay's progress until it is complete")
	f.DurationVar(&ro.timeout, "timeout", 10*time.Minute, "how long --wait waits")
}

// spec turns the flags into a WebhookReplay's spec.
func (ro *replayOptions) spec(endpoint string, now time.Time) (v1alpha1.WebhookReplaySpec, error) {
	spec := v1alpha1.WebhookReplaySpec{EndpointRef: v1alpha1.LocalObjectReference{Name: endpoint}, Source: v1alpha1.ReplayDeadLetters}
	if ro.recover {
		spec.Source = v1alpha1.ReplayDeliveryLog
		if ro.since == "" {
			return spec, usagef("--since is required: recover sends again what the delivery log recorded from then on")
		}
	} else {
		n := 0
		for _, set := range []bool{len(ro.ids) > 0, ro.all, ro.since != ""} {
			if set {
				n++
			}
		}
		switch {
		case n != 1:
			return spec, usagef("say which dead letters to replay: exactly one of --id, --all or --since")
		case ro.until != "" && ro.since == "":
			return spec, usagef("--until goes with --since")
		case len(ro.reasons) > 0 && len(ro.ids) > 0:
			return spec, usagef("--reason selects among dead letters: use it with --all or --since, not --id")
		case len(ro.ids) > 100:
			return spec, usagef("at most 100 --id at once; replay more with --all, --since or --reason")
		}
		for _, id := range ro.ids {
			if err := checkDeliveryID("--id", id); err != nil {
				return spec, err
			}
		}
		spec.DeliveryIDs = ro.ids
		for _, r := range ro.reasons {
			spec.Reasons = append(spec.Reasons, v1alpha1.DeadLetterReason(r))
		}
	}
	for _, t := range []struct {
		flag, value string
		into        **metav1.Time
	}{{"--since", ro.since, &spec.Since}, {"--until", ro.until, &spec.Until}} {
		if t.value == "" {
			continue
		}
		at, relative, err := parseTime(t.flag, t.value, now)
		if err != nil {
			return spec, err
		}
		ro.relative = ro.relative || relative
		mt := metav1.NewTime(at)
		*t.into = &mt
	}
	if spec.Since != nil && spec.Until != nil && !spec.Since.Before(spec.Until) {
		return spec, usagef("--until must be later than --since")
	}
	if ro.rate != 0 {
		if ro.rate < 1 || ro.rate > 10000 {
			return spec, usagef("--rate must be 1 to 10000 deliveries per second")
		}
		spec.RatePerSecond = &ro.rate
	}
	return spec, nil
}

func (ro *replayOptions) run(ctx context.Context, o *Options, name string) error {
	spec, err := ro.spec(name, o.Now())
	if err != nil {
		return err
	}
	if ro.key != "" {
		if errs := validation.IsDNS1123Subdomain(ro.key); len(errs) > 0 {
			return usagef("--idempotency-key %q names the WebhookReplay, so it must be a Kubernetes name: %s", ro.key, strings.Join(errs, "; "))
		}
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
		return refusedf("%s; no replay was created", why)
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	wr := &v1alpha1.WebhookReplay{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ro.key}, Spec: spec}
	if ro.key == "" {
		wr.GenerateName = name + "-replay-"
	}
	report := &ReplayReport{Namespace: ns, Endpoint: name, Created: true}
	if err := c.Create(ctx, wr); err != nil {
		switch {
		case apierrors.IsInvalid(err):
			return usagef("the API server refused the WebhookReplay: %v", err)
		case !apierrors.IsAlreadyExists(err):
			return kubeError(err, "webhookreplay %q in namespace %q", ro.key, ns)
		}
		existing := &v1alpha1.WebhookReplay{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ro.key}, existing); err != nil {
			return kubeError(err, "webhookreplay %q in namespace %q", ro.key, ns)
		}
		if !sameSelection(&existing.Spec, &spec, ro.relative) {
			return refusedf("WebhookReplay %s/%s exists with another selection (endpoint %s, source %s): an idempotency key names one replay; use another key",
				ns, ro.key, existing.Spec.EndpointRef.Name, existing.Spec.Source)
		}
		wr, report.Created = existing, false
	}
	report.Replay = wr.Name
	for _, id := range spec.DeliveryIDs {
		report.Deliveries = append(report.Deliveries, ReplayedDelivery{Original: id, DeliveryID: replay.ReplayedID(id, wr.Name)})
	}
	if ro.wait {
		if wr, err = ro.waitComplete(ctx, o, c, wr); err != nil {
			return err
		}
	}
	report.fill(wr)
	if err := o.print(report, func(w io.Writer) { report.table(w, ro.wait) }); err != nil {
		return err
	}
	if ro.wait && report.Failed > 0 {
		return fmt.Errorf("%d of the %d selected deliveries could not be replayed (kubectl get whr %s -o yaml: status.problems)", report.Failed, report.Selected, wr.Name)
	}
	return nil
}

// sameSelection reports whether an existing WebhookReplay's spec selects what the flags
// select. A time given as a duration (2h) stands for another time at each run, so with
// relative times only their presence is compared.
func sameSelection(existing, wanted *v1alpha1.WebhookReplaySpec, relative bool) bool {
	x, y := existing.DeepCopy(), wanted.DeepCopy()
	if relative {
		for _, s := range []*v1alpha1.WebhookReplaySpec{x, y} {
			s.Since, s.Until = timeMark(s.Since), timeMark(s.Until)
		}
	}
	return equality.Semantic.DeepEqual(x, y)
}

// timeMark keeps only whether a time is set.
func timeMark(t *metav1.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	return &metav1.Time{}
}

// waitComplete prints the replay's progress on standard error until it is complete, refused
// or --timeout passes.
func (ro *replayOptions) waitComplete(ctx context.Context, o *Options, c client.Client, wr *v1alpha1.WebhookReplay) (*v1alpha1.WebhookReplay, error) {
	ctx, cancel := context.WithTimeout(ctx, ro.timeout)
	defer cancel()
	last := ""
	for {
		cur := &v1alpha1.WebhookReplay{}
		err := c.Get(ctx, client.ObjectKeyFromObject(wr), cur)
		switch {
		case apierrors.IsNotFound(err):
			return nil, notFoundf("WebhookReplay %s/%s was deleted while waiting for it", wr.Namespace, wr.Name)
		case err != nil && ctx.Err() == nil:
			return nil, kubeError(err, "webhookreplay %q in namespace %q", wr.Name, wr.Namespace)
		case err == nil:
			complete := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionComplete)
			if complete != nil && complete.ObservedGeneration == cur.Generation {
				if line := fmt.Sprintf("%s: %s", cur.Name, complete.Message); line != last {
					writeLine(o.IO.ErrOut, "%s", line)
					last = line
				}
				if complete.Status == metav1.ConditionTrue {
					return cur, nil
				}
				if complete.Reason == v1alpha1.ReasonEndpointDisabled {
					return nil, refusedf("%s (WebhookReplay %s/%s waits for it)", complete.Message, cur.Namespace, cur.Name)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("WebhookReplay %s/%s is not complete after %s (%s): follow it with `kubectl get whr %s -w`",
				wr.Namespace, wr.Name, ro.timeout, orDash(last), wr.Name)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// fill copies the replay's status into the report.
func (r *ReplayReport) fill(wr *v1alpha1.WebhookReplay) {
	st := wr.Status
	r.Selected, r.Replayed, r.Skipped, r.Failed, r.Problems = st.Selected, st.Replayed, st.Skipped, st.Failed, st.Problems
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionComplete); c != nil {
		r.Complete, r.Reason, r.Message = c.Status == metav1.ConditionTrue, c.Reason, c.Message
	}
}

func (r *ReplayReport) table(w io.Writer, waited bool) {
	verb := "created"
	if !r.Created {
		verb = "exists already (the same idempotency key): nothing new is replayed"
	}
	writeLine(w, "webhookreplay %s/%s %s", r.Namespace, r.Replay, verb)
	for _, d := range r.Deliveries {
		writeLine(w, "dead letter %s is replayed as delivery %s", d.Original, d.DeliveryID)
	}
	if !waited && !r.Complete {
		writeLine(w, "follow it with: kubectl get whr %s -w (or add --wait)", r.Replay)
		return
	}
	writeLine(w, "%s/%s: %d selected, %d replayed, %d skipped, %d failed", r.Namespace, r.Endpoint, r.Selected, r.Replayed, r.Skipped, r.Failed)
	for _, p := range r.Problems {
		writeLine(w, "  %s %s: %s", strings.ToLower(p.Outcome), p.DeliveryID, short(p.Message, 160))
	}
}

// parseTime reads --since or --until: an RFC 3339 time, or a duration before now (relative).
func parseTime(flag, s string, now time.Time) (t time.Time, relative bool, err error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), false, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d).UTC().Truncate(time.Second), true, nil
	}
	return time.Time{}, false, usagef("%s %q: want an RFC 3339 time (2026-07-19T09:00:00Z) or a duration such as 2h", flag, s)
}
