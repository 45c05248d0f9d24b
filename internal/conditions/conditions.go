// Package conditions builds the conditions one status writer owns, ready for a server-side
// apply. The operator has three such writers on its objects, each with its own field manager
// and its own condition types: the controller on a WebhookEndpoint (Ready, Reconciling,
// Stalled) and on a RetryPolicy (Ready, Stalled), and the dispatcher on a WebhookEndpoint
// (Disabled, CircuitOpen). All three compute their conditions with Set and apply them with
// Apply.
package conditions

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
)

// Set returns the conditions a writer owns now, from the ones the object has (current) and the
// ones the writer wants (nil entries are conditions present only while true, absent now):
//
//   - each condition gets observedGeneration generation;
//   - it keeps its current lastTransitionTime while its status stays the same, and gets now
//     (to the second, as the API server stores it) when the status changes or it is new;
//   - the result has the order of wanted, so equal states give equal lists.
//
// A type the writer owned before and leaves out of the apply is removed by the API server,
// which is how a condition present only while true goes away. current may hold other
// writers' conditions: only the types in wanted are read.
func Set(current []metav1.Condition, generation int64, now time.Time, wanted ...*metav1.Condition) []metav1.Condition {
	at := metav1.NewTime(now.UTC().Truncate(time.Second))
	out := make([]metav1.Condition, 0, len(wanted))
	for _, w := range wanted {
		if w == nil {
			continue
		}
		c := *w
		c.ObservedGeneration = generation
		c.LastTransitionTime = at
		if old := meta.FindStatusCondition(current, c.Type); old != nil && old.Status == c.Status && !old.LastTransitionTime.IsZero() {
			c.LastTransitionTime = old.LastTransitionTime
		}
		out = append(out, c)
	}
	return out
}

// Apply turns conditions into apply configurations, every field set.
func Apply(conds []metav1.Condition) []*metav1ac.ConditionApplyConfiguration {
	out := make([]*metav1ac.ConditionApplyConfiguration, len(conds))
	for i, c := range conds {
		out[i] = metav1ac.Condition().
			WithType(c.Type).
			WithStatus(c.Status).
			WithReason(c.Reason).
			WithMessage(c.Message).
			WithObservedGeneration(c.ObservedGeneration).
			WithLastTransitionTime(c.LastTransitionTime)
	}
	return out
}

// True is a condition of type typ with status True.
func True(typ, reason, message string) *metav1.Condition {
	return &metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: message}
}

// False is a condition of type typ with status False.
func False(typ, reason, message string) *metav1.Condition {
	return &metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: reason, Message: message}
}

// Changed reports whether a condition's status or reason differs from before (nil: it had
// none), the change a writer records an Event for.
func Changed(before, after *metav1.Condition) bool {
	if before == nil || after == nil {
		return before != after
	}
	return before.Status != after.Status || before.Reason != after.Reason
}

// Written reports whether current already holds every condition of conds as it is (status,
// reason, message, observed generation, transition time): a writer whose conditions are all
// written has nothing to apply.
func Written(current, conds []metav1.Condition) bool {
	for _, c := range conds {
		old := meta.FindStatusCondition(current, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason || old.Message != c.Message ||
			old.ObservedGeneration != c.ObservedGeneration || !old.LastTransitionTime.Equal(&c.LastTransitionTime) {
			return false
		}
	}
	return true
}
