package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// StreamsFinalizer holds a namespace's streams ConfigMap until its streams and bucket are
// deleted (or, while the namespace and its endpoints live on, released).
const StreamsFinalizer = "webhook-operator.io/streams"

// streamsWaitInterval is how often a deleted ConfigMap looks again whether its namespace's
// endpoints are gone.
const streamsWaitInterval = 2 * time.Second

// StreamSets owns each namespace's set of streams and bucket through the namespace's streams
// ConfigMap. A set is created only together with its ConfigMap (StreamSetCreator), so that
// every set is removed with its namespace: a namespace re-created later with the same name
// never sees the old tenant's events, log or dead letters.
//
// When the ConfigMap is deleted (by the namespace's deletion, or by an administrator):
//   - while endpoints of the namespace are still being deleted (their finalizers move what is
//     pending to the dead-letter stream), it waits;
//   - when the namespace is being deleted, or no endpoint is left, it deletes the streams and
//     the bucket, then lets the ConfigMap go;
//   - while the namespace lives and has live endpoints, it keeps the set and lets the
//     ConfigMap go; the endpoints' reconciles create it again.
type StreamSets struct {
	Client client.Client
	// APIReader reads namespaces (not cached) and a ConfigMap the cache does not show yet.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	NATS      *JetStream
	// MaxConcurrentReconciles is how many namespaces are handled at once (1 when 0).
	MaxConcurrentReconciles int
}

// SetupWithManager registers the reconciler with mgr: the streams ConfigMaps, and the
// deletions of endpoints (the last one a deleted ConfigMap waits for).
func (s *StreamSets) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("streams").
		For(&corev1.ConfigMap{}).
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: names.StreamsConfigMap}}}
		}), builder.WithPredicates(deletions())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(s.MaxConcurrentReconciles, 1)}).
		Complete(s)
}

// StreamSetCreator creates a namespace's streams ConfigMap, then its streams and bucket: the
// endpoint and dispatcher reconcilers use it before they use a namespace's streams. It is not
// a reconciler; StreamSets, which removes the sets, meets the others only through the API
// server (the ConfigMap and the endpoints).
type StreamSetCreator struct {
	Client client.Client
	// APIReader reads a ConfigMap the cache does not show yet.
	APIReader client.Reader
	NATS      *JetStream
}

// ensure makes sure namespace ns has its streams ConfigMap, then its streams and bucket.
func (s *StreamSetCreator) ensure(ctx context.Context, ns string) error {
	if err := streams.ValidateNamespace(ns); err != nil {
		return err
	}
	if err := s.ensureConfigMap(ctx, ns); err != nil {
		return err
	}
	err := s.NATS.Ensure(ctx, ns)
	var conflict *streams.ConflictError
	if errors.As(err, &conflict) {
		ctrl.LoggerFrom(ctx).Info("the streams of a namespace cannot be created: another stream captures their subjects",
			"namespace", ns, "stream", conflict.Stream, "existingStream", conflict.Existing, "subject", conflict.Subject)
	}
	return err
}

func (s *StreamSetCreator) ensureConfigMap(ctx context.Context, ns string) error {
	key := types.NamespacedName{Namespace: ns, Name: names.StreamsConfigMap}
	cm := &corev1.ConfigMap{}
	err := s.Client.Get(ctx, key, cm)
	if apierrors.IsNotFound(err) {
		cm = s.configMap(ns)
		err = s.Client.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			// Created by an earlier reconcile the cache does not show yet.
			err = s.APIReader.Get(ctx, key, cm)
		}
	}
	if err != nil {
		return fmt.Errorf("ConfigMap %s/%s: %w", ns, names.StreamsConfigMap, err)
	}
	if !cm.DeletionTimestamp.IsZero() {
		return fmt.Errorf("%w: the streams of namespace %s are being removed (ConfigMap %s is being deleted)",
			ErrNATSUnavailable, ns, names.StreamsConfigMap)
	}
	if !controllerutil.ContainsFinalizer(cm, StreamsFinalizer) {
		patch := client.MergeFromWithOptions(cm.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(cm, StreamsFinalizer)
		if err := s.Client.Patch(ctx, cm, patch); err != nil {
			return fmt.Errorf("ConfigMap %s/%s: %w", ns, names.StreamsConfigMap, err)
		}
	}
	return nil
}

