package controllers

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

func TestSizing(t *testing.T) {
	q := resource.MustParse
	o := &Options{
		DispatcherReplicas: 2,
		DispatcherResources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("100m")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("256Mi")}},
		DispatcherCaps: DispatcherCaps{MaxReplicas: 4, MaxResources: corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("1Gi")}},
	}
	replicas := func(n int32) *int32 { return &n }
	for _, tc := range []struct {
		name     string
		spec     *v1alpha1.DispatcherSpec
		replicas int32
		res      corev1.ResourceRequirements
		capped   []string // substrings, in order
	}{
		{"shared: the installation's", nil, 2, o.DispatcherResources, nil},
		{"dedicated without a size: the installation's", &v1alpha1.DispatcherSpec{Dedicated: true}, 2, o.DispatcherResources, nil},
		{"within the caps, missing limits are the installation's",
			&v1alpha1.DispatcherSpec{Dedicated: true, Replicas: replicas(4), Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: q("128Mi")}}},
			4, corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: q("128Mi")},
				Limits: corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("256Mi")}}, nil},
		{"above the caps",
			&v1alpha1.DispatcherSpec{Dedicated: true, Replicas: replicas(20), Resources: &corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceCPU: q("8"), corev1.ResourceMemory: q("4Gi")}}},
			4, corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("1Gi")}},
			[]string{"replicas 20 is above the installation's cap of 4", "limits.cpu 8 is above the installation's cap of 2", "limits.memory 4Gi is above the installation's cap of 1Gi"}},
		{"a request above its limit, other resources",
			&v1alpha1.DispatcherSpec{Dedicated: true, Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q("1500m"), "ephemeral-storage": q("1Gi")}}},
			2, corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("1")},
				Limits: corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("256Mi")}},
			[]string{"requests.ephemeral-storage is left out", "requests.cpu 1500m is above its limit 1: it runs with 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := &v1alpha1.WebhookEndpoint{Spec: v1alpha1.WebhookEndpointSpec{Dispatcher: tc.spec}}
			r, res, capped := o.sizing(ep)
			if r != tc.replicas {
				t.Errorf("replicas %d, want %d", r, tc.replicas)
			}
			if !reflect.DeepEqual(res, tc.res) {
				t.Errorf("resources %v, want %v", res, tc.res)
			}
			if len(capped) != len(tc.capped) {
				t.Fatalf("capped %q, want %d notes", capped, len(tc.capped))
			}
			for i, want := range tc.capped {
				if !strings.Contains(capped[i], want) {
					t.Errorf("note %d %q, want %q", i, capped[i], want)
				}
			}
		})
	}
}
