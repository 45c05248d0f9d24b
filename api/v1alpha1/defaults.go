package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of a WebhookEndpoint's spec. The schema is where they are set (the
// +kubebuilder:default markers): the API server applies them to every endpoint it stores or
// returns, so the controller and the dispatcher read them from the object. These constants
// and Default are the same values for an object that never passed through an API server (a
// test's, a tool's); TestGoDefaultsAreTheSchemas checks they agree.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultMaxInFlight  = int32(50)
	DefaultOrderingMode = OrderingBestEffort
)

// Default sets the schema's defaults on the fields of s left empty, as the API server does.
func (s *WebhookEndpointSpec) Default() {
	if s.Timeout == nil {
		s.Timeout = &metav1.Duration{Duration: DefaultTimeout}
	}
	if s.MaxInFlight == nil {
		m := DefaultMaxInFlight
		s.MaxInFlight = &m
	}
	if s.Ordering == nil {
		s.Ordering = &OrderingSpec{}
	}
	if s.Ordering.Mode == "" {
		s.Ordering.Mode = DefaultOrderingMode
	}
}
