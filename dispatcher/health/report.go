package health

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Reporter carries out what a change of an endpoint's state means: the circuit and disabled
// metrics, the worker's wake-up, a status write (at once for a transition) and, for each
// transition, a Kubernetes Event and a log line. Store calls it after every change.
type Reporter struct {
	Endpoints Endpoints
	Status    *StatusWriter
	Recorder  record.EventRecorder
	// Reader reads the endpoint an Event is about (the informer cache).
	Reader    client.Reader
	Namespace string
	// Announcer publishes the operational events a change queued (nil: none are).
	Announcer *Announcer
	Log       logr.Logger
}

// Report is called after this replica changed ep's state to st, with the transitions the
// change caused.
func (r *Reporter) Report(ep string, trs []Transition, st State) {
	if sv, ok := r.Endpoints.Served(ep); ok {
		sv.Wake()
		circuit := 0.0
		switch st.CircuitState() {
		case v1alpha1.CircuitOpen:
			circuit = 2
		case v1alpha1.CircuitHalfOpen:
			circuit = 1
		}
		sv.Metrics.State(circuit, st.Disabled())
	}
	r.Status.Mark(ep, len(trs) > 0)
	if len(st.Outbox) > 0 && r.Announcer != nil {
		r.Announcer.Kick(ep)
	}
	if len(trs) == 0 {
		return
	}
	var obj v1alpha1.WebhookEndpoint
	if err := r.Reader.Get(context.Background(), types.NamespacedName{Namespace: r.Namespace, Name: ep}, &obj); err != nil {
		return
	}
	for _, t := range trs {
		kind := corev1.EventTypeNormal
		if t.Type == "Disabled" || t.Type == "CircuitOpened" {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Event(&obj, kind, t.Type, t.Message)
		r.Log.Info(t.Message, "endpoint", ep, "transition", t.Type)
	}
}

// Remote is called when another replica changed ep's state; transition says its circuit or
// disabled state changed, which the holder of its partition writes at once (other changes, its
// counts, within the status interval).
func (r *Reporter) Remote(ep string, transition bool) {
	r.Status.Mark(ep, transition)
	if sv, ok := r.Endpoints.Served(ep); ok {
		sv.Wake()
	}
}
