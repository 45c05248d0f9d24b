// Package quota decides what a namespace's WebhookQuota allows: which of its endpoints are
// admitted (Admit, the one rule the controller's reconcilers and the quota's status share),
// the publish rate the ingress enforces (PublishRate), the storage bounds of its streams
// (Bounds) and how long payloads are kept (Retention).
//
// Admission counts like a Kubernetes ResourceQuota: endpoints in the order they were created
// (then by name), each admitted while it fits beside those admitted before it, so an endpoint
// never loses its place to a newer one. What an endpoint takes is one endpoint, its
// maxInFlight of the namespace's deliveries in flight and, when dedicated, one dedicated
// dispatcher with its replicas and resources. An endpoint that does not fit is held back
// with the limit's reason and a message saying what would fit.
package quota

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Verdict is what the quota says of one endpoint.
type Verdict struct {
	// Admitted is false when a limit holds the endpoint back.
	Admitted bool
	// Reason names the limit (v1alpha1.ReasonEndpointLimit, ...); empty when admitted.
	Reason string
	// Message says what the limit is and what would fit.
	Message string
}

// Usage is what the admitted endpoints take.
type Usage struct {
	Endpoints, Dedicated, InFlight int64
}

// Result is the quota's decision on a namespace's endpoints.
type Result struct {
	// Verdicts by endpoint name, for every endpoint not being deleted.
	Verdicts map[string]Verdict
	// Usage of the admitted endpoints.
	Usage Usage
	// HeldBack are the endpoints not admitted, in admission order.
	HeldBack []string
}

// Defaults are the installation's values an endpoint takes when its spec sets none.
type Defaults struct {
	// DedicatedReplicas of a dedicated dispatcher without spec.dispatcher.replicas.
	DedicatedReplicas int32
	// DedicatedResources of a dedicated dispatcher without spec.dispatcher.resources.
	DedicatedResources corev1.ResourceRequirements
	// MaxEndpoints bounds a namespace's endpoints when its WebhookQuota sets no
	// spec.maxEndpoints, or it has none (--max-endpoints-per-namespace); 0 leaves them
	// unbounded.
	MaxEndpoints int32
}

// MaxEndpointsFlag is the installation's bound of endpoints per namespace, as messages name it.
const MaxEndpointsFlag = "--max-endpoints-per-namespace"

