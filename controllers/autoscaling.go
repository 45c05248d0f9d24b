package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// The controller's permissions on KEDA's ScaledObjects: it renders one per dispatcher when
// autoscaling is on, and removes those it rendered when it is off.
//
// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects,verbs=get;list;create;update;patch;delete

// ScaledObjectGVK is KEDA's ScaledObject, which the controller renders for each dispatcher
// Deployment when autoscaling is on.
var ScaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

// ReplicasHandoverManager is the field manager that takes over a Deployment's replicas from
// FieldManager when autoscaling starts, so that the controller's next apply, which no longer
// sets them, does not reset them to the default of 1 before the autoscaler sets them.
const ReplicasHandoverManager = "webhook-operator-replicas-handover"

// Autoscaling configures a KEDA ScaledObject for every dispatcher Deployment, with KEDA's
// nats-jetstream scaler: two triggers per endpoint whose deliveries spread across the
// dispatcher's replicas, one on each of the endpoint's consumers in its namespace (on the
// events stream: new events; on the deliveries stream: retries, replays, test and held
// deliveries), each reading that consumer's lag (pending plus unacknowledged deliveries) from
// a NATS server's monitoring endpoint. The HPA KEDA makes scales the Deployment to what the
// busiest consumer needs (lag / LagThreshold replicas), between the dispatcher's configured
// replicas and MaxReplicas (for a dedicated dispatcher, also within its replica cap:
// replicaCap); the controller then no longer sets the Deployment's replicas.
// Every such endpoint of the dispatcher has its triggers: KEDA bounds neither the triggers of
// a ScaledObject nor the metrics of the HPA it makes.
type Autoscaling struct {
	// MonitoringEndpoint is host:port of a NATS server's HTTP monitoring endpoint (KEDA's
	// natsServerMonitoringEndpoint).
	MonitoringEndpoint string
	// MonitoringHTTPS says the monitoring endpoint speaks HTTPS.
	MonitoringHTTPS bool
	// Account is the NATS account of the streams ("$G" when the servers define no accounts).
	Account string
	// MaxReplicas bounds every dispatcher; its minimum is its configured replicas.
	MaxReplicas int32
	// LagThreshold is the lag of one endpoint that one replica is expected to work off.
	LagThreshold int64
	// PollingInterval is how often KEDA reads the lags.
	PollingInterval time.Duration
}

// DefaultAutoscaling returns the defaults (MonitoringEndpoint has none).
func DefaultAutoscaling() Autoscaling {
	return Autoscaling{Account: "$G", MaxReplicas: 10, LagThreshold: 1000, PollingInterval: 15 * time.Second}
}

// Validate checks the settings.
func (a *Autoscaling) Validate() error {
	var errs []error
	if a.MonitoringEndpoint == "" {
		errs = append(errs, errors.New("autoscaling needs the NATS monitoring endpoint (host:port, e.g. nats.nats.svc:8222) KEDA reads the lags from"))
	}
	if a.Account == "" {
		errs = append(errs, errors.New("autoscaling needs the NATS account of the streams ($G without accounts)"))
	}
	if a.MaxReplicas < 1 || a.MaxReplicas > 100 {
		errs = append(errs, fmt.Errorf("the autoscaling maximum must be 1 to 100 replicas, not %d", a.MaxReplicas))
	}
	if a.LagThreshold < 1 {
		errs = append(errs, fmt.Errorf("the autoscaling lag threshold must be positive, not %d", a.LagThreshold))
	}
	if a.PollingInterval < time.Second {
		errs = append(errs, fmt.Errorf("the autoscaling polling interval must be at least 1s, not %s", a.PollingInterval))
	}
	return errors.Join(errs...)
}

// spreadsAcrossReplicas reports whether adding replicas speeds up ep's deliveries: its
// events are pulled by every replica of its dispatcher. A PerKey endpoint (no two replicas may
// hold one key) or a rate-limited one (one token bucket is the limit) is delivered by the one
// replica holding its partition, as the dispatcher's SingleActive says, so replicas added for
// its lag would not work it off (they do take other partitions, which the BestEffort
// endpoints' triggers give them); a suspended endpoint delivers nothing. A deleted endpoint
// (its finalizer waiting) is dead-lettered by every replica, whatever its spec.
func spreadsAcrossReplicas(ep *v1alpha1.WebhookEndpoint) bool {
	if !ep.DeletionTimestamp.IsZero() {
		return true
	}
	perKey := ep.Spec.Ordering != nil && ep.Spec.Ordering.Mode == v1alpha1.OrderingPerKey
	return !perKey && ep.Spec.RateLimit == nil && !ep.Spec.Suspend
}

