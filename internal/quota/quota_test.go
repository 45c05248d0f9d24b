package quota

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

func i32(v int32) *int32 { return &v }

// ep is an endpoint created at minute m.
func ep(name string, m int, mods ...func(*v1alpha1.WebhookEndpoint)) v1alpha1.WebhookEndpoint {
	e := v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name,
		CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, m, 0, 0, time.UTC))}}
	for _, f := range mods {
		f(&e)
	}
	return e
}

func inFlight(n int32) func(*v1alpha1.WebhookEndpoint) {
	return func(e *v1alpha1.WebhookEndpoint) { e.Spec.MaxInFlight = i32(n) }
}

func dedicatedWith(replicas *int32, res *corev1.ResourceRequirements) func(*v1alpha1.WebhookEndpoint) {
	return func(e *v1alpha1.WebhookEndpoint) {
		e.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true, Replicas: replicas, Resources: res}
	}
}

func deleting(e *v1alpha1.WebhookEndpoint) {
	now := metav1.Now()
	e.DeletionTimestamp = &now
}

func TestAdmit(t *testing.T) {
	small := &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}}
	big := &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("256Mi")}}
	maxRes := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
	defaults := Defaults{DedicatedReplicas: 1, DedicatedResources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}, MaxEndpoints: 3}
	for name, tc := range map[string]struct {
		spec *v1alpha1.WebhookQuotaSpec
		eps  []v1alpha1.WebhookEndpoint
		// held maps each endpoint held back to its reason.
		held  map[string]string
		usage Usage
	}{
		"no quota admits everything up to the installation's bound": {
			eps:   []v1alpha1.WebhookEndpoint{ep("a", 1), ep("b", 2), ep("c", 3, dedicatedWith(i32(20), big))},
			usage: Usage{Endpoints: 3, Dedicated: 1, InFlight: 150},
		},
		"no quota: the installation's bound, by creation order": {
			eps:  []v1alpha1.WebhookEndpoint{ep("d", 4), ep("a", 1), ep("c", 3), ep("b", 2)},
			held: map[string]string{"d": v1alpha1.ReasonEndpointLimit}, usage: Usage{Endpoints: 3, InFlight: 150},
		},
		"a quota without maxEndpoints: the installation's bound": {
			spec: &v1alpha1.WebhookQuotaSpec{MaxDeliveriesInFlight: i32(1000)},
			eps:  []v1alpha1.WebhookEndpoint{ep("d", 4), ep("a", 1), ep("c", 3), ep("b", 2)},
			held: map[string]string{"d": v1alpha1.ReasonEndpointLimit}, usage: Usage{Endpoints: 3, InFlight: 150},
		},
		"the quota's maxEndpoints, above the installation's bound": {
			spec:  &v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(4)},
			eps:   []v1alpha1.WebhookEndpoint{ep("d", 4), ep("a", 1), ep("c", 3), ep("b", 2)},
			usage: Usage{Endpoints: 4, InFlight: 200},
		},
		"endpoints beyond the count, by creation order": {
			spec:  &v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(2)},
			eps:   []v1alpha1.WebhookEndpoint{ep("c", 3), ep("a", 1), ep("b", 2)},
			held:  map[string]string{"c": v1alpha1.ReasonEndpointLimit},
			usage: Usage{Endpoints: 2, InFlight: 100},
		},
		"the same creation time orders by name": {
			spec: &v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(1)},
			eps:  []v1alpha1.WebhookEndpoint{ep("b", 1), ep("a", 1)},
			held: map[string]string{"b": v1alpha1.ReasonEndpointLimit}, usage: Usage{Endpoints: 1, InFlight: 50},
		},
		"an endpoint being deleted frees its place": {
			spec:  &v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(1)},
			eps:   []v1alpha1.WebhookEndpoint{ep("a", 1, deleting), ep("b", 2)},
			usage: Usage{Endpoints: 1, InFlight: 50},
		},
		"no endpoint at all": {
			spec: &v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(0)},
			eps:  []v1alpha1.WebhookEndpoint{ep("a", 1)},
			held: map[string]string{"a": v1alpha1.ReasonEndpointLimit},
		},
		"in flight: what does not fit is held, a smaller later one fits": {
			spec:  &v1alpha1.WebhookQuotaSpec{MaxDeliveriesInFlight: i32(100)},
			eps:   []v1alpha1.WebhookEndpoint{ep("a", 1, inFlight(60)), ep("b", 2, inFlight(50)), ep("c", 3, inFlight(40))},
			held:  map[string]string{"b": v1alpha1.ReasonInFlightLimit},
			usage: Usage{Endpoints: 2, InFlight: 100},
		},
		"a held endpoint takes no place in the count": {
			spec:  &v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(2), MaxDeliveriesInFlight: i32(60)},
			eps:   []v1alpha1.WebhookEndpoint{ep("a", 1), ep("b", 2, inFlight(20)), ep("c", 3, inFlight(5)), ep("d", 4, inFlight(1))},
			held:  map[string]string{"b": v1alpha1.ReasonInFlightLimit, "d": v1alpha1.ReasonEndpointLimit},
			usage: Usage{Endpoints: 2, InFlight: 55},
		},
		"dedicated dispatchers: count": {
			spec: &v1alpha1.WebhookQuotaSpec{DedicatedDispatchers: &v1alpha1.DedicatedDispatcherQuota{Max: i32(1)}},
			eps: []v1alpha1.WebhookEndpoint{ep("a", 1, dedicatedWith(nil, nil)), ep("b", 2, dedicatedWith(nil, nil)),
				ep("c", 3)},
			held:  map[string]string{"b": v1alpha1.ReasonDedicatedDispatcherLimit},
			usage: Usage{Endpoints: 2, Dedicated: 1, InFlight: 100},
		},
		"dedicated dispatchers: none allowed": {
			spec: &v1alpha1.WebhookQuotaSpec{DedicatedDispatchers: &v1alpha1.DedicatedDispatcherQuota{Max: i32(0)}},
			eps:  []v1alpha1.WebhookEndpoint{ep("a", 1, dedicatedWith(nil, nil))},
			held: map[string]string{"a": v1alpha1.ReasonDedicatedDispatcherLimit},
		},
		"dedicated dispatchers: replicas": {
			spec:  &v1alpha1.WebhookQuotaSpec{DedicatedDispatchers: &v1alpha1.DedicatedDispatcherQuota{MaxReplicas: i32(2)}},
			eps:   []v1alpha1.WebhookEndpoint{ep("a", 1, dedicatedWith(i32(3), nil)), ep("b", 2, dedicatedWith(i32(2), nil))},
			held:  map[string]string{"a": v1alpha1.ReasonDedicatedDispatcherLimit},
			usage: Usage{Endpoints: 1, Dedicated: 1, InFlight: 50},
		},
		"dedicated dispatchers: resources, the installation's default included": {
			spec: &v1alpha1.WebhookQuotaSpec{DedicatedDispatchers: &v1alpha1.DedicatedDispatcherQuota{MaxResources: maxRes}},
			eps: []v1alpha1.WebhookEndpoint{ep("a", 1, dedicatedWith(nil, small)), ep("b", 2, dedicatedWith(nil, big)),
				ep("c", 3, dedicatedWith(nil, nil))},
			// c takes the default, which has no CPU limit: unbounded is more than 1 CPU.
			held:  map[string]string{"b": v1alpha1.ReasonDedicatedDispatcherResources, "c": v1alpha1.ReasonDedicatedDispatcherResources},
			usage: Usage{Endpoints: 1, Dedicated: 1, InFlight: 50},
		},
	} {
		t.Run(name, func(t *testing.T) {
			res := Admit(tc.spec, tc.eps, defaults)
			for _, e := range tc.eps {
				v, ok := res.Verdicts[e.Name]
				if !e.DeletionTimestamp.IsZero() {
					if ok {
						t.Errorf("%s is being deleted and has a verdict", e.Name)
					}
					continue
				}
				want := tc.held[e.Name]
				switch {
				case want == "" && !v.Admitted:
					t.Errorf("%s held back: %s: %s", e.Name, v.Reason, v.Message)
				case want != "" && (v.Admitted || v.Reason != want):
					t.Errorf("%s: admitted %v, reason %q, want held back for %s", e.Name, v.Admitted, v.Reason, want)
				case want != "" && (v.Message == "" || !strings.Contains(v.Message, "spec.") && !strings.Contains(v.Message, MaxEndpointsFlag)):
					t.Errorf("%s: the message %q does not name the field", e.Name, v.Message)
				}
			}
			if res.Usage != tc.usage {
				t.Errorf("usage %+v, want %+v", res.Usage, tc.usage)
			}
			if len(res.HeldBack) != len(tc.held) {
				t.Errorf("held back %v, want %v", res.HeldBack, tc.held)
			}
		})
	}
}

