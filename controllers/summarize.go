package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
)

// How a reconcile ends, the same for every reconciler that writes a status (the endpoint, the
// retry policy and the replay reconcilers), after Flux's internal/reconcile/summarize: the
// steps only observe and collect problems (problems); one deferred summary turns what they
// found into the kstatus conditions by one rule (summarize), and one writer applies the
// status when it changed and records the Events (statusWriter.finish). No step writes status.

// problem is why an object is not Ready, in words a user can act on.
type problem struct {
	reason  string
	message string
	// stalled problems need a change of the object or of the installation (kstatus Failed);
	// the others resolve by themselves or by creating what is missing (kstatus InProgress).
	stalled bool
}

// problems keeps, of the problems one reconcile finds, the one its status reports. The rule
// is the same for every reconciler:
//
//   - a problem that stalls wins over one that does not: only a change helps it, and
//     reporting the other instead would have the user wait for something that never comes;
//   - between two of the same kind, the first found wins: steps run in the order of what
//     depends on what, so the first is a cause and the later ones are often its consequences.
//
// The zero value holds no problem.
type problems struct{ top *problem }

// block records a problem that resolves by itself or once what is missing appears.
func (p *problems) block(reason, format string, args ...any) {
	p.add(problem{reason: reason, message: fmt.Sprintf(format, args...)})
}

// stall records a problem that only a change of the object or of the installation resolves.
func (p *problems) stall(reason, format string, args ...any) {
	p.add(problem{reason: reason, message: fmt.Sprintf(format, args...), stalled: true})
}

func (p *problems) add(n problem) {
	if p.top == nil || n.stalled && !p.top.stalled {
		p.top = &n
	}
}

// found is the problem that wins, nil when there is none.
func (p *problems) found() *problem { return p.top }

// verdict is the kstatus part of a status: Ready always, Reconciling and Stalled only while
// they are true (nil otherwise, which removes them).
type verdict struct {
	ready, reconciling, stalled *metav1.Condition
}

// summarize is the one rule by which every reconciler turns the end of a reconcile into its
// kstatus conditions:
//
//  1. an unexpected error: Ready False and Reconciling True, reason Reconciling (the reconcile
//     is retried with the controller's backoff);
//  2. else the problem that wins (see problems): Ready False with its reason and message, and
//     Stalled True when it stalls, Reconciling True when it does not;
//  3. else healthy: the reconciler's own account of a reconcile that found no problem (Ready
//     True, or False while it waits for something that is no problem, such as a suspended
//     endpoint or a replay under way).
func summarize(err error, p *problem, healthy func() verdict) verdict {
	switch {
	case err != nil:
		msg := "reconcile failed, retrying: " + errorMessage(err)
		return verdict{
			ready:       conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonReconciling, msg),
			reconciling: conditions.True(v1alpha1.ConditionReconciling, v1alpha1.ReasonReconciling, msg),
		}
	case p != nil:
		v := verdict{ready: conditions.False(v1alpha1.ConditionReady, p.reason, p.message)}
		if p.stalled {
			v.stalled = conditions.True(v1alpha1.ConditionStalled, p.reason, p.message)
		} else {
			v.reconciling = conditions.True(v1alpha1.ConditionReconciling, p.reason, p.message)
		}
		return v
	}
	return healthy()
}

// errorMessage is err as one line for a condition.
func errorMessage(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out: " + err.Error()
	}
	return err.Error()
}

// statusWriter writes the statuses of one reconciler (S is its kind's status type) as
// FieldManager: it remembers what it wrote (statusMemo), spaces the retries of reconciles
// waiting for NATS, and records an Event when an announced condition changes.
type statusWriter[S any] struct {
	client   client.Client
	recorder recorder.EventRecorder
	// backoff spaces the retries of a reconcile whose problem is NATSUnavailable or
	// InsufficientStorage (both end without a change of the object); nil for a
	// reconciler that does not use NATS.
	backoff *backoff
	memo    statusMemo[S]
}

// ending is what finish needs of one reconcile.
type ending[S any] struct {
	// before is the status as last written (lastStatus); status the one to write now.
	before, status S
	// was are before's conditions, announce the conditions of status an Event is recorded
	// for when their status or reason changed from was.
	was      []metav1.Condition
	announce []*metav1.Condition
	// apply is the apply configuration of status.
	apply runtime.ApplyConfiguration
	// problem, result and err are the reconcile's.
	problem *problem
	result  ctrl.Result
	err     error
}