// scaleTrigger is one endpoint's consumer a dispatcher scales on. Name is the trigger's,
// unique in its ScaledObject (KEDA refuses a name given twice).
type scaleTrigger struct {
	Name, Endpoint, Stream, Consumer string
}

// Prefixes of the trigger names: an endpoint's events-stream trigger is "events-<endpoint>",
// its deliveries-stream trigger "deliveries-<endpoint>". Endpoint names are unique in a
// namespace and the prefixes differ in their first letter, so no two triggers share a name.
const (
	eventsTriggerPrefix     = "events-"
	deliveriesTriggerPrefix = "deliveries-"
	// intakeTrigger and queueTrigger are the shared lane's two triggers (no endpoint's
	// trigger name is a bare word).
	intakeTrigger = "intake"
	queueTrigger  = "queue"
)

// scaleTriggers are the triggers of eps (sorted by name), so that a backlog on the events
// stream (new events) or the deliveries stream (retries, replays, deliveries brought back)
// scales the dispatcher: the namespace's intake and queue consumers, two triggers however many
// endpoints ride the shared lane; and for every endpoint of its own lane whose deliveries
// spread across replicas, its consumer on each stream. Endpoints that do not spread (suspended,
// rate-limited, ordered per key) bring none.
func scaleTriggers(eps []*v1alpha1.WebhookEndpoint, set streams.NamespaceNames) []scaleTrigger {
	var out []scaleTrigger
	shared := false
	for _, ep := range eps {
		if !spreadsAcrossReplicas(ep) {
			continue
		}
		if streams.LaneOf(&ep.Spec) == streams.LaneShared {
			// The shared lane: the namespace's intake and queue consumers, one trigger each
			// however many endpoints ride it.
			if !shared {
				shared = true
				out = append(out,
					scaleTrigger{Name: intakeTrigger, Stream: set.EventsStream(), Consumer: streams.IntakeConsumer(set.Namespace())},
					scaleTrigger{Name: queueTrigger, Stream: set.DeliveriesStream(), Consumer: set.QueueConsumer()})
			}
			continue
		}
		consumer := set.EndpointConsumer(ep.Name)
		out = append(out,
			scaleTrigger{Name: eventsTriggerPrefix + ep.Name, Endpoint: ep.Name, Stream: set.EventsStream(), Consumer: consumer},
			scaleTrigger{Name: deliveriesTriggerPrefix + ep.Name, Endpoint: ep.Name, Stream: set.DeliveriesStream(), Consumer: consumer})
	}
	return out
}

// autoscaled reports whether the dispatcher's replicas are the autoscaler's.
func (d *dispatcher) autoscaled() bool { return d.Autoscaling != nil && len(d.Triggers) > 0 }

// maxReplicas is the autoscaler's upper bound: the installation's, within the dispatcher's
// own cap (ReplicaCap), never below the configured replicas.
func (d *dispatcher) maxReplicas() int32 {
	m := d.Autoscaling.MaxReplicas
	if d.ReplicaCap > 0 {
		m = min(m, d.ReplicaCap)
	}
	return max(m, d.Replicas)
}

// replicaCap is the most replicas a dedicated dispatcher may run, however its lag grows: the
// installation's cap (--dispatcher-max-replicas) and its namespace's WebhookQuota
// (dedicatedDispatchers.maxReplicas), the lower of those set; 0 when neither is.
func (o *Options) replicaCap(q *v1alpha1.WebhookQuota) int32 {
	c := o.DispatcherCaps.MaxReplicas
	if q != nil && q.Spec.DedicatedDispatchers != nil && q.Spec.DedicatedDispatchers.MaxReplicas != nil {
		if m := *q.Spec.DedicatedDispatchers.MaxReplicas; c == 0 || m < c {
			c = m
		}
	}
	return c
}

