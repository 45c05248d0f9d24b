package dataapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/warning"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/deliveries"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// requestTimeout bounds one get or list.
const requestTimeout = 30 * time.Second

// deliveryStorage serves webhookdeliveries.
type deliveryStorage struct {
	bus       *Bus
	endpoints client.Reader
	now       func() time.Time
	// maxScan overrides deliveries.DefaultMaxScan (tests).
	maxScan uint64
}

var (
	_ rest.Storage              = &deliveryStorage{}
	_ rest.Scoper               = &deliveryStorage{}
	_ rest.KindProvider         = &deliveryStorage{}
	_ rest.SingularNameProvider = &deliveryStorage{}
	_ rest.Getter               = &deliveryStorage{}
	_ rest.Lister               = &deliveryStorage{}
	_ rest.Watcher              = &deliveryStorage{}
)

var deliveriesResource = datav1alpha1.Resource(datav1alpha1.ResourceDeliveries)

func (s *deliveryStorage) New() runtime.Object     { return &datav1alpha1.WebhookDelivery{} }
func (s *deliveryStorage) NewList() runtime.Object { return &datav1alpha1.WebhookDeliveryList{} }
func (s *deliveryStorage) Destroy()                {}
func (s *deliveryStorage) NamespaceScoped() bool   { return true }
func (s *deliveryStorage) Kind() string            { return "WebhookDelivery" }
func (s *deliveryStorage) GetSingularName() string { return "webhookdelivery" }
func (s *deliveryStorage) clock() time.Time        { return s.now() }
func (s *deliveryStorage) ShortNames() []string    { return []string{"whd"} }
func (s *deliveryStorage) Categories() []string    { return []string{"webhooks"} }

// query is the reader's query for a list in namespace ns.
func (s *deliveryStorage) query(ctx context.Context, ns string, opts *metainternalversion.ListOptions) (deliveries.Query, string, error) {
	sel, err := readSelector(opts)
	if err != nil {
		return deliveries.Query{}, "", err
	}
	q := deliveries.Query{Namespace: ns, Endpoint: sel[datav1alpha1.FieldEndpoint], EventID: sel[datav1alpha1.FieldEventID],
		EventType: sel[datav1alpha1.FieldEventType], DeliveryID: sel[datav1alpha1.FieldName]}
	if v, ok := sel[datav1alpha1.FieldNamespace]; ok && v != ns {
		return q, "", apierrors.NewBadRequest(fmt.Sprintf("field selector metadata.namespace=%s: this list is of namespace %s", v, ns))
	}
	if q.State, err = internalState(sel[datav1alpha1.FieldState]); err != nil {
		return q, "", err
	}
	if v, ok := sel[datav1alpha1.FieldView]; ok {
		if v != datav1alpha1.ViewAttempts {
			return q, "", apierrors.NewBadRequest(fmt.Sprintf("field selector %s=%q: the one view is %s (every attempt of the delivery log)", datav1alpha1.FieldView, v, datav1alpha1.ViewAttempts))
		}
		if q.State == records.StatePending || q.State == records.StateAttempting {
			return q, "", apierrors.NewBadRequest(fmt.Sprintf("field selector %s=%s lists attempts already made: %s deliveries have none yet", datav1alpha1.FieldView, v, records.APIState(q.State)))
		}
		q.Attempts = true
	}
	now := s.clock()
	if q.Since, err = selectorTime(datav1alpha1.FieldSince, sel[datav1alpha1.FieldSince], now); err != nil {
		return q, "", err
	}
	if q.Until, err = selectorTime(datav1alpha1.FieldUntil, sel[datav1alpha1.FieldUntil], now); err != nil {
		return q, "", err
	}
	if q.Limit, err = pageLimit(opts, deliveries.DefaultLimit, deliveries.MaxLimit); err != nil {
		return q, "", err
	}
	digest := queryDigest(datav1alpha1.ResourceDeliveries, ns, sel)
	var cont string
	if opts != nil {
		if cont, err = decodeContinue(opts.Continue, digest); err != nil {
			return q, "", err
		}
	}
	if q.Cursor, err = deliveries.ParseCursor(cont); err != nil {
		return q, "", apierrors.NewBadRequest("the continue token is not one this server made")
	}
	eps, err := endpointsOf(ctx, s.endpoints, ns)
	if err != nil {
		return q, "", fmt.Errorf("reading the namespace's endpoints: %w", err)
	}
	q.Endpoints = eps
	q.MaxScan = s.maxScan
	return q, digest, nil
}

