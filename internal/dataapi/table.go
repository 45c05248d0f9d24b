package dataapi

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
)

var deliveryColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "The delivery id."},
	{Name: "Endpoint", Type: "string", Description: "The WebhookEndpoint it is for."},
	{Name: "State", Type: "string", Description: "Queued, InFlight, RetryScheduled, Succeeded or DeadLettered (with why, when held or given up)."},
	{Name: "Attempts", Type: "integer", Description: "Attempts made."},
	{Name: "Event Type", Type: "string", Description: "The event's type."},
	{Name: "Last Response", Type: "string", Description: "What the last attempt got: a status code, or why it failed."},
	{Name: "Next Attempt", Type: "string", Description: "When the next attempt is due."},
	{Name: "Age", Type: "string", Description: "Since the delivery reached its state."},
	{Name: "Event ID", Type: "string", Priority: 1, Description: "The event's id."},
	{Name: "Latency", Type: "string", Priority: 1, Description: "How long the last attempt took."},
}

func (s *deliveryStorage) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	t := &metav1.Table{ColumnDefinitions: deliveryColumns}
	now := s.clock()
	add := func(d *datav1alpha1.WebhookDelivery) {
		state := string(d.Status.State)
		switch {
		case d.Status.HeldReason != "":
			state += " (held: " + d.Status.HeldReason + ")"
		case d.Status.DeadLetterReason != "":
			state += " (" + d.Status.DeadLetterReason + ")"
		}
		next := "-"
		if d.Status.NextAttemptTime != nil {
			next = relative(d.Status.NextAttemptTime.Time, now)
		}
		latency := "-"
		if d.Status.LatencyMicroseconds != nil {
			latency = (time.Duration(*d.Status.LatencyMicroseconds) * time.Microsecond).String()
		}
		t.Rows = append(t.Rows, metav1.TableRow{Object: runtime.RawExtension{Object: d}, Cells: []any{
			d.Name, d.Spec.Endpoint, state, int64(d.Status.Attempts), orDash(d.Spec.EventType), responseCell(d.Status.LastResponse, d.Status.Reason),
			next, age(d.Status.Time.Time, now), orDash(d.Spec.EventID), latency,
		}})
	}
	switch o := obj.(type) {
	case *datav1alpha1.WebhookDelivery:
		add(o)
	case *datav1alpha1.WebhookDeliveryList:
		for i := range o.Items {
			add(&o.Items[i])
		}
	default:
		return nil, fmt.Errorf("cannot print %T as a table of deliveries", obj)
	}
	if l, err := meta.ListAccessor(obj); err == nil {
		t.ResourceVersion, t.Continue, t.RemainingItemCount = l.GetResourceVersion(), l.GetContinue(), l.GetRemainingItemCount()
	}
	return t, nil
}

// responseCell says what an attempt got: its status code (with the failure reason when it is
// not the status code itself), or the reason it failed without a response.
func responseCell(r *datav1alpha1.Response, reason string) string {
	switch {
	case r != nil && r.StatusCode != 0 && reason != "" && reason != "status_code":
		return strconv.Itoa(int(r.StatusCode)) + " " + reason
	case r != nil && r.StatusCode != 0:
		return strconv.Itoa(int(r.StatusCode))
	case reason != "":
		return reason
	}
	return "-"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age is how long ago t was, as kubectl prints ages.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

// relative is when t is from now: "in 5m", or an age for a time past.
func relative(t, now time.Time) string {
	if t.After(now) {
		return "in " + duration.HumanDuration(t.Sub(now))
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}
