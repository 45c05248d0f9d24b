package faults

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// producer publishes events as a producer application would: on webhooks.<ns>.<type> with
// Nats-Msg-Id set to the event id, retrying a publish until JetStream acknowledges it (the
// server de-duplicates a retried one), across server restarts. On the stack it publishes in a
// namespace as a Pod would: as a ServiceAccount allowed to (localstack.Stack.Producer), through
// the auth callout, one connection per namespace.
type producer struct {
	// connect makes the connection to namespace ns.
	connect func(ctx context.Context, ns string) (*nats.Conn, error)

	mu    sync.Mutex
	conns map[string]*nats.Conn
	jss   map[string]jetstream.JetStream
	// published: the start of the publish call that JetStream acknowledged, per event id.
	published map[string]time.Time
	order     []string
	retries   atomic.Int64
}

func newProducer(connect func(ctx context.Context, ns string) (*nats.Conn, error)) *producer {
	return &producer{connect: connect, conns: map[string]*nats.Conn{}, jss: map[string]jetstream.JetStream{}, published: map[string]time.Time{}}
}

// reconnecting are the options of a producer that lives through server restarts.
func reconnecting(opts ...nats.Option) []nats.Option {
	return append(opts, nats.Name("faults producer"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
}

// js is the producer's connection to namespace ns, made on first use.
func (p *producer) js(ctx context.Context, ns string) (jetstream.JetStream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if js := p.jss[ns]; js != nil {
		return js, nil
	}
	nc, err := p.connect(ctx, ns)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.conns[ns], p.jss[ns] = nc, js
	return js, nil
}

func (p *producer) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, nc := range p.conns {
		nc.Close()
	}
}

// startProducer connects a producer to the tenant's NATS as the tenant's producer
// ServiceAccount, for the test, closed when it ends, with the scenario's context (15 minutes
// at most).
func startProducer(t *testing.T, tn *tenant) (*producer, context.Context) {
	t.Helper()
	return startProducerWith(t, func(ctx context.Context, ns string) (*nats.Conn, error) {
		opts, err := tn.st.Producer(ctx, ns)
		if err != nil {
			return nil, err
		}
		return nats.Connect(tn.st.NATSURL, reconnecting(opts...)...)
	})
}

// startProducerAt is startProducer connected, as it is, to the servers at url (a leaf node,
// whose own connection to the cluster says whom it publishes for).
func startProducerAt(t *testing.T, url string) (*producer, context.Context) {
	t.Helper()
	return startProducerWith(t, func(context.Context, string) (*nats.Conn, error) {
		return nats.Connect(url, reconnecting()...)
	})
}

func startProducerWith(t *testing.T, connect func(ctx context.Context, ns string) (*nats.Conn, error)) (*producer, context.Context) {
	t.Helper()
	prod := newProducer(connect)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(func() {
		cancel()
		prod.close()
	})
	return prod, ctx
}

// event names one event to publish.
type event struct {
	id, typ string
}

// publish publishes the events in order at about rate per second (0: as fast as it can) with
// a few publishers at once, and returns when all are acknowledged or ctx ends.
func (p *producer) publish(ctx context.Context, ns string, events []event, rate int) error {
	const publishers = 8
	work := make(chan event)
	errs := make(chan error, publishers)
	var wg sync.WaitGroup
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range work {
				if err := p.publishOne(ctx, ns, ev); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var interval time.Duration
	if rate > 0 {
		interval = time.Second / time.Duration(rate)
	}
	start := time.Now()
	var err error
feed:
	for i, ev := range events {
		if interval > 0 {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				time.Sleep(wait) // pacing, not synchronisation
			}
		}
		select {
		case work <- ev:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// publishOne publishes one event until it is acknowledged.
func (p *producer) publishOne(ctx context.Context, ns string, ev event) error {
	js, err := p.js(ctx, ns)
	if err != nil {
		return err
	}
	subject := streams.DefaultNames().For(ns).EventSubject(ev.typ)
	data := fmt.Appendf(nil, `{"id":%q,"type":%q,"note":"published by the fault suite"}`, ev.id, ev.typ)
	for {
		msg := nats.NewMsg(subject)
		msg.Header.Set(records.HeaderMsgID, ev.id)
		msg.Header.Set(records.HeaderContentType, "application/json")
		msg.Data = data
		began := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := js.PublishMsg(pctx, msg)
		cancel()
		if err == nil {
			p.mu.Lock()
			if _, ok := p.published[ev.id]; !ok {
				p.published[ev.id] = began
				p.order = append(p.order, ev.id)
			}
			p.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("publishing %s: %w", ev.id, err)
		}
		p.retries.Add(1)
		select {
		case <-ctx.Done():
			return fmt.Errorf("publishing %s: %w", ev.id, ctx.Err())
		case <-time.After(100 * time.Millisecond): // back off before the retry
		}
	}
}

// publishedAt copies the acknowledged events and when each was published.
func (p *producer) publishedAt() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(p.published))
	for id, t := range p.published {
		out[id] = t
	}
	return out
}

// events names n events id-prefix-000001... of type typ.
func events(prefix, typ string, n int) []event {
	out := make([]event, n)
	for i := range out {
		out[i] = event{id: fmt.Sprintf("%s-%06d", prefix, i+1), typ: typ}
	}
	return out
}
