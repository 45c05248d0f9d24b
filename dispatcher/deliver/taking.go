package deliver

import (
	"context"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/intake"
)

// taking is a worker as the shared lane's intake sees it (intake.Taker).
type taking Worker

var _ intake.Taker = (*taking)(nil)

// Taker is the worker as the shared lane's intake routes it.
func (w *Worker) Taker() intake.Taker { return (*taking)(w) }

func (t *taking) Name() string             { return t.name }
func (t *taking) Config() *endpoint.Config { return t.cfg.Load() }
func (t *taking) Share() int64             { return t.shareCap.Load() }
func (t *taking) Reserve() bool            { return (*Worker)(t).takesShared() }
func (t *taking) Take(v *intake.View)      { (*Worker)(t).receive(viewed(v)) }
func (t *taking) Returned()                { t.sharedOut.Add(-1) }
func (t *taking) Parked(n int64)           { t.park.setKnown(n) }
func (t *taking) Changed()                 { (*Worker)(t).dirty() }

func (t *taking) Park(ctx context.Context, c *endpoint.Config, v *intake.View) {
	(*Worker)(t).parkView(ctx, c, viewed(v))
}
