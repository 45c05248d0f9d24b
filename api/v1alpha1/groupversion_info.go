// Package v1alpha1 holds the webhook-operator.io/v1alpha1 API: WebhookEndpoint and RetryPolicy.
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=true
// +kubebuilder:ac:output:package=../applyconfiguration
// +groupName=webhook-operator.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "webhook-operator.io", Version: "v1alpha1"}

	// SchemeGroupVersion is GroupVersion under the name generated code (the apply
	// configurations in api/applyconfiguration) expects.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
