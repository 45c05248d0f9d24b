// Package wake says what of a namespace's endpoints its dispatcher acts on, so that a
// dispatcher that sleeps (a shared dispatcher's idle namespace, stopped until something
// arrives) is woken by the changes it would have acted on, and by no others.
//
// The controller writes each pooled namespace's Digest beside its name in the pool ConfigMap;
// the shared dispatcher wakes a sleeping namespace when its digest changes. A dispatcher that
// runs follows its endpoints itself, resyncing on the same changes (Relevant).
package wake

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Fingerprint is what of ep its dispatcher acts on: its spec (generation), deletion, the
// enable annotation, and the parts of the controller's status that its configuration reads:
// secretsVersion (a referenced Secret changed), the lane and its move (status.lane,
// sharedSince, drainingConsumers), and a hold by its quota or its source grants (the Ready
// condition's reason). Status the dispatcher writes itself (its health) is not part of it.
func Fingerprint(ep *v1alpha1.WebhookEndpoint) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(ep.Generation, 10))
	b.WriteByte('|')
	if ep.DeletionTimestamp != nil {
		b.WriteString(ep.DeletionTimestamp.UTC().Format("20060102T150405"))
	}
	b.WriteByte('|')
	b.WriteString(ep.Annotations[v1alpha1.AnnotationEnable])
	b.WriteByte('|')
	b.WriteString(ep.Status.SecretsVersion)
	b.WriteByte('|')
	b.WriteString(ep.Status.Lane)
	b.WriteByte('|')
	if ep.Status.SharedSince != nil {
		b.WriteString(ep.Status.SharedSince.UTC().Format("20060102T150405"))
	}
	b.WriteByte('|')
	b.WriteString(strings.Join(ep.Status.DrainingConsumers, ","))
	b.WriteByte('|')
	b.WriteString(HeldBy(ep))
	return b.String()
}

// Relevant says whether an update of an endpoint changed what its dispatcher acts on.
func Relevant(old, updated *v1alpha1.WebhookEndpoint) bool {
	return Fingerprint(old) != Fingerprint(updated)
}

// HeldBy is the reason of an endpoint's Ready condition when it holds its deliveries back
// (its namespace's quota, its source grants), empty otherwise.
func HeldBy(ep *v1alpha1.WebhookEndpoint) string {
	ready := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
	if ready == nil || (ready.Reason != v1alpha1.ReasonQuotaExceeded && ready.Reason != v1alpha1.ReasonSourceGrantFull) {
		return ""
	}
	return ready.Reason
}

// Digest sums a namespace's endpoints' names and fingerprints, in any order: it changes when
// an endpoint comes, goes or changes what its dispatcher acts on.
func Digest(eps []*v1alpha1.WebhookEndpoint) string {
	lines := make([]string, 0, len(eps))
	for _, ep := range eps {
		lines = append(lines, ep.Name+"\x00"+Fingerprint(ep))
	}
	slices.Sort(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// MaySleep says whether a namespace whose endpoints are eps may sleep: not when one of them
// reads other namespaces' events (a publish there does not wake it) or rides a lane of its own
// (its own consumers, which the idle check does not read).
func MaySleep(eps []*v1alpha1.WebhookEndpoint) bool {
	for _, ep := range eps {
		if len(ep.Spec.SourceNamespaces) > 0 || ep.Status.Lane == "Own" {
			return false
		}
	}
	return true
}