func namespaceOf(ctx context.Context) (string, error) {
	ns, ok := genericapirequest.NamespaceFrom(ctx)
	if !ok || ns == "" {
		return "", apierrors.NewBadRequest("deliveries are read per namespace: name one (-n), --all-namespaces is not supported")
	}
	return ns, nil
}

// List reads one page of the namespace's deliveries, newest first.
func (s *deliveryStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	q, digest, err := s.query(ctx, ns, opts)
	if err != nil {
		return nil, err
	}
	release, err := s.bus.read(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	head, err := s.bus.reader().LogHead(ctx, ns)
	if err != nil && !errors.Is(err, deliveries.ErrNoStreams) {
		return nil, s.bus.apiError(err, deliveriesResource)
	}
	list := &datav1alpha1.WebhookDeliveryList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatUint(head, 10)}}
	page, err := s.bus.reader().Read(ctx, q)
	if errors.Is(err, deliveries.ErrNoStreams) {
		return list, nil
	}
	if err != nil {
		return nil, s.bus.apiError(err, deliveriesResource)
	}
	list.Items = make([]datav1alpha1.WebhookDelivery, 0, len(page.Entries))
	for i := range page.Entries {
		list.Items = append(list.Items, deliveryOf(ns, &page.Entries[i]))
	}
	if page.HasMore {
		list.Continue = encodeContinue(digest, page.Next.String())
	}
	for _, w := range page.Warnings {
		warn(ctx, w)
	}
	return list, nil
}