func TestRetention(t *testing.T) {
	d := func(s string) *metav1.Duration { v, _ := time.ParseDuration(s); return &metav1.Duration{Duration: v} }
	ns := &v1alpha1.WebhookQuotaSpec{Retention: &v1alpha1.PayloadRetention{DeliveryLog: d("24h"), DeadLetters: d("720h")}}
	for name, tc := range map[string]struct {
		q        *v1alpha1.WebhookQuotaSpec
		ep       *v1alpha1.PayloadRetention
		log, dlq time.Duration
	}{
		"nothing set keeps payloads":          {},
		"the endpoint's own":                  {ep: &v1alpha1.PayloadRetention{DeliveryLog: d("1h")}, log: time.Hour},
		"the namespace's by default":          {q: ns, log: 24 * time.Hour, dlq: 720 * time.Hour},
		"shorter than the namespace's":        {q: ns, ep: &v1alpha1.PayloadRetention{DeadLetters: d("1h")}, log: 24 * time.Hour, dlq: time.Hour},
		"never longer than the namespace's":   {q: ns, ep: &v1alpha1.PayloadRetention{DeliveryLog: d("100h")}, log: 24 * time.Hour, dlq: 720 * time.Hour},
		"a quota without retention is no cap": {q: &v1alpha1.WebhookQuotaSpec{}, ep: &v1alpha1.PayloadRetention{DeadLetters: d("2h")}, dlq: 2 * time.Hour},
	} {
		log, dlq := Retention(tc.q, tc.ep)
		if log != tc.log || dlq != tc.dlq {
			t.Errorf("%s: log %s, dead letters %s; want %s, %s", name, log, dlq, tc.log, tc.dlq)
		}
	}
}

