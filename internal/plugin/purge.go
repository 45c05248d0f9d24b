package plugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/deadletters"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// PurgeResult is what dlq purge reports: the selection, how many dead letters it selected
// and purged, by reason and by endpoint, and the operational event that records the purge.
type PurgeResult struct {
	Namespace string `json:"namespace"`
	// Endpoint, Reasons and Before are the selection: the dead letters of Endpoint (all of
	// the namespace's when empty), of one of Reasons (any when empty), dead-lettered before
	// Before (any time when absent).
	Endpoint string     `json:"endpoint,omitempty"`
	Reasons  []string   `json:"reasons,omitempty"`
	Before   *time.Time `json:"before,omitempty"`
	DryRun   bool       `json:"dryRun"`
	// Selected is how many dead letters the selection matched: what a dry run would purge.
	Selected int64 `json:"selected"`
	// Purged is how many were deleted (none in a dry run).
	Purged int64 `json:"purged"`
	// ByReason and ByEndpoint count what was purged (in a dry run, what was selected).
	ByReason   map[string]int64 `json:"byReason"`
	ByEndpoint map[string]int64 `json:"byEndpoint"`
	// DeadLetters are the selected dead letters, in a dry run only, at most MaxPurgeListed.
	DeadLetters []DeadLetterItem `json:"deadLetters,omitempty"`
	// Event is the id of the operational event webhook_operator.dlq.purged that records the
	// purge; empty when nothing was purged.
	Event string `json:"event,omitempty"`
}

// Bounds of a purge.
const (
	// MaxPurgeListed bounds the dead letters a dry run lists; it counts them all.
	MaxPurgeListed = 1000
)

// deadLetterReasons are the reasons a delivery is dead-lettered (the API's DeadLetterReason).
var deadLetterReasons = deadletters.Reasons

type purgeOptions struct {
	all       bool
	reasons   []string
	olderThan string
	dryRun    bool
}

