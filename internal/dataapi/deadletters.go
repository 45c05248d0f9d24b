package dataapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/deadletters"
)

// AnnotationPurgeEvent and MaxPurge are the API's (api/data/v1alpha1), which clients read.
const (
	AnnotationPurgeEvent = datav1alpha1.AnnotationPurgeEvent
	MaxPurge             = datav1alpha1.MaxPurge
)

// deadLetterStorage serves webhookdeadletters.
type deadLetterStorage struct {
	bus *Bus
	now func() time.Time
}

var (
	_ rest.Storage           = &deadLetterStorage{}
	_ rest.Scoper            = &deadLetterStorage{}
	_ rest.Getter            = &deadLetterStorage{}
	_ rest.Lister            = &deadLetterStorage{}
	_ rest.GracefulDeleter   = &deadLetterStorage{}
	_ rest.CollectionDeleter = &deadLetterStorage{}
)

var deadLettersResource = datav1alpha1.Resource(datav1alpha1.ResourceDeadLetters)

func (s *deadLetterStorage) New() runtime.Object     { return &datav1alpha1.WebhookDeadLetter{} }
func (s *deadLetterStorage) NewList() runtime.Object { return &datav1alpha1.WebhookDeadLetterList{} }
func (s *deadLetterStorage) Destroy()                {}
func (s *deadLetterStorage) NamespaceScoped() bool   { return true }
func (s *deadLetterStorage) Kind() string            { return "WebhookDeadLetter" }
func (s *deadLetterStorage) GetSingularName() string { return "webhookdeadletter" }
func (s *deadLetterStorage) ShortNames() []string    { return []string{"whdlq"} }
func (s *deadLetterStorage) Categories() []string    { return []string{"webhooks"} }

func (s *deadLetterStorage) store() *deadletters.Store {
	return &deadletters.Store{NC: s.bus.NC, JS: s.bus.JS, Streams: s.bus.Streams}
}

// selection reads a list's field selector.
func (s *deadLetterStorage) selection(opts *metainternalversion.ListOptions) (deadletters.Selection, selector, error) {
	sel, err := readSelector(opts)
	if err != nil {
		return deadletters.Selection{}, nil, err
	}
	out := deadletters.Selection{Endpoint: sel[datav1alpha1.FieldEndpoint]}
	if r := sel[datav1alpha1.FieldReason]; r != "" {
		out.Reasons = []string{r}
	}
	if out.Before, err = selectorTime(datav1alpha1.FieldUntil, sel[datav1alpha1.FieldUntil], s.now()); err != nil {
		return out, nil, err
	}
	if _, ok := sel[datav1alpha1.FieldName]; ok {
		return out, nil, apierrors.NewBadRequest("get a dead letter by its name instead of selecting metadata.name")
	}
	return out, sel, nil
}

