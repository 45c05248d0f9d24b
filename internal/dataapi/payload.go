package dataapi

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/deadletters"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// deliveryPayloadStorage serves webhookdeliveries/payload.
type deliveryPayloadStorage struct{ d *deliveryStorage }

// deadLetterPayloadStorage serves webhookdeadletters/payload.
type deadLetterPayloadStorage struct{ dl *deadLetterStorage }

var (
	_ rest.Getter = &deliveryPayloadStorage{}
	_ rest.Getter = &deadLetterPayloadStorage{}
)

func (s *deliveryPayloadStorage) New() runtime.Object   { return &datav1alpha1.DeliveryPayload{} }
func (s *deliveryPayloadStorage) Destroy()              {}
func (s *deliveryPayloadStorage) NamespaceScoped() bool { return true }
func (s *deliveryPayloadStorage) Kind() string          { return "DeliveryPayload" }

func (s *deadLetterPayloadStorage) New() runtime.Object   { return &datav1alpha1.DeliveryPayload{} }
func (s *deadLetterPayloadStorage) Destroy()              {}
func (s *deadLetterPayloadStorage) NamespaceScoped() bool { return true }
func (s *deadLetterPayloadStorage) Kind() string          { return "DeliveryPayload" }

// Get reads a delivery's payload: its event's body and headers, the request headers of its
// last attempt and the last response's body. A dead-lettered delivery's event is its dead
// letter's while it is kept.
func (s *deliveryPayloadStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	e, err := s.d.find(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	p, err := s.d.bus.reader().Payload(ctx, ns, e)
	if err != nil {
		return nil, s.d.bus.apiError(err, deliveriesResource)
	}
	out := payloadObject(ns, name, e.Endpoint)
	out.Removed, out.RequestHeaders = p.Removed, p.RequestHeaders
	if p.Response != nil {
		out.Response = body([]byte(p.Response.Body), p.Response.Truncated)
	}
	if e.Status == records.StateDeadLetter && p.Removed == "" {
		store := (&deadLetterStorage{bus: s.d.bus}).store()
		if it, err := store.Get(ctx, ns, name); err == nil && it.Readable {
			p.Event, p.EventFound, p.EventHeaders = it.Payload, true, nats.Header(it.Headers)
		} else if err != nil && !errors.Is(err, deadletters.ErrNotFound) {
			return nil, s.d.bus.apiError(err, deliveriesResource)
		}
	}
	if p.EventFound {
		out.Event, out.EventHeaders = body(p.Event, false), p.EventHeaders
	}
	return out, nil
}

// Get reads a dead letter's payload: the event's body and headers it keeps, and the last
// response's body.
func (s *deadLetterPayloadStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.dl.bus.available(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	it, err := s.dl.store().Get(ctx, ns, name)
	if errors.Is(err, deadletters.ErrNotFound) {
		return nil, apierrors.NewNotFound(deadLettersResource, name)
	}
	if err != nil {
		return nil, s.dl.error(err)
	}
	out := payloadObject(ns, name, it.Endpoint)
	out.Removed = it.PayloadRemoved
	if it.PayloadRemoved == "" {
		out.Event, out.EventHeaders = body(it.Payload, it.PayloadTruncated), it.Headers
	}
	if r := it.LastResponse; r != nil && r.Body != "" {
		out.Response = body([]byte(r.Body), r.Truncated)
	}
	return out, nil
}

func payloadObject(ns, name, endpoint string) *datav1alpha1.DeliveryPayload {
	return &datav1alpha1.DeliveryPayload{
		TypeMeta:   metav1.TypeMeta{APIVersion: datav1alpha1.SchemeGroupVersion.String(), Kind: "DeliveryPayload"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Endpoint:   endpoint,
	}
}

// body is a stored body as the API shows it: JSON as it is, anything else as text.
func body(b []byte, truncated bool) *datav1alpha1.Body {
	out := &datav1alpha1.Body{Bytes: int64(len(b)), Truncated: truncated}
	if len(b) > 0 && utf8.Valid(b) && json.Valid(b) {
		out.JSON = &runtime.RawExtension{Raw: append([]byte(nil), b...)}
		return out
	}
	out.Text = strings.ToValidUTF8(string(b), "\uFFFD")
	return out
}
