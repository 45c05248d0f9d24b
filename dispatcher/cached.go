package dispatcher

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// keepReadStatus is the informer cache's transform of WebhookEndpoints in a dispatcher, which
// holds one per endpoint of its namespace, idle ones included: what every object carries and
// no reconciler reads goes (scheme.StripApplied), and of the status only what the dispatcher
// reads stays:
//   - the lane (lane, sharedSince, drainingConsumers) and secretsVersion, which its
//     configuration is resolved from (relevantUpdate);
//   - the Ready condition's status and reason (a hold by the quota or the source grants);
//   - what the dispatcher itself writes (health, the Disabled and CircuitOpen conditions), which
//     its status writer compares before writing, so that a restart writes nothing unchanged.
//
// The rest of the controller's status (the dispatcher's name and replicas, the Secret, policy,
// subject and consumer names, the other conditions and the Ready condition's message) is
// dropped. The dispatcher writes its status by server-side apply of its own fields, never from
// a cached object, so nothing dropped here is ever written back.
func keepReadStatus(in any) (any, error) {
	in, err := scheme.StripApplied(in)
	if err != nil {
		return in, err
	}
	ep, ok := in.(*v1alpha1.WebhookEndpoint)
	if !ok {
		return in, nil
	}
	st := &ep.Status
	st.ObservedGeneration = 0
	st.Dispatcher = nil
	st.SigningSecretName, st.RetryPolicyName, st.DeliverySubject, st.ConsumerName = "", "", "", ""
	n := 0
	for _, c := range st.Conditions {
		if readCondition(c.Type) {
			n++
		}
	}
	var kept []metav1.Condition // a new array, of the size kept: the old one, with what is dropped, goes
	if n > 0 {
		kept = make([]metav1.Condition, 0, n)
	}
	for _, c := range st.Conditions {
		switch {
		case c.Type == v1alpha1.ConditionReady:
			kept = append(kept, metav1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason})
		case readCondition(c.Type):
			kept = append(kept, c)
		}
	}
	st.Conditions = kept
	return ep, nil
}

// readCondition says whether the dispatcher reads a condition of this type.
func readCondition(t string) bool {
	return t == v1alpha1.ConditionReady || t == v1alpha1.ConditionDisabled || t == v1alpha1.ConditionCircuitOpen
}