func TestBoundsAndRate(t *testing.T) {
	q := resource.MustParse("64Ki")
	spec := &v1alpha1.WebhookQuotaSpec{EventsPerSecond: i32(5), Storage: &v1alpha1.StorageQuota{DeadLetters: &q}}
	if b := Bounds(spec); b.DeadLetters != 64<<10 || b.Events != 0 || b.Attempts != 0 || b.Deliveries != 0 {
		t.Errorf("bounds %+v", b)
	}
	if r, burst, ok := PublishRate(spec); !ok || r != 5 || burst != 5 || !RestrictsDirectPublish(spec) {
		t.Errorf("rate %v %d %v", r, burst, ok)
	}
	if RestrictsDirectPublish(&v1alpha1.WebhookQuotaSpec{}) || RestrictsDirectPublish(nil) {
		t.Error("a quota without a rate restricts publishing")
	}
	tiny := resource.MustParse("10")
	if ValidateStorage(&v1alpha1.WebhookQuotaSpec{Storage: &v1alpha1.StorageQuota{Events: &tiny}}) == "" || ValidateStorage(spec) != "" {
		t.Error("ValidateStorage")
	}
}

// The ingress's table: each replica's share of a namespace's rate, gone with the quota.
func TestRateTable(t *testing.T) {
	tab := &RateTable{Replicas: 2}
	q := &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{EventsPerSecond: i32(10), EventsBurst: i32(3)}}
	tab.Observe(q)
	if r, b, ok := tab.Lookup("a"); !ok || r != 5 || b != 1 {
		t.Errorf("a: %v %d %v, want 5/s burst 1 on each of 2 replicas", r, b, ok)
	}
	if _, _, ok := tab.Lookup("b"); ok {
		t.Error("b has a rate without a quota")
	}
	q.Spec.EventsPerSecond = nil
	tab.Observe(q)
	if _, _, ok := tab.Lookup("a"); ok {
		t.Error("a quota without a rate still limits")
	}
	q.Spec.EventsPerSecond = i32(4)
	tab.Handler().OnAdd(q, false)
	tab.Handler().OnDelete(q)
	if _, _, ok := tab.Lookup("a"); ok {
		t.Error("a deleted quota still limits")
	}
}
