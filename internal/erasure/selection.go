// Package erasure removes payloads from a namespace's streams: the engine of WebhookErasure
// (Engine.Run, phase by phase from a cursor the reconciler keeps in status) and the primitives
// the payload retention sweep shares with it (StripLog, StripDeadLetter). The same phases erase
// the copies of the namespace's events that the namespaces reading it hold (Engine.Readers:
// their records whose eventNamespace is the erased namespace), and nothing else of theirs,
// one reader after the other once the namespace's own events are deleted, so that the
// cursor's ends (Progress.Ends) hold at most the namespace's streams and one reader's.
//
// JetStream cannot change a stored message. Erasing a payload therefore deletes the message
// (a secure delete, which overwrites it on disk) and, where a record must survive without its
// payload (a dead letter's attempt history, a delivery-log record), first publishes the record
// again without it, with a message id naming the original's place (records.RewriteID), so that
// a run resumed within the stream's de-duplication window writes it once. A delivery-log
// message is replaced only once the health counts include it (the fold of the log has passed
// it), and the fold passes over replacements (records.HRewriteOf): counts never change because
// of an erasure. A deleted event keeps its Nats-Msg-Id in the events stream's de-duplication
// window, so a producer retrying the same publish meanwhile does not bring it back.
package erasure

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// FieldExpression is where a WebhookErasure's expression is, as its errors name it.
const FieldExpression = "spec.expression"

// Selection is what an erasure selects: every criterion set must hold.
type Selection struct {
	// IDs are event ids (none: any).
	IDs map[string]bool
	// Types are event-type patterns, from the spec's subjects (none: any).
	Types []string
	// Filter is the compiled expression (nil: none).
	Filter *expr.Filter
	// Since and Until bound the event's time (zero: unbounded).
	Since, Until time.Time
}

// OutsideError says a spec names something outside its namespace.
type OutsideError struct{ msg string }

func (e *OutsideError) Error() string { return e.msg }

// SelectionOf reads the spec of an erasure in set's namespace. A subject outside the
// namespace's events is an *OutsideError, an expression that does not compile an *expr.Error.
func SelectionOf(set streams.Set, spec *v1alpha1.WebhookErasureSpec) (Selection, error) {
	sel := Selection{}
	if len(spec.EventIDs) > 0 {
		sel.IDs = make(map[string]bool, len(spec.EventIDs))
		for _, id := range spec.EventIDs {
			sel.IDs[id] = true
		}
	}
	own := strings.TrimSuffix(set.EventsFilter(), ">")
	for _, s := range spec.Subjects {
		rest, ok := strings.CutPrefix(s, own)
		if !ok || !match.Valid(rest) {
			return sel, &OutsideError{fmt.Sprintf("spec.subjects: %q is not a subject of namespace %s's events (%s<event-type>, '*' for one token, '>' last for the rest): an erasure erases only its own namespace's payloads",
				records.Bound(s, 128), set.Namespace(), own)}
		}
		sel.Types = append(sel.Types, rest)
	}
	if spec.Expression != "" {
		f, err := expr.CompileFilterAt(FieldExpression, spec.Expression)
		if err != nil {
			return sel, err
		}
		sel.Filter = f
	}
	if spec.Since != nil {
		sel.Since = spec.Since.Time
	}
	if spec.Until != nil {
		sel.Until = spec.Until.Time
	}
	return sel, nil
}

// decidable reports whether the selection can decide on what a record without the event's body
// says (its id and type): it has no expression and no time range.
func (s *Selection) decidable() bool {
	return s.Filter == nil && s.Since.IsZero() && s.Until.IsZero()
}

// byIDAndType is whether an event of this id and type passes the id and subject criteria.
func (s *Selection) byIDAndType(id, typ string) bool {
	if s.IDs != nil && !s.IDs[id] {
		return false
	}
	if len(s.Types) == 0 {
		return true
	}
	for _, p := range s.Types {
		if match.Covers(p, typ) {
			return true
		}
	}
	return false
}

// Match decides on one stored event (ev with its body; withBody false when the stored copy
// has lost it, and then the expression cannot be evaluated). unevaluated is true when the
// expression could not decide on the event's content (a field it lacks). An error is the
// expression stopped by one of its bounds (expr.IsLimit: what it builds, its work, its
// deadline) or by ctx: the erasure cannot go on with it.
func (s *Selection) Match(ctx context.Context, ev *expr.Event, withBody bool) (matched, unevaluated bool, err error) {
	if !s.byIDAndType(ev.ID, ev.Type) {
		return false, false, nil
	}
	if !s.Since.IsZero() && ev.Time.Before(s.Since) || !s.Until.IsZero() && !ev.Time.Before(s.Until) {
		return false, false, nil
	}
	if s.Filter == nil {
		return true, false, nil
	}
	if !withBody {
		return false, false, nil
	}
	ok, err := s.Filter.Match(ctx, expr.NewInput(ev))
	switch {
	case err != nil && expr.IsLimit(err):
		return false, false, err
	case err != nil:
		return false, true, nil
	}
	return ok, false, nil
}
