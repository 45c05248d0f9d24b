package records

import datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"

// APIState is the data API's state (webhookdeliveries' status.state) of a delivery-log
// status; an unknown status is passed through as it is.
func APIState(status string) datav1alpha1.DeliveryState {
	switch status {
	case StatePending:
		return datav1alpha1.StateQueued
	case StateAttempting:
		return datav1alpha1.StateInFlight
	case StateFailed:
		return datav1alpha1.StateRetryScheduled
	case StateSucceeded:
		return datav1alpha1.StateSucceeded
	case StateDeadLetter:
		return datav1alpha1.StateDeadLettered
	}
	return datav1alpha1.DeliveryState(status)
}

// LogStatus is the delivery-log status of a data API state (APIState's reverse).
func LogStatus(state datav1alpha1.DeliveryState) string {
	for _, s := range []string{StatePending, StateAttempting, StateFailed, StateSucceeded, StateDeadLetter} {
		if APIState(s) == state {
			return s
		}
	}
	return string(state)
}
