package report

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
)

// Events records, for each transition of an endpoint's state this replica made, a Kubernetes
// Event on the WebhookEndpoint (a warning when it was disabled or its circuit opened) and a log
// line.
type Events struct {
	Recorder record.EventRecorder
	// Reader reads the endpoint an Event is about (the informer cache).
	Reader    client.Reader
	Namespace string
	Log       logr.Logger
}

// Record records the transitions trs of endpoint ep.
func (e Events) Record(ep string, trs []state.Transition) {
	if len(trs) == 0 {
		return
	}
	var obj v1alpha1.WebhookEndpoint
	if err := e.Reader.Get(context.Background(), types.NamespacedName{Namespace: e.Namespace, Name: ep}, &obj); err != nil {
		return
	}
	for _, t := range trs {
		kind := corev1.EventTypeNormal
		if t.Type == "Disabled" || t.Type == "CircuitOpened" {
			kind = corev1.EventTypeWarning
		}
		e.Recorder.Event(&obj, kind, t.Type, t.Message)
		e.Log.Info(t.Message, "endpoint", ep, "transition", t.Type)
	}
}
