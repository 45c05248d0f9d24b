package dataapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// eventStorage serves webhookevents: create publishes, with the HTTP ingress's rules.
type eventStorage struct {
	bus       *Bus
	publisher *ingress.Publisher
	now       func() time.Time
}

var (
	_ rest.Storage = &eventStorage{}
	_ rest.Scoper  = &eventStorage{}
	_ rest.Creater = &eventStorage{}
)

var eventsResource = datav1alpha1.Resource(datav1alpha1.ResourceEvents)

func (s *eventStorage) New() runtime.Object     { return &datav1alpha1.WebhookEvent{} }
func (s *eventStorage) Destroy()                {}
func (s *eventStorage) NamespaceScoped() bool   { return true }
func (s *eventStorage) Kind() string            { return "WebhookEvent" }
func (s *eventStorage) GetSingularName() string { return "webhookevent" }
func (s *eventStorage) Categories() []string    { return []string{"webhooks"} }

// Create publishes the event into the namespace's events stream, its name as its id: the
// answer is the ingress's (201 once JetStream stored it, or had it already within the
// duplicate window: status.duplicate).
func (s *eventStorage) Create(ctx context.Context, obj runtime.Object, validate rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	ev, ok := obj.(*datav1alpha1.WebhookEvent)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a WebhookEvent: %T", obj))
	}
	if ev.Name == "" {
		return nil, apierrors.NewBadRequest("metadata.name is the event's id, which de-duplicates a retried create: give one (generateName is not supported)")
	}
	if opts != nil && len(opts.DryRun) > 0 {
		return nil, apierrors.NewBadRequest("a WebhookEvent cannot be created as a dry run: creating one publishes it")
	}
	if validate != nil {
		if err := validate(ctx, obj); err != nil {
			return nil, err
		}
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	data := ev.Spec.Data.Raw
	res := s.publisher.Publish(ctx, ns, ingress.Event{ID: ev.Name, Type: ev.Spec.Type, Data: data, Time: ev.Spec.Time, Subject: ev.Spec.Subject,
		OrderingKey: ev.Spec.OrderingKey, Headers: ev.Spec.Headers}, "", "")
	if res.Status != http.StatusAccepted {
		return nil, publishError(ev.Name, res)
	}
	out := ev.DeepCopy()
	out.TypeMeta = metav1.TypeMeta{APIVersion: datav1alpha1.SchemeGroupVersion.String(), Kind: "WebhookEvent"}
	out.Namespace, out.CreationTimestamp = ns, metav1.NewTime(s.now())
	out.ResourceVersion, out.UID, out.GenerateName = "", "", ""
	out.Status = datav1alpha1.WebhookEventStatus{Stream: res.Stream, Sequence: int64(res.Sequence), Duplicate: res.Duplicate}
	return out, nil
}

// publishError is the ingress's answer as the API's.
func publishError(name string, res ingress.Result) error {
	msg := records.Bound(res.Error, 2048)
	switch res.Status {
	case http.StatusBadRequest:
		return apierrors.NewBadRequest(msg)
	case http.StatusForbidden:
		return apierrors.NewForbidden(eventsResource, name, fmt.Errorf("%s", msg))
	case http.StatusRequestEntityTooLarge:
		return apierrors.NewRequestEntityTooLargeError(msg)
	case http.StatusTooManyRequests:
		return apierrors.NewTooManyRequests(msg, 1)
	case http.StatusNotFound:
		err := apierrors.NewNotFound(eventsResource, name)
		err.ErrStatus.Message = msg
		return err
	case http.StatusServiceUnavailable:
		return unavailable(msg)
	}
	return apierrors.NewGenericServerResponse(res.Status, "create", eventsResource, name, msg, 0, false)
}