// configMap is the streams ConfigMap of namespace ns: where its data lives on the bus.
func (s *StreamSetCreator) configMap(ns string) *corev1.ConfigMap {
	set := s.NATS.Config().For(ns)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:  ns,
			Name:       names.StreamsConfigMap,
			Labels:     map[string]string{names.LabelName: names.LabelNameStreams, names.LabelManagedBy: names.LabelManagedByValue},
			Finalizers: []string{StreamsFinalizer},
			Annotations: map[string]string{
				"webhook-operator.io/description": "The JetStream streams and key-value bucket of this namespace's webhooks. " +
					"Deleting this ConfigMap deletes them once the namespace has no WebhookEndpoint left.",
			},
		},
		Data: map[string]string{
			"eventsStream":     set.EventsStream(),
			"eventsSubjects":   set.EventsFilter(),
			"deliveriesStream": set.DeliveriesStream(),
			"attemptsStream":   set.AttemptsStream(),
			"deadLetterStream": set.DeadLetterStream(),
			"bucket":           set.Bucket(),
		},
	}
}

// Reconcile handles one namespace's streams ConfigMap: nothing while it lives, the clean-up
// described on StreamSets once it is deleted.
func (s *StreamSets) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name != names.StreamsConfigMap {
		return ctrl.Result{}, nil
	}
	cm := &corev1.ConfigMap{}
	if err := s.Client.Get(ctx, req.NamespacedName, cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if cm.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(cm, StreamsFinalizer) {
		return ctrl.Result{}, nil
	}
	ns := req.Namespace
	log := ctrl.LoggerFrom(ctx).WithValues("namespace", ns)
	remove, wait, err := s.shouldRemove(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if wait {
		log.V(1).Info("waiting for the namespace's endpoints to be deleted before deleting its streams")
		return ctrl.Result{RequeueAfter: streamsWaitInterval}, nil
	}
	if remove {
		if err := s.NATS.DeleteSet(ctx, ns); err != nil {
			log.Info("cannot delete the namespace's streams yet", "reason", err.Error())
			return ctrl.Result{RequeueAfter: streamsWaitInterval}, nil
		}
		log.Info("deleted the namespace's streams and key-value bucket", "streams", s.NATS.Config().For(ns).Streams())
	} else {
		log.Info("ConfigMap deleted while the namespace has live endpoints: keeping its streams; it is created again")
		s.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, "StreamsKept", "Delete",
			"the namespace still has WebhookEndpoints: its streams are kept and this ConfigMap is created again; delete the endpoints first to remove them")
	}
	patch := client.MergeFromWithOptions(cm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(cm, StreamsFinalizer)
	return ctrl.Result{}, client.IgnoreNotFound(s.Client.Patch(ctx, cm, patch))
}

// shouldRemove decides what a deleted streams ConfigMap of ns means: wait while endpoints are
// being deleted, remove the set when the namespace goes or has no endpoint, keep it otherwise.
func (s *StreamSets) shouldRemove(ctx context.Context, ns string) (remove, wait bool, err error) {
	list := &v1alpha1.WebhookEndpointList{}
	if err := s.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		return false, false, err
	}
	live := 0
	for i := range list.Items {
		if !list.Items[i].DeletionTimestamp.IsZero() {
			return false, true, nil
		}
		live++
	}
	if live == 0 {
		return true, false, nil
	}
	nsObj := &corev1.Namespace{}
	if err := s.APIReader.Get(ctx, types.NamespacedName{Name: ns}, nsObj); err != nil {
		if apierrors.IsNotFound(err) {
			return false, true, nil
		}
		return false, false, err
	}
	if !nsObj.DeletionTimestamp.IsZero() {
		// The namespace controller deletes the endpoints too: wait for them.
		return false, true, nil
	}
	return false, false, nil
}