// Admit decides, for the endpoints of one namespace, which ones spec admits (spec is nil when
// the namespace has no WebhookQuota: only the installation's bound on endpoints, d.MaxEndpoints,
// holds then). Endpoints being deleted are neither counted nor given a verdict.
func Admit(spec *v1alpha1.WebhookQuotaSpec, endpoints []v1alpha1.WebhookEndpoint, d Defaults) Result {
	eps := make([]*v1alpha1.WebhookEndpoint, 0, len(endpoints))
	for i := range endpoints {
		if endpoints[i].DeletionTimestamp.IsZero() {
			eps = append(eps, &endpoints[i])
		}
	}
	slices.SortFunc(eps, func(a, b *v1alpha1.WebhookEndpoint) int {
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	res := Result{Verdicts: make(map[string]Verdict, len(eps))}
	for _, ep := range eps {
		v := admitOne(spec, ep, res.Usage, d)
		res.Verdicts[ep.Name] = v
		if !v.Admitted {
			res.HeldBack = append(res.HeldBack, ep.Name)
			continue
		}
		res.Usage.Endpoints++
		res.Usage.InFlight += int64(MaxInFlight(ep))
		if dedicated(ep) {
			res.Usage.Dedicated++
		}
	}
	return res
}

// admitOne decides whether ep fits beside what used already takes.
func admitOne(spec *v1alpha1.WebhookQuotaSpec, ep *v1alpha1.WebhookEndpoint, used Usage, d Defaults) Verdict {
	switch {
	case spec != nil && spec.MaxEndpoints != nil:
		if m := *spec.MaxEndpoints; used.Endpoints >= int64(m) {
			return held(v1alpha1.ReasonEndpointLimit,
				"the namespace's WebhookQuota allows %d endpoints (spec.maxEndpoints) and the %d created before this one take them: delete one, or ask the platform team for more", m, used.Endpoints)
		}
	case d.MaxEndpoints > 0 && used.Endpoints >= int64(d.MaxEndpoints):
		return held(v1alpha1.ReasonEndpointLimit,
			"the installation allows %d endpoints per namespace (%s) and the %d created before this one take them: delete one, or ask the platform team for a WebhookQuota with a higher spec.maxEndpoints", d.MaxEndpoints, MaxEndpointsFlag, used.Endpoints)
	}
	if spec == nil {
		return Verdict{Admitted: true}
	}
	if dedicated(ep) {
		if v, ok := admitDedicated(spec.DedicatedDispatchers, ep, used, d); !ok {
			return v
		}
	}
	if m := spec.MaxDeliveriesInFlight; m != nil {
		mif := int64(MaxInFlight(ep))
		if used.InFlight+mif > int64(*m) {
			left := max(int64(*m)-used.InFlight, 0)
			advice := fmt.Sprintf("lower spec.maxInFlight to %d or less", left)
			if left == 0 {
				advice = "the endpoints created before this one take them all"
			}
			return held(v1alpha1.ReasonInFlightLimit,
				"spec.maxInFlight %d does not fit: the namespace's WebhookQuota allows %d deliveries in flight (spec.maxDeliveriesInFlight) and the endpoints created before this one take %d; %s, or ask the platform team for more",
				mif, *m, used.InFlight, advice)
		}
	}
	return Verdict{Admitted: true}
}

func admitDedicated(q *v1alpha1.DedicatedDispatcherQuota, ep *v1alpha1.WebhookEndpoint, used Usage, d Defaults) (Verdict, bool) {
	if q == nil {
		return Verdict{}, true
	}
	if q.Max != nil && used.Dedicated >= int64(*q.Max) {
		if *q.Max == 0 {
			return held(v1alpha1.ReasonDedicatedDispatcherLimit,
				"the namespace's WebhookQuota allows no dedicated dispatcher (spec.dedicatedDispatchers.max 0): remove spec.dispatcher.dedicated to use the namespace's shared dispatcher"), false
		}
		return held(v1alpha1.ReasonDedicatedDispatcherLimit,
			"the namespace's WebhookQuota allows %d dedicated dispatchers (spec.dedicatedDispatchers.max) and endpoints created before this one take them: remove spec.dispatcher.dedicated to use the shared dispatcher, or ask the platform team for more", *q.Max), false
	}
	replicas := d.DedicatedReplicas
	if ep.Spec.Dispatcher.Replicas != nil {
		replicas = *ep.Spec.Dispatcher.Replicas
	}
	if q.MaxReplicas != nil && replicas > *q.MaxReplicas {
		return held(v1alpha1.ReasonDedicatedDispatcherLimit,
			"spec.dispatcher.replicas %d is more than the %d the namespace's WebhookQuota allows a dedicated dispatcher (spec.dedicatedDispatchers.maxReplicas)", replicas, *q.MaxReplicas), false
	}
	res := d.DedicatedResources
	from := "the installation's default resources of a dispatcher"
	if ep.Spec.Dispatcher.Resources != nil {
		res, from = *ep.Spec.Dispatcher.Resources, "spec.dispatcher.resources"
	}
	if over := overResources(res, q.MaxResources); over != "" {
		return held(v1alpha1.ReasonDedicatedDispatcherResources,
			"%s ask for %s, more than the namespace's WebhookQuota allows a dedicated dispatcher (spec.dedicatedDispatchers.maxResources): set spec.dispatcher.resources within it", from, over), false
	}
	return Verdict{}, true
}

// overResources names the first request or limit of r above max, or "" when all fit. A
// bounded resource a limit leaves unbounded does not fit: an unbounded container could use
// more than the bound.
func overResources(r corev1.ResourceRequirements, maxRes corev1.ResourceList) string {
	names := make([]corev1.ResourceName, 0, len(maxRes))
	for n := range maxRes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		bound := maxRes[n]
		if q, ok := r.Requests[n]; ok && q.Cmp(bound) > 0 {
			return fmt.Sprintf("a %s request of %s (at most %s)", n, q.String(), bound.String())
		}
		q, ok := r.Limits[n]
		if !ok {
			return fmt.Sprintf("no %s limit (at most %s)", n, bound.String())
		}
		if q.Cmp(bound) > 0 {
			return fmt.Sprintf("a %s limit of %s (at most %s)", n, q.String(), bound.String())
		}
	}
	return ""
}

func held(reason, format string, args ...any) Verdict {
	return Verdict{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

func dedicated(ep *v1alpha1.WebhookEndpoint) bool {
	return ep.Spec.Dispatcher != nil && ep.Spec.Dispatcher.Dedicated
}

// MaxInFlight is an endpoint's spec.maxInFlight, defaulted as the API server does.
func MaxInFlight(ep *v1alpha1.WebhookEndpoint) int32 {
	if ep.Spec.MaxInFlight != nil {
		return *ep.Spec.MaxInFlight
	}
	return v1alpha1.DefaultMaxInFlight
}

// PublishRate is the namespace's publish rate (events per second) and burst; ok is false when
// the quota sets none.
func PublishRate(spec *v1alpha1.WebhookQuotaSpec) (perSecond float64, burst int, ok bool) {
	if spec == nil || spec.EventsPerSecond == nil {
		return 0, 0, false
	}
	perSecond, burst = float64(*spec.EventsPerSecond), int(*spec.EventsPerSecond)
	if spec.EventsBurst != nil {
		burst = int(*spec.EventsBurst)
	}
	return perSecond, max(burst, 1), true
}

// RestrictsDirectPublish reports whether producers of a namespace with this quota may not
// publish to the bus directly: a publish rate is set, which only the ingress can enforce.
func RestrictsDirectPublish(spec *v1alpha1.WebhookQuotaSpec) bool {
	_, _, ok := PublishRate(spec)
	return ok
}

// Bounds are the storage bounds the quota sets on the namespace's streams; zero fields keep
// the installation's.
func Bounds(spec *v1alpha1.WebhookQuotaSpec) streams.Bounds {
	var b streams.Bounds
	if spec == nil || spec.Storage == nil {
		return b
	}
	s := spec.Storage
	for _, f := range []struct {
		q   *resource.Quantity
		out *int64
	}{{s.Events, &b.Events}, {s.Deliveries, &b.Deliveries}, {s.DeliveryLog, &b.Attempts}, {s.DeadLetters, &b.DeadLetters}} {
		if f.q != nil {
			*f.out = f.q.Value()
		}
	}
	return b
}

// ValidateStorage says why the quota's storage bounds cannot be used, or "".
func ValidateStorage(spec *v1alpha1.WebhookQuotaSpec) string {
	if spec == nil || spec.Storage == nil {
		return ""
	}
	s := spec.Storage
	for _, f := range []struct {
		name string
		q    *resource.Quantity
	}{{"events", s.Events}, {"deliveries", s.Deliveries}, {"deliveryLog", s.DeliveryLog}, {"deadLetters", s.DeadLetters}} {
		if f.q != nil && f.q.Value() < MinStreamBytes {
			return fmt.Sprintf("spec.storage.%s is %s: a stream's bound must be at least 1Ki", f.name, f.q.String())
		}
	}
	return ""
}

// MinStreamBytes is the smallest storage bound a quota may set.
const MinStreamBytes = 1024

// Retention is how long an endpoint's delivery-log records and dead letters keep their
// payloads, given its spec and its namespace's quota (nil without one): the endpoint's own
// when set, the namespace's otherwise, never longer than the namespace's. 0 keeps them as
// long as their records.
func Retention(spec *v1alpha1.WebhookQuotaSpec, ep *v1alpha1.PayloadRetention) (deliveryLog, deadLetters time.Duration) {
	var ns *v1alpha1.PayloadRetention
	if spec != nil {
		ns = spec.Retention
	}
	pick := func(own, nsv func(*v1alpha1.PayloadRetention) time.Duration) time.Duration {
		o, n := time.Duration(0), time.Duration(0)
		if ep != nil {
			o = own(ep)
		}
		if ns != nil {
			n = nsv(ns)
		}
		switch {
		case o > 0 && n > 0:
			return min(o, n)
		case o > 0:
			return o
		}
		return n
	}
	logOf := func(r *v1alpha1.PayloadRetention) time.Duration {
		if r.DeliveryLog == nil {
			return 0
		}
		return r.DeliveryLog.Duration
	}
	dlqOf := func(r *v1alpha1.PayloadRetention) time.Duration {
		if r.DeadLetters == nil {
			return 0
		}
		return r.DeadLetters.Duration
	}
	return pick(logOf, logOf), pick(dlqOf, dlqOf)
}
