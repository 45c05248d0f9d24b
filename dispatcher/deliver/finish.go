package deliver

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/settle"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// finish has v carried out for msg by the settle package, the one place a delivery ends. It
// returns the retry to wait out here (decide.ActWait), or nil. ctx carries the attempt's span.
func (w *Worker) finish(ctx context.Context, msg jetstream.Msg, v decide.Verdict) *heldRetry {
	if wt := w.f.Settle.Finish(ctx, (*settling)(w), msg, v); wt != nil {
		return &heldRetry{meta: wt.Meta, wait: wt.Delay}
	}
	return nil
}

// releaseAll hands back what a stopping worker still had queued.
func releaseAll(queue []*pulled) {
	for _, m := range queue {
		settle.Release(m, 0)
	}
}

// settling is a worker as the settle package sees it (settle.Endpoint).
type settling Worker

var _ settle.Endpoint = (*settling)(nil)

func (s *settling) Name() string       { return s.name }
func (s *settling) LogSubject() string { return s.logSubject }

func (s *settling) Lane() (streams.Lane, bool) {
	if c := s.cfg.Load(); c != nil {
		return c.Lane, c.Deleting
	}
	return streams.LaneOwn, false
}

func (s *settling) Logging(id string) {
	s.inflight.Add(1)
	s.busy.hold(id)
}

func (s *settling) Logged(id string) {
	s.busy.release(id)
	s.inflight.Done()
}

func (s *settling) Go(f func())                { s.f.Runners.Go(f) }
func (s *settling) Changed()                   { (*Worker)(s).dirty() }
func (s *settling) Retried()                   { s.Metrics.Retried() }
func (s *settling) DeadLettered(reason string) { s.Metrics.DeadLettered(reason) }
func (s *settling) Held()                      { s.Metrics.Held() }

// RetryScheduled: a deleted endpoint's scheduled retries are dead-lettered by its partition's
// holder, which reads them back.
func (s *settling) RetryScheduled() { (*Worker)(s).scheduledRetries().noteParked() }