// List reads a page of the namespace's dead letters, newest first.
func (s *deadLetterStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	sel, fs, err := s.selection(opts)
	if err != nil {
		return nil, err
	}
	limit, err := pageLimit(opts, deadletters.MaxLimit/2, deadletters.MaxLimit)
	if err != nil {
		return nil, err
	}
	digest := queryDigest(datav1alpha1.ResourceDeadLetters, ns, fs)
	var before uint64
	if opts != nil && opts.Continue != "" {
		c, err := decodeContinue(opts.Continue, digest)
		if err != nil {
			return nil, err
		}
		if before, err = strconv.ParseUint(c, 10, 64); err != nil {
			return nil, apierrors.NewBadRequest("the continue token is not one this server made")
		}
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	release, err := s.bus.read(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	list := &datav1alpha1.WebhookDeadLetterList{}
	page, err := s.store().List(ctx, ns, sel, before, limit)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return list, nil
	}
	if err != nil {
		return nil, s.error(err)
	}
	list.Items = make([]datav1alpha1.WebhookDeadLetter, 0, len(page.Items))
	for i := range page.Items {
		list.Items = append(list.Items, deadLetterOf(ns, &page.Items[i]))
	}
	if page.Next != 0 {
		list.Continue = encodeContinue(digest, strconv.FormatUint(page.Next, 10))
	}
	return list, nil
}

func (s *deadLetterStorage) error(err error) error {
	var broad *deadletters.TooBroadError
	if errors.Is(err, deadletters.ErrBadQuery) || errors.As(err, &broad) {
		return apierrors.NewBadRequest(err.Error())
	}
	return s.bus.apiError(err, deadLettersResource)
}

// Get reads one dead letter by its delivery id.
func (s *deadLetterStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	it, err := s.store().Get(ctx, ns, name)
	if errors.Is(err, deadletters.ErrNotFound) {
		return nil, apierrors.NewNotFound(deadLettersResource, name)
	}
	if err != nil {
		return nil, s.error(err)
	}
	d := deadLetterOf(ns, &it)
	return &d, nil
}

// Delete purges one dead letter, recorded as the operational event webhook_operator.dlq.purged.
func (s *deadLetterStorage) Delete(ctx context.Context, name string, validate rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := s.bus.available(); err != nil {
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if opts != nil && len(opts.DryRun) > 0 {
		obj, err := s.Get(ctx, name, nil)
		return obj, true, err
	}
	if validate != nil {
		obj, err := s.Get(ctx, name, nil)
		if err != nil {
			return nil, false, err
		}
		if err := validate(ctx, obj); err != nil {
			return nil, false, err
		}
	}
	nc, js, done, err := s.bus.purger(ctx, ns)
	if err != nil {
		return nil, false, unavailable(fmt.Sprintf("cannot connect to NATS as namespace %s's purger: %v", ns, err))
	}
	defer done()
	store := &deadletters.Store{NC: nc, JS: js, Streams: s.bus.Streams}
	it, res, err := store.Delete(ctx, ns, name, s.now())
	if errors.Is(err, deadletters.ErrNotFound) {
		return nil, false, apierrors.NewNotFound(deadLettersResource, name)
	}
	if err != nil && res.Purged == 0 {
		return nil, false, s.error(err)
	}
	d := deadLetterOf(ns, &it)
	d.Annotations = map[string]string{AnnotationPurgeEvent: res.Event}
	if err != nil {
		warn(ctx, fmt.Sprintf("the dead letter is purged, but its purge could not be recorded as an operational event: %v", err))
	}
	return &d, true, nil
}

// DeleteCollection purges the dead letters the field selector takes (spec.endpoint,
// status.reason, until), at most MaxPurge of them, recorded as one operational event, and
// returns them (without payloads), each annotated with that event.
func (s *deadLetterStorage) DeleteCollection(ctx context.Context, _ rest.ValidateObjectFunc, opts *metav1.DeleteOptions, listOpts *metainternalversion.ListOptions) (runtime.Object, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	sel, _, err := s.selection(listOpts)
	if err != nil {
		return nil, err
	}
	if opts != nil && len(opts.DryRun) > 0 {
		return nil, apierrors.NewBadRequest("a dry run of a purge is a list with the same field selector")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*requestTimeout)
	defer cancel()
	nc, js, done, err := s.bus.purger(ctx, ns)
	if err != nil {
		return nil, unavailable(fmt.Sprintf("cannot connect to NATS as namespace %s's purger: %v", ns, err))
	}
	defer done()
	store := &deadletters.Store{NC: nc, JS: js, Streams: s.bus.Streams}
	res, err := store.Purge(ctx, ns, sel, MaxPurge, s.now())
	list := &datav1alpha1.WebhookDeadLetterList{Items: make([]datav1alpha1.WebhookDeadLetter, 0, len(res.Items))}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return list, nil
	}
	if err != nil && res.Purged == 0 {
		return nil, s.error(err)
	}
	if err != nil {
		warn(ctx, fmt.Sprintf("purged %d dead letters, then: %v", res.Purged, err))
	}
	for i := range res.Items {
		d := deadLetterOf(ns, &res.Items[i])
		d.Annotations = map[string]string{AnnotationPurgeEvent: res.Event}
		list.Items = append(list.Items, d)
	}
	return list, nil
}

// deadLetterOf is a stored dead letter as the API shows it (without its payload).
func deadLetterOf(ns string, it *deadletters.Item) datav1alpha1.WebhookDeadLetter {
	created := it.CreatedAt
	if created.IsZero() {
		created = it.StoredAt
	}
	d := datav1alpha1.WebhookDeadLetter{
		TypeMeta:   metav1.TypeMeta{APIVersion: datav1alpha1.SchemeGroupVersion.String(), Kind: "WebhookDeadLetter"},
		ObjectMeta: metav1.ObjectMeta{Name: it.DeliveryID, Namespace: ns, CreationTimestamp: metav1.NewTime(created), ResourceVersion: strconv.FormatUint(it.Seq, 10)},
		Spec: datav1alpha1.WebhookDeliverySpec{Endpoint: it.Endpoint, EventID: it.EventID, EventType: it.EventType, ReplayOf: it.ReplayOf,
			Test: it.Reason == "test_failed"},
		Status: datav1alpha1.WebhookDeadLetterStatus{Reason: it.Reason, Message: it.Message, DeadLetteredTime: metav1.NewTime(it.DeadLetteredAt),
			PayloadBytes: int64(len(it.Payload)), PayloadTruncated: it.PayloadTruncated, PayloadRemoved: it.PayloadRemoved, Sequence: int64(it.Seq)},
	}
	if !it.Readable {
		d.Status.Reason, d.Status.Message, d.Status.DeadLetteredTime = "unreadable", "the dead letter's record could not be read", metav1.NewTime(it.StoredAt)
	}
	if d.Status.DeadLetteredTime.IsZero() {
		d.Status.DeadLetteredTime = metav1.NewTime(it.StoredAt)
	}
	if !it.EventTime.IsZero() {
		t := metav1.NewTime(it.EventTime)
		d.Status.EventTime = &t
	}
	if it.PayloadRemovedAt != nil {
		t := metav1.NewTime(*it.PayloadRemovedAt)
		d.Status.PayloadRemovedTime = &t
	}
	d.Status.EventSequence = int64(it.EventSeq)
	for _, a := range it.Attempts {
		d.Status.Attempts = append(d.Status.Attempts, attemptOf(a))
	}
	if r := it.LastResponse; r != nil {
		d.Status.LastResponse = &datav1alpha1.Response{StatusCode: int32(r.StatusCode), Error: r.Error, BodyTruncated: r.Truncated}
	}
	return d
}

var deadLetterColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "The delivery id."},
	{Name: "Endpoint", Type: "string", Description: "The WebhookEndpoint it was for."},
	{Name: "Reason", Type: "string", Description: "Why it was given up."},
	{Name: "Attempts", Type: "integer", Description: "Attempts made."},
	{Name: "Last Response", Type: "string", Description: "What the last attempt got."},
	{Name: "Event Type", Type: "string", Description: "The event's type."},
	{Name: "Age", Type: "string", Description: "Since it was dead-lettered."},
	{Name: "Event ID", Type: "string", Priority: 1, Description: "The event's id."},
	{Name: "Replay Of", Type: "string", Priority: 1, Description: "The delivery it replayed."},
}

