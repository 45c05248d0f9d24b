package report

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// countingJS counts the consumer and stream lookups made through it.
type countingJS struct {
	jetstream.JetStream
	consumers, streams atomic.Int64
}

func (c *countingJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	c.consumers.Add(1)
	return c.JetStream.Consumer(ctx, stream, name)
}

func (c *countingJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	c.streams.Add(1)
	return c.JetStream.Stream(ctx, name)
}

// An idle shared-lane endpoint with nothing draining has no consumer and no own-lane retry to
// read: its pending count is what the intake holds for it and its scheduled retries, read with
// one request on a stream handle looked up once (thousands of idle endpoints are looked at as
// a dispatcher starts, and hourly). While its own consumers drain, they are read as well.
func TestAnIdleSharedLaneEndpointsPendingIsOneRead(t *testing.T) {
	ctx := context.Background()
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	const ns = "shop"
	set := opconfig.Default().Streams.For(ns)
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	names := streams.DefaultNames().For(ns)
	if _, err := js.Publish(ctx, names.ScheduleSubject("orders", "whdl_1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	cjs := &countingJS{JetStream: js}
	s := NewStatusWriter(StatusConfig{JS: cjs, Names: names, Waiting: func(string) int64 { return 2 }})
	for range 2 {
		got, err := s.pending(ctx, "orders", streams.LaneShared, false)
		if err != nil {
			t.Fatal(err)
		}
		if got != 3 {
			t.Errorf("pending %d, want 3 (one scheduled retry, two waiting in the intake)", got)
		}
	}
	if c, st := cjs.consumers.Load(), cjs.streams.Load(); c != 0 || st != 1 {
		t.Errorf("two reads looked up %d consumers and the stream %d times, want none and once", c, st)
	}
	if _, err := s.pending(ctx, "orders", streams.LaneShared, true); err != nil {
		t.Fatal(err)
	}
	if c := cjs.consumers.Load(); c != 2 {
		t.Errorf("a draining endpoint's read looked up %d consumers, want its own two", c)
	}
}
