package plugin

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Endpoint states shown by status.
const (
	StateActive    = "Active"
	StateSuspended = "Suspended"
	StateDisabled  = "Disabled"
	StateNotReady  = "NotReady"
)

// EndpointStatus is one endpoint's health as status reports it.
type EndpointStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	URL       string `json:"url"`
	// State is Active, Suspended, Disabled or NotReady; Reason and Message say why.
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`

	SuccessRate         string `json:"successRate,omitempty"`
	Attempts            int64  `json:"attempts"`
	Failures            int64  `json:"failures"`
	ConsecutiveFailures int32  `json:"consecutiveFailures"`
	Pending             int64  `json:"pending"`
	Delivered           int64  `json:"delivered"`
	DeadLettered        int64  `json:"deadLettered"`
	// Filtered counts the events spec.filter rejected.
	Filtered        int64                    `json:"filtered"`
	Circuit         string                   `json:"circuit,omitempty"`
	LastSuccessTime *time.Time               `json:"lastSuccessTime,omitempty"`
	LastFailure     *v1alpha1.AttemptFailure `json:"lastFailure,omitempty"`
	DisabledSince   *time.Time               `json:"disabledSince,omitempty"`
	// EnableRequestedAt is the enable annotation, when set.
	EnableRequestedAt string     `json:"enableRequestedAt,omitempty"`
	HealthUpdatedAt   *time.Time `json:"healthUpdatedAt,omitempty"`
	// Problems are the endpoint's conditions that are not in their good state, in the order
	// of its status: what to look at, with the writer's reason and message.
	Problems []ConditionProblem `json:"problems,omitempty"`
}

// ConditionProblem is a condition that is not in its good state.
type ConditionProblem struct {
	Type   string                 `json:"type"`
	Status metav1.ConditionStatus `json:"status"`
	Reason string                 `json:"reason"`
	// Message is the writer's explanation (the controller's or the dispatcher's).
	Message string `json:"message,omitempty"`
	// Since is when the condition last changed status.
	Since *time.Time `json:"since,omitempty"`
}

// goodStatus is the good state of the conditions whose good state is True. Ready is the only
// one in the API: every other condition of a WebhookEndpoint is "abnormal-true" (kstatus),
// good while False or absent: Disabled and CircuitOpen (the dispatcher's), Reconciling,
// Stalled and StorageLimitReached (the controller's). A condition type this plugin does not
// know yet is taken as abnormal-true too, the API's convention for new ones; Unknown is never
// good.
var goodStatus = map[string]metav1.ConditionStatus{v1alpha1.ConditionReady: metav1.ConditionTrue}

// good reports whether condition c is in its good state.
func good(c metav1.Condition) bool {
	want, ok := goodStatus[c.Type]
	if !ok {
		want = metav1.ConditionFalse
	}
	return c.Status == want
}

// problems are the conditions of cs not in their good state.
func problems(cs []metav1.Condition) []ConditionProblem {
	var out []ConditionProblem
	for _, c := range cs {
		if good(c) {
			continue
		}
		p := ConditionProblem{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
		if !c.LastTransitionTime.IsZero() {
			p.Since = timeOf(&c.LastTransitionTime)
		}
		out = append(out, p)
	}
	return out
}

// StatusOf summarises an endpoint's conditions and health.
func StatusOf(ep *v1alpha1.WebhookEndpoint) EndpointStatus {
	url := ep.Spec.URL
	if f := ep.Spec.URLFrom; f != nil {
		// A secret URL is never shown: where it comes from is.
		url = "(from Secret " + f.SecretKeyRef.Name + " key " + f.SecretKeyRef.Key + ")"
	}
	s := EndpointStatus{Namespace: ep.Namespace, Name: ep.Name, URL: url, State: StateActive,
		EnableRequestedAt: ep.Annotations[v1alpha1.AnnotationEnable], Problems: problems(ep.Status.Conditions)}
	ready := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
	disabled := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionDisabled)
	h := ep.Status.Health
	switch {
	case disabled != nil && disabled.Status == metav1.ConditionTrue:
		s.State, s.Reason, s.Message = StateDisabled, disabled.Reason, disabled.Message
		if h != nil && h.DisabledReason != "" && s.Message == "" {
			s.Message = h.DisabledReason
		}
	case ep.Spec.Suspend:
		s.State, s.Reason, s.Message = StateSuspended, v1alpha1.ReasonSuspended, "spec.suspend is true: deliveries are held in the stream"
	case ready == nil:
		s.State, s.Reason, s.Message = StateNotReady, "Unknown", "the controller has not reported on this endpoint yet"
	case ready.Status != metav1.ConditionTrue:
		s.State, s.Reason, s.Message = StateNotReady, ready.Reason, ready.Message
	}
	if h != nil {
		s.SuccessRate, s.Attempts, s.Failures = h.SuccessRate, h.Attempts, h.Failures
		s.ConsecutiveFailures, s.Pending, s.Delivered, s.DeadLettered, s.Filtered = h.ConsecutiveFailures, h.Pending, h.Delivered, h.DeadLettered, h.Filtered
		s.Circuit = string(h.CircuitState)
		s.LastSuccessTime = timeOf(h.LastSuccessTime)
		s.LastFailure = h.LastFailure
		s.DisabledSince = timeOf(h.DisabledSince)
		s.HealthUpdatedAt = timeOf(h.UpdatedAt)
	}
	return s
}

func timeOf(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := t.UTC()
	return &v
}

type statusOptions struct {
	allNamespaces bool
}

func newStatusCommand(o *Options) *cobra.Command {
	so := &statusOptions{}
	cmd := &cobra.Command{
		Use:   "status [endpoint]",
		Short: "Show the delivery health of one or all endpoints",
		Long: `Show the delivery health of endpoints as their dispatchers report it: state (Active,
Suspended, Disabled or NotReady, with the reason), success rate, pending deliveries,
circuit state, dead letters, last success and last error; then every condition that is not
in its good state (Ready not True; Disabled, CircuitOpen, Reconciling, Stalled,
StorageLimitReached or any other condition True or Unknown), with its reason and message.`,
		Example: `  kubectl webhooks status
  kubectl webhooks status orders -n shop
  kubectl webhooks status -A -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return so.run(ctx, o, args) }),
	}
	cmd.Flags().BoolVarP(&so.allNamespaces, "all-namespaces", "A", false, "show endpoints of every namespace")
	return cmd
}