func (s *deadLetterStorage) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	t := &metav1.Table{ColumnDefinitions: deadLetterColumns}
	now := s.now()
	add := func(d *datav1alpha1.WebhookDeadLetter) {
		last := "-"
		if r := d.Status.LastResponse; r != nil {
			last = responseCell(r, "")
			if last == "-" && r.Error != "" {
				last = r.Error
			}
		}
		t.Rows = append(t.Rows, metav1.TableRow{Object: runtime.RawExtension{Object: d}, Cells: []any{
			d.Name, d.Spec.Endpoint, d.Status.Reason, int64(len(d.Status.Attempts)), last, orDash(d.Spec.EventType),
			age(d.Status.DeadLetteredTime.Time, now), orDash(d.Spec.EventID), orDash(d.Spec.ReplayOf),
		}})
	}
	switch o := obj.(type) {
	case *datav1alpha1.WebhookDeadLetter:
		add(o)
	case *datav1alpha1.WebhookDeadLetterList:
		for i := range o.Items {
			add(&o.Items[i])
		}
	default:
		return nil, fmt.Errorf("cannot print %T as a table of dead letters", obj)
	}
	if l, err := meta.ListAccessor(obj); err == nil {
		t.ResourceVersion, t.Continue = l.GetResourceVersion(), l.GetContinue()
	}
	return t, nil
}
