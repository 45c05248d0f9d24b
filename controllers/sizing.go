package controllers

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// DispatcherCaps are the installation's bounds on what an endpoint may ask of its dedicated
// dispatcher (spec.dispatcher.replicas and .resources), which are the tenant's to choose: a
// request above a cap runs at the cap, and the endpoint's DispatcherCapped condition says so.
type DispatcherCaps struct {
	// MaxReplicas bounds the replicas (--dispatcher-max-replicas); 0 leaves them to the
	// schema's bound.
	MaxReplicas int32
	// MaxResources bounds every CPU and memory request and limit (--dispatcher-max-cpu,
	// --dispatcher-max-memory); a resource not listed is not bounded.
	MaxResources corev1.ResourceList
}

// dispatcherResources are the only resources a dedicated dispatcher may ask for.
var dispatcherResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// capFlags name the flag of each cap in what the condition says.
var capFlags = map[corev1.ResourceName]string{corev1.ResourceCPU: "--dispatcher-max-cpu", corev1.ResourceMemory: "--dispatcher-max-memory"}

// sizing is what ep's dispatcher runs with, its replicas and its container's resources, and
// what the installation changed of what ep asked for, in words (nothing for a shared
// dispatcher, whose size is the installation's):
//
//   - replicas above MaxReplicas run at MaxReplicas;
//   - resources other than cpu and memory are left out (a dispatcher needs no other);
//   - a missing cpu or memory limit is the installation's default one (--dispatcher-cpu-limit,
//     --dispatcher-memory-limit), so no dedicated dispatcher runs unbounded;
//   - a request or limit above MaxResources is lowered to it, and a request above its limit
//     (which the API server would refuse) to the limit.
func (o *Options) sizing(ep *v1alpha1.WebhookEndpoint) (replicas int32, res corev1.ResourceRequirements, capped []string) {
	replicas, res = o.DispatcherReplicas, o.DispatcherResources
	if !names.Dedicated(ep) {
		return replicas, res, nil
	}
	spec := ep.Spec.Dispatcher
	if spec.Replicas != nil {
		replicas = *spec.Replicas
	}
	if m := o.DispatcherCaps.MaxReplicas; m > 0 && replicas > m {
		capped = append(capped, fmt.Sprintf("spec.dispatcher.replicas %d is above the installation's cap of %d (--dispatcher-max-replicas): it runs %d", replicas, m, m))
		replicas = m
	}
	if spec.Resources == nil {
		return replicas, res, capped
	}
	req, lim := corev1.ResourceList{}, corev1.ResourceList{}
	for _, l := range []struct {
		field    string
		from, to corev1.ResourceList
	}{{"requests", spec.Resources.Requests, req}, {"limits", spec.Resources.Limits, lim}} {
		for _, name := range sortedNames(l.from) {
			if !slices.Contains(dispatcherResources, name) {
				capped = append(capped, fmt.Sprintf("spec.dispatcher.resources.%s.%s is left out: a dispatcher asks for cpu and memory only", l.field, name))
				continue
			}
			l.to[name] = l.from[name].DeepCopy()
		}
	}
	for _, name := range dispatcherResources {
		if _, ok := lim[name]; !ok {
			if d, ok := o.DispatcherResources.Limits[name]; ok {
				lim[name] = d.DeepCopy()
			}
		}
		for _, l := range []struct {
			field string
			list  corev1.ResourceList
		}{{"requests", req}, {"limits", lim}} {
			q, ok := l.list[name]
			if m, capOK := o.DispatcherCaps.MaxResources[name]; ok && capOK && q.Cmp(m) > 0 {
				capped = append(capped, fmt.Sprintf("spec.dispatcher.resources.%s.%s %s is above the installation's cap of %s (%s): it runs with %s",
					l.field, name, q.String(), m.String(), capFlags[name], m.String()))
				l.list[name] = m.DeepCopy()
			}
		}
		r, hasReq := req[name]
		l, hasLim := lim[name]
		if hasReq && hasLim && r.Cmp(l) > 0 {
			capped = append(capped, fmt.Sprintf("spec.dispatcher.resources.requests.%s %s is above its limit %s: it runs with %s", name, r.String(), l.String(), l.String()))
			req[name] = l.DeepCopy()
		}
	}
	res = corev1.ResourceRequirements{}
	if len(req) > 0 {
		res.Requests = req
	}
	if len(lim) > 0 {
		res.Limits = lim
	}
	return replicas, res, capped
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Check says how the installation's own dispatcher size (what the shared dispatchers run with,
// and a dedicated one that asks for nothing) exceeds the caps; nil when it does not.
func (c DispatcherCaps) Check(replicas int32, res corev1.ResourceRequirements) error {
	var out []string
	if c.MaxReplicas > 0 && replicas > c.MaxReplicas {
		out = append(out, fmt.Sprintf("%d replicas exceed the cap of %d", replicas, c.MaxReplicas))
	}
	for _, l := range []struct {
		field string
		list  corev1.ResourceList
	}{{"request", res.Requests}, {"limit", res.Limits}} {
		for _, name := range dispatcherResources {
			q, ok := l.list[name]
			if m, capOK := c.MaxResources[name]; ok && capOK && q.Cmp(m) > 0 {
				out = append(out, fmt.Sprintf("the %s %s %s exceeds the cap of %s", name, l.field, q.String(), m.String()))
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return fmt.Errorf("the dispatchers' default size exceeds the installation's caps: %s", strings.Join(out, "; "))
}