func (so *statusOptions) run(ctx context.Context, o *Options, args []string) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	var items []v1alpha1.WebhookEndpoint
	if len(args) == 1 {
		if so.allNamespaces {
			return usagef("an endpoint name and --all-namespaces cannot be combined")
		}
		ep, err := o.GetEndpoint(ctx, ns, args[0])
		if err != nil {
			return err
		}
		items = append(items, *ep)
	} else {
		c, err := o.Client()
		if err != nil {
			return err
		}
		var list v1alpha1.WebhookEndpointList
		var opts []client.ListOption
		if !so.allNamespaces {
			opts = append(opts, client.InNamespace(ns))
		}
		if err := c.List(ctx, &list, opts...); err != nil {
			return kubeError(err, "webhookendpoints")
		}
		items = list.Items
		sort.Slice(items, func(i, j int) bool {
			if items[i].Namespace != items[j].Namespace {
				return items[i].Namespace < items[j].Namespace
			}
			return items[i].Name < items[j].Name
		})
	}
	out := make([]EndpointStatus, 0, len(items))
	for i := range items {
		out = append(out, StatusOf(&items[i]))
	}
	if len(out) == 0 && o.Output == OutputTable {
		where := "namespace " + ns
		if so.allNamespaces {
			where = "any namespace"
		}
		writeLine(o.IO.ErrOut, "No webhook endpoints found in %s.", where)
		return nil
	}
	var v any = out
	if len(args) == 1 {
		v = out[0]
	}
	now := o.Now()
	return o.print(v, func(w io.Writer) {
		head := []string{"NAME", "STATE", "SUCCESS", "PENDING", "CIRCUIT", "DEAD-LETTERED", "LAST SUCCESS", "LAST ERROR"}
		if so.allNamespaces {
			head = append([]string{"NAMESPACE"}, head...)
		}
		row(w, head...)
		for _, s := range out {
			cells := []string{s.Name, stateCell(s), orDash(s.SuccessRate), strconv.FormatInt(s.Pending, 10), orDash(s.Circuit),
				strconv.FormatInt(s.DeadLettered, 10), agop(s.LastSuccessTime, now), lastError(s.LastFailure, now)}
			if so.allNamespaces {
				cells = append([]string{s.Namespace}, cells...)
			}
			row(w, cells...)
		}
		if len(out) == 1 {
			so.details(w, out[0], now)
			return
		}
		listProblems(w, out, so.allNamespaces, now)
	})
}