// Get reads one delivery by its id: the newest DefaultMaxScan messages of the namespace's
// delivery log are searched for it, and everything still live.
func (s *deliveryStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	e, err := s.find(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	d := deliveryOf(ns, e)
	return &d, nil
}

// find looks one delivery up by its id.
func (s *deliveryStorage) find(ctx context.Context, ns, name string) (*deliveries.Entry, error) {
	if err := checkName(name); err != nil {
		return nil, apierrors.NewNotFound(deliveriesResource, name)
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	eps, err := endpointsOf(ctx, s.endpoints, ns)
	if err != nil {
		return nil, fmt.Errorf("reading the namespace's endpoints: %w", err)
	}
	release, err := s.bus.read(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	page, err := s.bus.reader().Read(ctx, deliveries.Query{Namespace: ns, DeliveryID: name, Limit: 1, Lookup: true, Endpoints: eps, MaxScan: s.maxScan})
	if errors.Is(err, deliveries.ErrNoStreams) || err == nil && len(page.Entries) == 0 {
		return nil, notFound(deliveriesResource, name, fmt.Sprintf("not among the deliveries live or logged in the newest %d delivery-log messages of namespace %s; older ones are listed with spec.endpoint and since/until", s.scanBound(), ns))
	}
	if err != nil {
		return nil, s.bus.apiError(err, deliveriesResource)
	}
	return &page.Entries[0], nil
}

func (s *deliveryStorage) scanBound() uint64 {
	if s.maxScan > 0 {
		return s.maxScan
	}
	return deliveries.DefaultMaxScan
}

// checkName refuses what cannot be a delivery id (one subject token).
func checkName(name string) error {
	if name == "" || len(name) > 255 || strings.ContainsAny(name, ".*> \t\r\n/") {
		return fmt.Errorf("%q is not a delivery id", name)
	}
	return nil
}

// notFound is a 404 that says why.
func notFound(gr schema.GroupResource, name, why string) error {
	err := apierrors.NewNotFound(gr, name)
	err.ErrStatus.Message = fmt.Sprintf("%s %q not found: %s", gr.String(), name, why)
	return err
}

// warn adds a warning to the response (kubectl prints it).
func warn(ctx context.Context, msg string) { warning.AddWarning(ctx, "", msg) }

// deliveryOf is an entry as the API shows it: without payloads (response bodies and request
// headers are the payload subresource's).
func deliveryOf(ns string, e *deliveries.Entry) datav1alpha1.WebhookDelivery {
	created := e.Time
	if e.CreatedAt != nil {
		created = *e.CreatedAt
	}
	d := datav1alpha1.WebhookDelivery{
		TypeMeta:   metav1.TypeMeta{APIVersion: datav1alpha1.SchemeGroupVersion.String(), Kind: "WebhookDelivery"},
		ObjectMeta: metav1.ObjectMeta{Name: e.ID, Namespace: ns, CreationTimestamp: metav1.NewTime(created)},
		Spec: datav1alpha1.WebhookDeliverySpec{Endpoint: e.Endpoint, EventID: e.EventID, EventType: e.EventType,
			ReplayOf: e.ReplayOfID, Test: e.Test},
		Status: datav1alpha1.WebhookDeliveryStatus{State: records.APIState(e.Status), Time: metav1.NewMicroTime(e.Time), HeldReason: e.HeldReason,
			Attempts: int32(e.Attempts), Reason: e.Reason, DeadLetterReason: e.DeadLetterReason, PayloadRemoved: e.PayloadRemoved,
			TraceID: e.TraceID()},
	}
	if e.From == deliveries.FromLog {
		d.ResourceVersion = strconv.FormatUint(e.Seq, 10)
	}
	if e.LastAttemptAt != nil {
		t := metav1.NewTime(*e.LastAttemptAt)
		d.Status.LastAttemptTime = &t
	}
	if e.NextAttemptAt != nil && e.Status == records.StateFailed {
		t := metav1.NewTime(*e.NextAttemptAt)
		d.Status.NextAttemptTime = &t
	}
	if e.LastResponse != nil {
		d.Status.LastResponse = &datav1alpha1.Response{StatusCode: int32(e.LastResponse.StatusCode), Error: e.LastResponse.Error,
			BodyTruncated: e.LastResponse.Truncated}
	}
	if e.LatencyUS != nil {
		us := *e.LatencyUS
		d.Status.LatencyMicroseconds = &us
	} else if e.LatencyMS != nil {
		us := *e.LatencyMS * 1000
		d.Status.LatencyMicroseconds = &us
	}
	for _, a := range e.History {
		d.Status.AttemptHistory = append(d.Status.AttemptHistory, attemptOf(a))
	}
	if len(e.History) == 0 && e.LastAttemptAt != nil && e.Attempts > 0 {
		a := datav1alpha1.Attempt{Number: int32(e.Attempts), Time: metav1.NewTime(*e.LastAttemptAt), Reason: e.Reason, TraceID: d.Status.TraceID}
		if d.Status.LatencyMicroseconds != nil {
			a.DurationMicroseconds = *d.Status.LatencyMicroseconds
		}
		if e.LastResponse != nil {
			a.StatusCode, a.Error = int32(e.LastResponse.StatusCode), e.LastResponse.Error
		}
		d.Status.AttemptHistory = []datav1alpha1.Attempt{a}
	}
	return d
}

// attemptOf is a stored attempt as the API shows it.
func attemptOf(a records.Attempt) datav1alpha1.Attempt {
	us := a.LatencyUS
	if us == 0 {
		us = a.LatencyMS * 1000
	}
	return datav1alpha1.Attempt{Number: int32(a.N), Time: metav1.NewTime(a.Time), StatusCode: int32(a.StatusCode), DurationMicroseconds: us,
		Reason: a.Reason, Error: a.Error}
}
