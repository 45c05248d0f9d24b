package dataapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/deliveries"
)

// bookmarkEvery is how often a watch that allows bookmarks gets one while nothing happens.
const bookmarkEvery = 10 * time.Second

// watchBuffer bounds the events a watch holds for a slow client; a client that falls further
// behind is disconnected and resumes from its last resource version.
const watchBuffer = 256

var errWatchStopped = errors.New("the watch stopped")

// Watch follows the outcomes logged in the namespace after the resource version (a delivery-log
// sequence; the newest when empty or "0") that the field selector keeps: a delivery's first
// outcome is ADDED, later ones MODIFIED.
func (s *deliveryStorage) Watch(ctx context.Context, opts *metainternalversion.ListOptions) (watch.Interface, error) {
	ns, err := namespaceOf(ctx)
	if err != nil {
		return nil, err
	}
	if opts != nil && opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		return nil, apierrors.NewBadRequest("sendInitialEvents is not supported: list, then watch from the list's resourceVersion")
	}
	if err := s.bus.available(); err != nil {
		return nil, err
	}
	sel, err := readSelector(opts)
	if err != nil {
		return nil, err
	}
	q := deliveries.Query{Namespace: ns, Endpoint: sel[datav1alpha1.FieldEndpoint], EventID: sel[datav1alpha1.FieldEventID],
		EventType: sel[datav1alpha1.FieldEventType], DeliveryID: sel[datav1alpha1.FieldName]}
	if q.State, err = internalState(sel[datav1alpha1.FieldState]); err != nil {
		return nil, err
	}
	if _, ok := sel[datav1alpha1.FieldView]; ok {
		return nil, apierrors.NewBadRequest("a watch follows deliveries' outcomes: the attempts view (view=attempts) is for lists only")
	}
	if _, ok := sel[datav1alpha1.FieldSince]; ok {
		return nil, apierrors.NewBadRequest("a watch follows what is logged from its resourceVersion on: since and until select lists only")
	}
	if _, ok := sel[datav1alpha1.FieldUntil]; ok {
		return nil, apierrors.NewBadRequest("a watch follows what is logged from its resourceVersion on: since and until select lists only")
	}
	var after uint64
	rv := ""
	if opts != nil {
		rv = opts.ResourceVersion
	}
	switch rv {
	case "", "0":
		wctx, cancel := context.WithTimeout(ctx, requestTimeout)
		after, err = s.bus.reader().LogHead(wctx, ns)
		cancel()
		if err != nil && !errors.Is(err, deliveries.ErrNoStreams) {
			return nil, s.bus.apiError(err, deliveriesResource)
		}
	default:
		if after, err = strconv.ParseUint(rv, 10, 64); err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion %q is not one of this API's (a delivery-log sequence)", rv))
		}
	}
	bookmarks := opts != nil && opts.AllowWatchBookmarks
	ch := make(chan watch.Event, watchBuffer)
	w := watch.NewProxyWatcher(ch)
	wctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-w.StopChan()
		cancel()
	}()
	go func() {
		defer close(ch)
		send := func(ev watch.Event) error {
			select {
			case ch <- ev:
				return nil
			case <-wctx.Done():
				return errWatchStopped
			}
		}
		lastBookmark := time.Now()
		err := s.bus.reader().Follow(wctx, q, after, func(o deliveries.Outcome) error {
			d := deliveryOf(ns, &o.Entry)
			d.ResourceVersion = strconv.FormatUint(o.Resume, 10)
			typ := watch.Modified
			if o.Attempts <= 1 {
				typ = watch.Added
			}
			lastBookmark = time.Now()
			return send(watch.Event{Type: typ, Object: &d})
		}, func(through uint64) error {
			if !bookmarks || time.Since(lastBookmark) < bookmarkEvery {
				return nil
			}
			lastBookmark = time.Now()
			return send(watch.Event{Type: watch.Bookmark, Object: &datav1alpha1.WebhookDelivery{
				TypeMeta:   metav1.TypeMeta{APIVersion: datav1alpha1.SchemeGroupVersion.String(), Kind: "WebhookDelivery"},
				ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.FormatUint(through, 10)}}})
		})
		if err == nil || errors.Is(err, errWatchStopped) || wctx.Err() != nil {
			return
		}
		var status *apierrors.StatusError
		switch {
		case errors.Is(err, deliveries.ErrExpired):
			status = apierrors.NewResourceExpired(err.Error())
		default:
			if !errors.As(s.bus.apiError(err, deliveriesResource), &status) {
				status = apierrors.NewInternalError(err)
			}
		}
		_ = send(watch.Event{Type: watch.Error, Object: &status.ErrStatus})
	}()
	return w, nil
}