// maxListedMessage bounds a condition's message in the list of several endpoints' problems
// (one endpoint's status, and -o json, show it whole).
const maxListedMessage = 160

// listProblems lists the conditions of several endpoints that are not in their good state,
// below their table.
func listProblems(w io.Writer, out []EndpointStatus, allNamespaces bool, now time.Time) {
	n := 0
	for _, s := range out {
		n += len(s.Problems)
	}
	if n == 0 {
		return
	}
	writeLine(w, "")
	writeLine(w, "Conditions not in their good state:")
	row(w, "ENDPOINT", "CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE")
	for _, s := range out {
		name := s.Name
		if allNamespaces {
			name = s.Namespace + "/" + s.Name
		}
		for _, p := range s.Problems {
			row(w, name, p.Type, string(p.Status), orDash(p.Reason), agop(p.Since, now), orDash(short(p.Message, maxListedMessage)))
		}
	}
}

// details explains one endpoint's state below the table.
func (so *statusOptions) details(w io.Writer, s EndpointStatus, now time.Time) {
	writeLine(w, "")
	switch s.State {
	case StateDisabled:
		since := "-"
		if s.DisabledSince != nil {
			since = fmt.Sprintf("%s (%s)", ts(*s.DisabledSince), ago(*s.DisabledSince, now))
		}
		writeLine(w, "Disabled since %s: %s %s", since, s.Reason, s.Message)
		writeLine(w, "New events are dead-lettered (reason endpoint_disabled). Fix the receiver, then run `kubectl webhooks enable %s` and replay with `kubectl webhooks replay %s --all`.", s.Name, s.Name)
	case StateNotReady, StateSuspended:
		writeLine(w, "%s: %s: %s", s.State, s.Reason, s.Message)
	}
	if f := s.LastFailure; f != nil {
		writeLine(w, "Last error at %s: %s", ts(f.Time.Time), failureText(f))
	}
	if len(s.Problems) > 0 {
		writeLine(w, "Conditions not in their good state:")
		for _, p := range s.Problems {
			writeLine(w, "  %s=%s %s (since %s): %s", p.Type, string(p.Status), orDash(p.Reason), agop(p.Since, now), orDash(p.Message))
		}
	}
	if s.HealthUpdatedAt != nil {
		writeLine(w, "Health reported %s by the dispatcher.", ago(*s.HealthUpdatedAt, now))
	}
}

func stateCell(s EndpointStatus) string {
	if s.State == StateActive || s.Reason == "" {
		return s.State
	}
	return s.State + " (" + s.Reason + ")"
}

func agop(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	return ago(*t, now)
}

func lastError(f *v1alpha1.AttemptFailure, now time.Time) string {
	if f == nil {
		return "-"
	}
	return short(failureText(f), 60) + ", " + ago(f.Time.Time, now)
}

func failureText(f *v1alpha1.AttemptFailure) string {
	s := f.Reason
	if f.StatusCode != 0 {
		s = fmt.Sprintf("%d %s", f.StatusCode, f.Reason)
	}
	if f.Message != "" {
		s += ": " + f.Message
	}
	return s
}