// finish ends a reconcile of obj: it sets when to come back for a problem waiting for NATS,
// applies the status unless it equals what was last written, records the announced
// transitions once it has, and returns the reconcile's result and error (joined with a failure
// to write).
func (w *statusWriter[S]) finish(ctx context.Context, obj client.Object, e ending[S]) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(obj).String()
	if w.backoff != nil {
		if e.problem != nil && (e.problem.reason == v1alpha1.ReasonNATSUnavailable || e.problem.reason == v1alpha1.ReasonInsufficientStorage) {
			e.result.RequeueAfter = w.backoff.next(key)
		} else if e.err == nil {
			w.backoff.forget(key)
		}
	}
	if wrote, err := w.memo.apply(ctx, w.client, obj, e.before, e.status, e.apply); !wrote || err != nil {
		return e.result, errors.Join(e.err, err)
	}
	for _, c := range e.announce {
		recordTransition(w.recorder, obj, meta.FindStatusCondition(e.was, c.Type), c)
	}
	return e.result, e.err
}

// forget drops what the writer remembers of an object that is gone.
func (w *statusWriter[S]) forget(key types.NamespacedName) {
	w.memo.forget(key)
	if w.backoff != nil {
		w.backoff.forget(key.String())
	}
}

// observed tells the writer what the cache shows of obj's status now (cached): a write it
// remembers that the cache shows is forgotten.
func (w *statusWriter[S]) observed(obj client.Object, cached S) { w.memo.get(obj, cached) }

// last is the status this process last wrote to obj while the cache does not show it yet
// (cached is the cache's): false once it does, and then the writer forgets it. So a status is
// remembered only while its write is on its way to the cache, not for every object.
func (w *statusWriter[S]) last(obj client.Object, cached S) (S, bool) { return w.memo.get(obj, cached) }

// statusMemo remembers the status this process last wrote to each object until the cache
// shows it, so that a reconcile reading a cache that has not seen that write yet neither
// writes it again, nor resets a condition's transition time, nor records its Event twice. The
// controller is the only writer of these fields (its own field manager), and an informer's
// cache does not go back, so once it shows the write the memo is no longer needed: with
// thousands of objects at rest it holds nothing.
type statusMemo[S any] struct {
	mu sync.Mutex
	m  map[types.NamespacedName]memoEntry[S]
}

type memoEntry[S any] struct {
	uid    types.UID
	status S
}

func (m *statusMemo[S]) get(obj client.Object, cached S) (S, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var zero S
	key := client.ObjectKeyFromObject(obj)
	e, ok := m.m[key]
	if !ok || e.uid != obj.GetUID() {
		return zero, false
	}
	if equality.Semantic.DeepEqual(e.status, cached) {
		delete(m.m, key) // the cache caught up
		return zero, false
	}
	return e.status, true
}

// len is how many statuses the memo holds.
func (m *statusMemo[S]) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}

func (m *statusMemo[S]) put(obj client.Object, status S) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[types.NamespacedName]memoEntry[S]{}
	}
	m.m[client.ObjectKeyFromObject(obj)] = memoEntry[S]{uid: obj.GetUID(), status: status}
}

// apply server-side applies ac, the apply configuration of obj's status st, as FieldManager,
// unless st equals before (what was last written); then remembers st. It reports whether it
// wrote; an object deleted meanwhile is no error.
func (m *statusMemo[S]) apply(ctx context.Context, c client.Client, obj client.Object, before, st S, ac runtime.ApplyConfiguration) (bool, error) {
	if equality.Semantic.DeepEqual(before, st) {
		return false, nil
	}
	if err := c.Status().Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("patching status: %w", err)
	}
	m.put(obj, st)
	return true, nil
}

func (m *statusMemo[S]) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
}

// recordTransition records an Event when a condition's status or reason changed.
func recordTransition(rec recorder.EventRecorder, obj runtime.Object, before, after *metav1.Condition) {
	if !conditions.Changed(before, after) {
		return
	}
	typ := corev1.EventTypeWarning
	if after.Status == metav1.ConditionTrue {
		typ = corev1.EventTypeNormal
	}
	rec.Eventf(obj, nil, typ, after.Reason, "Reconcile", "%s", after.Message)
}