func newDLQPurgeCommand(o *Options) *cobra.Command {
	po := &purgeOptions{}
	cmd := &cobra.Command{
		Use:   "purge [endpoint] (--all | --reason R... | --older-than AGE) [--dry-run]",
		Short: "Delete dead letters of an endpoint or of the namespace, by reason and by age",
		Long: `Delete dead letters for good: those of one endpoint (of the whole namespace without one), of
the reasons named by --reason, dead-lettered before --older-than; --all, instead of both,
every one. Dead letters dead-lettered after the purge began are never touched.

--dry-run lists what would go (up to ` + fmt.Sprint(MaxPurgeListed) + `, counting them all) and deletes nothing.

A purge is recorded as the operational event webhook_operator.dlq.purged of the namespace,
with its counts by reason and by endpoint, which endpoints subscribed to webhook_operator.*
events receive.

The purge goes through the data API: a deletecollection of webhookdeadletters
(data.webhook-operator.io) with the selection as field selectors. Kubernetes RBAC decides who
may purge: deletecollection on webhookdeadletters in the namespace (the ClusterRole
webhook-operator-editor grants it); a dry run needs only list.`,
		Example: `  kubectl webhooks dlq purge orders --reason test_failed --dry-run
  kubectl webhooks dlq purge orders --older-than 720h
  kubectl webhooks dlq purge --reason endpoint_deleted --older-than 2026-07-01T00:00:00Z
  kubectl webhooks dlq purge orders --all -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			return po.run(ctx, o, name)
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&po.all, "all", false, "every dead letter of the endpoint or, without one, of the namespace")
	f.StringArrayVar(&po.reasons, "reason", nil, "only dead letters of this reason, e.g. exhausted (repeatable)")
	f.StringVar(&po.olderThan, "older-than", "", "only dead letters dead-lettered longer ago than this (e.g. 72h) or before this time (RFC 3339)")
	f.BoolVar(&po.dryRun, "dry-run", false, "list what would be purged and delete nothing")
	return cmd
}

// selection checks the flags and returns the selection's bound in time (zero: none).
func (po *purgeOptions) selection(name string, now time.Time) (time.Time, error) {
	switch {
	case !po.all && len(po.reasons) == 0 && po.olderThan == "":
		return time.Time{}, usagef("say which dead letters to purge: --reason, --older-than, or --all for every one of %s", map[bool]string{true: "the endpoint", false: "the namespace"}[name != ""])
	case po.all && (len(po.reasons) > 0 || po.olderThan != ""):
		return time.Time{}, usagef("--all purges every dead letter: leave out --reason and --older-than, or --all")
	}
	if name != "" {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return time.Time{}, usagef("%q is not an endpoint name: %s", name, strings.Join(errs, "; "))
		}
	}
	for _, r := range po.reasons {
		if !slices.Contains(deadLetterReasons, r) {
			return time.Time{}, usagef("--reason %q is not a dead-letter reason: one of %s", r, strings.Join(deadLetterReasons, ", "))
		}
	}
	if po.olderThan == "" {
		return time.Time{}, nil
	}
	before, _, err := parseTime("--older-than", po.olderThan, now)
	return before, err
}

// selectors are the data API's field selectors of the selection: one per reason (the API
// selects one reason at a time), or one for every reason.
func (po *purgeOptions) selectors(name string, before time.Time) []fields.Set {
	base := fields.Set{}
	if name != "" {
		base[datav1alpha1.FieldEndpoint] = name
	}
	if !before.IsZero() {
		base[datav1alpha1.FieldUntil] = before.UTC().Format(time.RFC3339Nano)
	}
	if len(po.reasons) == 0 {
		return []fields.Set{base}
	}
	var out []fields.Set
	for _, r := range slices.Compact(slices.Sorted(slices.Values(po.reasons))) {
		s := fields.Set{datav1alpha1.FieldReason: r}
		for k, v := range base {
			s[k] = v
		}
		out = append(out, s)
	}
	return out
}

func (po *purgeOptions) run(ctx context.Context, o *Options, name string) error {
	now := o.Now()
	before, err := po.selection(name, now)
	if err != nil {
		return err
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	res := PurgeResult{Namespace: ns, Endpoint: name, Reasons: po.reasons, DryRun: po.dryRun,
		ByReason: map[string]int64{}, ByEndpoint: map[string]int64{}}
	if !before.IsZero() {
		res.Before = &before
	}
	var failed error
	if po.dryRun {
		failed = po.dryRunList(ctx, o, ns, name, before, &res)
	} else {
		failed = po.purge(ctx, o, ns, name, before, &res)
	}
	if failed != nil {
		if res.Purged == 0 {
			return failed
		}
		return fmt.Errorf("purged %d dead letters of %s, then: %w", res.Purged, where(ns, name), failed)
	}
	if res.ByReason[reasonUnreadable] > 0 {
		writeLine(o.IO.ErrOut, "warning: %d dead letters could not be read: they are purged only without --reason", res.ByReason[reasonUnreadable])
	}
	if res.Selected == 0 && o.Output == OutputTable {
		writeLine(o.IO.ErrOut, "No dead letters of %s match (%s): nothing to purge.", where(ns, name), po.describe(before))
		return nil
	}
	return o.print(res, func(w io.Writer) { po.table(w, res, before, now) })
}

// purge deletes the selected dead letters through the data API: a deletecollection of
// webhookdeadletters with the selection's field selectors, which purges at most
// datav1alpha1.MaxPurge at a time among those stored when it began, records each purge as the
// operational event webhook_operator.dlq.purged and returns what it purged.
func (po *purgeOptions) purge(ctx context.Context, o *Options, ns, name string, before time.Time, res *PurgeResult) error {
	rc, err := o.Data()
	if err != nil {
		return err
	}
	what := fmt.Sprintf("the dead letters of %s (%s)", where(ns, name), datav1alpha1.ResourceDeadLetters)
	var events []string
	for _, sel := range po.selectors(name, before) {
		// Bounded: each round purges what was stored when it began, and stops short of a full
		// round once those are gone.
		for range maxPurgeRounds {
			var list datav1alpha1.WebhookDeadLetterList
			err := rc.Delete().Namespace(ns).Resource(datav1alpha1.ResourceDeadLetters).
				VersionedParams(&metav1.ListOptions{FieldSelector: fields.SelectorFromSet(sel).String()}, dataParams).
				Timeout(2 * dataCallTimeout).Do(ctx).Into(&list)
			if err != nil {
				return dataError(err, "deletecollection", what, ns)
			}
			for i := range list.Items {
				d := &list.Items[i]
				res.Purged++
				res.Selected++
				res.ByReason[d.Status.Reason]++
				res.ByEndpoint[d.Spec.Endpoint]++
				if ev := d.Annotations[datav1alpha1.AnnotationPurgeEvent]; ev != "" && !slices.Contains(events, ev) {
					events = append(events, ev)
				}
			}
			if len(list.Items) < datav1alpha1.MaxPurge {
				break
			}
		}
	}
	res.Event = strings.Join(events, ",")
	return nil
}

// maxPurgeRounds bounds the deletecollections of one reason's purge (each up to
// datav1alpha1.MaxPurge dead letters).
const maxPurgeRounds = 100

// dryRunList selects what a purge would take through the data API's lists with the same field
// selectors, counts it and lists up to MaxPurgeListed.
func (po *purgeOptions) dryRunList(ctx context.Context, o *Options, ns, name string, before time.Time, res *PurgeResult) error {
	what := fmt.Sprintf("the dead letters of %s (%s)", where(ns, name), datav1alpha1.ResourceDeadLetters)
	for _, sel := range po.selectors(name, before) {
		cont := ""
		for range maxDryRunPages {
			var list datav1alpha1.WebhookDeadLetterList
			if err := o.listData(ctx, ns, datav1alpha1.ResourceDeadLetters, dataList{fields: sel, limit: dryRunPage, cont: cont}, &list); err != nil {
				return dataError(err, "get/list", what, ns)
			}
			for i := range list.Items {
				d := &list.Items[i]
				res.Selected++
				res.ByReason[d.Status.Reason]++
				res.ByEndpoint[d.Spec.Endpoint]++
				if len(res.DeadLetters) < MaxPurgeListed {
					res.DeadLetters = append(res.DeadLetters, o.deadLetterItem(d))
				}
			}
			if cont = list.Continue; cont == "" {
				break
			}
		}
	}
	return nil
}

// Bounds of a dry run's reading: pages of dryRunPage dead letters, at most maxDryRunPages of
// them per reason.
const (
	dryRunPage     = 1000
	maxDryRunPages = 1000
)

// describe says what the selection takes.
func (po *purgeOptions) describe(before time.Time) string {
	var parts []string
	if len(po.reasons) > 0 {
		parts = append(parts, "reason "+strings.Join(po.reasons, " or "))
	}
	if !before.IsZero() {
		parts = append(parts, "dead-lettered before "+ts(before))
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, ", ")
}

// counts is a count by key, largest first: "exhausted 3, test_failed 1".
func counts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func (po *purgeOptions) table(w io.Writer, res PurgeResult, before time.Time, now time.Time) {
	what := where(res.Namespace, res.Endpoint)
	if res.DryRun {
		writeLine(w, "Would purge %d dead letters of %s (%s):", res.Selected, what, po.describe(before))
		deadLetterTable(w, res.DeadLetters, now)
		if n := res.Selected - int64(len(res.DeadLetters)); n > 0 {
			writeLine(w, "... and %d more", n)
		}
		writeLine(w, "By reason: %s. By endpoint: %s.", counts(res.ByReason), counts(res.ByEndpoint))
		writeLine(w, "Nothing was deleted (--dry-run).")
		return
	}
	writeLine(w, "Purged %d dead letters of %s (%s).", res.Purged, what, po.describe(before))
	writeLine(w, "By reason: %s. By endpoint: %s.", counts(res.ByReason), counts(res.ByEndpoint))
	if res.Event != "" {
		writeLine(w, "Recorded as the operational event %s (%s).", res.Event, records.OpsDeadLettersPurged)
	}
}
