package conditions_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/webhook-operator/webhook-operator/internal/conditions"
)

func TestSet(t *testing.T) {
	earlier := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	now := time.Date(2026, 1, 2, 4, 0, 0, 999_000_000, time.UTC)
	at := metav1.NewTime(now.Truncate(time.Second))
	current := []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", ObservedGeneration: 1, LastTransitionTime: earlier},
		{Type: "Stalled", Status: metav1.ConditionTrue, Reason: "InvalidSpec", ObservedGeneration: 1, LastTransitionTime: earlier},
		{Type: "Disabled", Status: metav1.ConditionFalse, Reason: "Enabled", ObservedGeneration: 1, LastTransitionTime: earlier},
	}
	cond := func(typ string, st metav1.ConditionStatus, reason string, ltt metav1.Time) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: "m", ObservedGeneration: 2, LastTransitionTime: ltt}
	}
	for _, tc := range []struct {
		name   string
		wanted []*metav1.Condition
		want   []metav1.Condition
	}{{
		name:   "same status keeps its transition time, even with another reason",
		wanted: []*metav1.Condition{conditions.True("Ready", "Ready", "m"), conditions.True("Stalled", "InvalidURL", "m")},
		want:   []metav1.Condition{cond("Ready", metav1.ConditionTrue, "Ready", earlier), cond("Stalled", metav1.ConditionTrue, "InvalidURL", earlier)},
	}, {
		name:   "a changed status transitions now, to the second",
		wanted: []*metav1.Condition{conditions.False("Ready", "DispatcherUnavailable", "m")},
		want:   []metav1.Condition{cond("Ready", metav1.ConditionFalse, "DispatcherUnavailable", at)},
	}, {
		name:   "a new type transitions now; nil entries are left out",
		wanted: []*metav1.Condition{nil, conditions.True("Reconciling", "DispatcherUnavailable", "m"), nil},
		want:   []metav1.Condition{cond("Reconciling", metav1.ConditionTrue, "DispatcherUnavailable", at)},
	}, {
		name:   "the order is the order wanted",
		wanted: []*metav1.Condition{conditions.False("Disabled", "Enabled", "m"), conditions.True("Ready", "Ready", "m")},
		want:   []metav1.Condition{cond("Disabled", metav1.ConditionFalse, "Enabled", earlier), cond("Ready", metav1.ConditionTrue, "Ready", earlier)},
	}, {
		name: "nothing wanted",
		want: []metav1.Condition{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			before := append([]metav1.Condition(nil), current...)
			got := conditions.Set(current, 2, now, tc.wanted...)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Set:\n got %+v\nwant %+v", got, tc.want)
			}
			if !reflect.DeepEqual(current, before) {
				t.Errorf("Set changed the current conditions: %+v", current)
			}
		})
	}
}

func TestApplyCarriesEveryField(t *testing.T) {
	conds := []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionFalse, Reason: "InvalidURL", Message: "spec.url is refused", ObservedGeneration: 7,
			LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
		{Type: "Stalled", Status: metav1.ConditionTrue, Reason: "InvalidURL", Message: "spec.url is refused", ObservedGeneration: 7,
			LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC))},
	}
	want, err := json.Marshal(conds)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(conditions.Apply(conds))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("Apply:\n got %s\nwant %s", got, want)
	}
}

func TestChanged(t *testing.T) {
	ready := conditions.True("Ready", "Ready", "a")
	for _, tc := range []struct {
		name          string
		before, after *metav1.Condition
		want          bool
	}{
		{"first", nil, ready, true},
		{"only the message", ready, conditions.True("Ready", "Ready", "b"), false},
		{"reason", ready, conditions.True("Ready", "Other", "a"), true},
		{"status", ready, conditions.False("Ready", "Ready", "a"), true},
		{"neither", nil, nil, false},
	} {
		if got := conditions.Changed(tc.before, tc.after); got != tc.want {
			t.Errorf("%s: Changed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestWritten(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cur := conditions.Set(nil, 3, now, conditions.False("Disabled", "Enabled", "deliveries are attempted"))
	if !conditions.Written(cur, conditions.Set(cur, 3, now.Add(time.Hour), conditions.False("Disabled", "Enabled", "deliveries are attempted"))) {
		t.Error("the same condition an hour later is not written")
	}
	for name, c := range map[string][]metav1.Condition{
		"another message":    conditions.Set(cur, 3, now, conditions.False("Disabled", "Enabled", "other")),
		"another generation": conditions.Set(cur, 4, now, conditions.False("Disabled", "Enabled", "deliveries are attempted")),
		"another status":     conditions.Set(cur, 3, now, conditions.True("Disabled", "ConsecutiveFailures", "x")),
		"a new type":         conditions.Set(cur, 3, now, conditions.True("CircuitOpen", "Open", "x")),
	} {
		if conditions.Written(cur, c) {
			t.Errorf("%s: written", name)
		}
	}
}