// scaledObjectApply is the apply configuration of a KEDA ScaledObject (keda.sh/v1alpha1): the
// fields the controller sets.
type scaledObjectApply struct {
	metav1ac.TypeMetaApplyConfiguration    `json:",inline"`
	*metav1ac.ObjectMetaApplyConfiguration `json:"metadata,omitempty"`
	Spec                                   scaledObjectSpec `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef  scaleTargetRef `json:"scaleTargetRef"`
	PollingInterval int32          `json:"pollingInterval"`
	MinReplicaCount int32          `json:"minReplicaCount"`
	MaxReplicaCount int32          `json:"maxReplicaCount"`
	Triggers        []kedaTrigger  `json:"triggers"`
}

type scaleTargetRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
}

type kedaTrigger struct {
	Type string `json:"type"`
	Name string `json:"name"`
	// Metadata values are strings in KEDA's schema, numbers included.
	Metadata map[string]string `json:"metadata"`
}

// IsApplyConfiguration marks scaledObjectApply as an apply configuration.
func (*scaledObjectApply) IsApplyConfiguration() {}

// scaledObject scales the dispatcher's Deployment on its endpoints' consumer lag. It carries
// the labels and owner of the dispatcher's other objects, so it goes with them.
func (d *dispatcher) scaledObject() *scaledObjectApply {
	a := d.Autoscaling
	so := &scaledObjectApply{ObjectMetaApplyConfiguration: d.meta(d.Name)}
	so.WithAPIVersion(ScaledObjectGVK.GroupVersion().String()).WithKind(ScaledObjectGVK.Kind)
	so.Spec = scaledObjectSpec{
		ScaleTargetRef:  scaleTargetRef{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment", Name: d.Name},
		PollingInterval: int32(a.PollingInterval / time.Second),
		MinReplicaCount: d.Replicas,
		MaxReplicaCount: d.maxReplicas(),
	}
	for _, t := range d.Triggers {
		so.Spec.Triggers = append(so.Spec.Triggers, kedaTrigger{
			Type: "nats-jetstream",
			Name: t.Name,
			Metadata: map[string]string{
				"natsServerMonitoringEndpoint": a.MonitoringEndpoint,
				"useHttps":                     strconv.FormatBool(a.MonitoringHTTPS),
				"account":                      a.Account,
				"stream":                       t.Stream,
				"consumer":                     t.Consumer,
				"lagThreshold":                 strconv.FormatInt(a.LagThreshold, 10),
			},
		})
	}
	return so
}

// scaledObjectKey names a dispatcher's ScaledObject.
func scaledObjectKey(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}

// newScaledObject is an empty ScaledObject to read or delete.
func newScaledObject(namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ScaledObjectGVK)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// reconcileScaledObject applies the dispatcher's ScaledObject when it is autoscaled and removes
// it otherwise. It runs after the Deployment is applied (its target exists) when autoscaled,
// and before (so that the autoscaler has stopped when the controller sets replicas again)
// when not.
func (r *DispatcherReconciler) reconcileScaledObject(ctx context.Context, d *dispatcher) error {
	if d.autoscaled() {
		return r.applier.apply(ctx, newScaledObject(d.Namespace, d.Name), d.scaledObject())
	}
	return r.deleteScaledObject(ctx, d.Namespace, d.Name)
}

// deleteScaledObject deletes the dispatcher's ScaledObject if there is one (and if KEDA's CRD
// is installed at all).
func (r *DispatcherReconciler) deleteScaledObject(ctx context.Context, namespace, name string) error {
	r.applier.forget(ScaledObjectGVK.Kind, namespace, name)
	so := newScaledObject(namespace, name)
	err := r.Client.Get(ctx, scaledObjectKey(namespace, name), so)
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ScaledObject %s/%s: %w", namespace, name, err)
	}
	if so.GetLabels()[names.LabelManagedBy] != names.LabelManagedByValue {
		return nil // not ours
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, so))
}

// handOverReplicas makes sure that the controller's apply without replicas, once the
// dispatcher is autoscaled, leaves the Deployment's replicas as they are: while FieldManager
// owns them, ReplicasHandoverManager applies the same value first, so the field keeps an owner
// (until the autoscaler changes it and owns it). It reads the live Deployment once per
// dispatcher and controller start, and again after the controller set replicas itself.
func (r *DispatcherReconciler) handOverReplicas(ctx context.Context, d *dispatcher) error {
	key := objectKey("Deployment", d.Namespace, d.Name)
	r.handoverMu.Lock()
	done := r.handedOver[key]
	r.handoverMu.Unlock()
	if done {
		return nil
	}
	live := &appsv1.Deployment{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: d.Name}, live)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err == nil && live.Spec.Replicas != nil && ownsReplicas(live.ManagedFields, FieldManager) {
		ac := appsv1ac.Deployment(d.Name, d.Namespace).WithSpec(appsv1ac.DeploymentSpec().WithReplicas(*live.Spec.Replicas))
		err := r.Client.Apply(ctx, ac, client.FieldOwner(ReplicasHandoverManager))
		if err != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("handing the replicas of Deployment %s/%s over to the autoscaler: %w", d.Namespace, d.Name, err)
		}
		// A conflict: the replicas changed since the read, so the autoscaler has them already.
		ctrl.LoggerFrom(ctx).Info("replicas handed over to the autoscaler", "deployment", d.Name, "replicas", *live.Spec.Replicas)
	}
	r.handoverMu.Lock()
	if r.handedOver == nil {
		r.handedOver = map[string]bool{}
	}
	r.handedOver[key] = true
	r.handoverMu.Unlock()
	return nil
}

// takeBackReplicas records that the controller sets the dispatcher's replicas again, so the
// next switch to autoscaling hands them over again.
func (r *DispatcherReconciler) takeBackReplicas(namespace, name string) {
	r.handoverMu.Lock()
	delete(r.handedOver, objectKey("Deployment", namespace, name))
	r.handoverMu.Unlock()
}

// ownsReplicas reports whether manager's apply owns spec.replicas.
func ownsReplicas(fields []metav1.ManagedFieldsEntry, manager string) bool {
	for _, f := range fields {
		if f.Manager != manager || f.Operation != metav1.ManagedFieldsOperationApply || f.Subresource != "" || f.FieldsV1 == nil {
			continue
		}
		var set struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if json.Unmarshal(f.FieldsV1.Raw, &set) == nil {
			if _, ok := set.Spec["f:replicas"]; ok {
				return true
			}
		}
	}
	return false
}

// removeScaledObjects deletes every ScaledObject the controller rendered, when autoscaling is
// off: an autoscaler left from an earlier installation would fight the replicas the
// controller sets. Without KEDA's CRD there is nothing to remove.
func removeScaledObjects(c client.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(ScaledObjectGVK.GroupVersion().WithKind(ScaledObjectGVK.Kind + "List"))
		err := c.List(ctx, list, client.MatchingLabels{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue})
		if meta.IsNoMatchError(err) {
			return nil
		}
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing the ScaledObjects of an earlier autoscaling setting")
			return nil
		}
		for i := range list.Items {
			so := &list.Items[i]
			if err := c.Delete(ctx, so); client.IgnoreNotFound(err) != nil {
				ctrl.LoggerFrom(ctx).Error(err, "removing a ScaledObject of an earlier autoscaling setting", "namespace", so.GetNamespace(), "name", so.GetName())
				continue
			}
			ctrl.LoggerFrom(ctx).Info("autoscaling is off: removed the dispatcher's ScaledObject", "namespace", so.GetNamespace(), "name", so.GetName())
		}
		return nil
	}
}

// checkScaledObjectsServed fails when autoscaling is on but the API server does not serve
// KEDA's ScaledObject.
func checkScaledObjectsServed(m meta.RESTMapper) error {
	if _, err := m.RESTMapping(ScaledObjectGVK.GroupKind(), ScaledObjectGVK.Version); err != nil {
		return fmt.Errorf("dispatcher autoscaling renders KEDA ScaledObjects (%s), which this cluster does not serve: install KEDA first, or turn autoscaling off: %w",
			ScaledObjectGVK.GroupVersion(), err)
	}
	return nil
}
