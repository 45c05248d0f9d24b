// Package leases elects, for each endpoint, the one replica of a dispatcher that may do what
// only one may do (Partitions): deliver a single-active endpoint (PerKey or rate-limited),
// write its status, and (the holder of partition 0) fold the delivery log into counts; and it
// divides what an endpoint may do across replicas at once (Share: its maxInFlight) among the
// partitions, so the replicas' parts never add up to more.
package leases

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/health/follow"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Partitions spread what only one replica of a dispatcher may do for an endpoint over the
// replicas: deliver it when it is single-active (PerKey: no two replicas may hold one key;
// rate-limited: one token bucket is the rate) and write its status; the holder of partition 0
// also folds the delivery log into every endpoint's counts (one reader of the log: a consumer
// filtered by the subjects of one partition's endpoints would cost the server more than one
// reading them all). The endpoints fall into N partitions by a hash of their name, each
// with its own lease in the bucket; every live replica renews a member key, and partition p
// belongs to the (p mod R)th of the R live replicas in name order, so each holds N/R of them.
// A replica takes a partition when the lease is free or expired, renews it every ttl/3, and
// lets go of a partition that belongs to another replica (after stopping its work on it, and
// once the work it started under it has ended: Run's busy), so partitions move when replicas
// come and go, and at most one replica holds one at a time: a holder that cannot renew gives
// up before its lease expires (judged on the server's timestamp of its last renewal).
type Partitions struct {
	js        jetstream.JetStream
	kv        jetstream.KeyValue
	dedicated string
	identity  string
	n         int
	expected  int
	ttl       time.Duration
	log       logr.Logger
	held      []atomic.Bool
	// draining are the partitions let go of whose lease is kept (renewed) until the work
	// started under them has ended (round's goroutine only).
	draining []bool

	// rounded is closed once the first round ended: the replica knows what it holds.
	rounded   chan struct{}
	roundOnce sync.Once

	mu      sync.Mutex
	members map[string]time.Time // identity -> server time of its last renewal
	rev     []uint64             // revision of each held lease
}

// NewPartitions returns n partitions of the dispatcher of dedicated (empty: the namespace's
// shared one) in bucket kv, taken as identity; a holder silent for ttl loses its leases. It
// expects the dispatcher to have replicas replicas: starting, it waits a little for them to
// join before taking partitions.
func NewPartitions(js jetstream.JetStream, kv jetstream.KeyValue, dedicated, identity string, n, replicas int, ttl time.Duration, log logr.Logger) *Partitions {
	n = max(n, 1)
	return &Partitions{js: js, kv: kv, dedicated: dedicated, identity: identity, n: n, expected: replicas, ttl: ttl, log: log,
		held: make([]atomic.Bool, n), draining: make([]bool, n), members: map[string]time.Time{}, rev: make([]uint64, n), rounded: make(chan struct{})}
}

// Rounded is closed once Run's first round ended (or Run returned): until then the replica
// holds nothing because it has not taken its partitions yet, not because others hold them.
func (ps *Partitions) Rounded() <-chan struct{} { return ps.rounded }

// PartitionOf is the partition of endpoint ep among n.
func PartitionOf(ep string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(ep))
	return int(h.Sum32() % uint32(n))
}

// Count is the number of partitions.
func (ps *Partitions) Count() int { return ps.n }

// Of is the partition of endpoint ep.
func (ps *Partitions) Of(ep string) int { return PartitionOf(ep, ps.n) }

// Holds reports, without locks, whether this replica holds the partition of endpoint ep.
func (ps *Partitions) Holds(ep string) bool { return ps.held[ps.Of(ep)].Load() }

// Held reports whether this replica holds partition p.
func (ps *Partitions) Held(p int) bool { return ps.held[p].Load() }

// Share is the part of limit (an endpoint's maxInFlight) that this replica may use for
// endpoint ep now: ShareOf the partitions it holds.
func (ps *Partitions) Share(ep string, limit int) int { return ShareOf(ep, ps.n, limit, ps.Held) }

// Covers reports whether partition p holds a part of endpoint ep's limit (ShareOf).
func (ps *Partitions) Covers(ep string, limit, p int) bool {
	return ShareOf(ep, ps.n, limit, func(q int) bool { return q == p }) > 0
}

// ShareOf divides limit, what an endpoint may do across all replicas at once, among n
// partitions, from the endpoint's own (PartitionOf) on: each gets limit/n, and the first
// limit%n one more (a limit below n lives on the endpoint's partition and those after it).
// It returns the sum of the parts of the partitions held says are held. Each partition has one
// holder at a time, so the holders' shares never add up to more than limit; with partitions
// spread evenly over R replicas, each has about limit/R.
func ShareOf(ep string, n, limit int, held func(p int) bool) int {
	n = max(n, 1)
	if limit <= 0 {
		return 0
	}
	first := PartitionOf(ep, n)
	base, extra := limit/n, limit%n
	share := 0
	for k := range n {
		part := base
		if k < extra {
			part++
		}
		if part == 0 {
			break
		}
		if held((first + k) % n) {
			share += part
		}
	}
	return share
}

// Run keeps this replica a member and its share of the partitions held until ctx ends, then
// lets go of everything at once (the next holders need not wait for expiry; the caller ends
// ctx once its work has ended). onChange is called whenever a partition is taken or let go,
// in the latter case before the lease is deleted, so no new work starts under it while the
// lease is still this replica's; busy says whether work started under a partition let go is
// still running: its lease is kept, and renewed, until it is not, so the next holder never
// starts while it runs.
func (ps *Partitions) Run(ctx context.Context, onChange func(p int, held bool), busy func(p int) bool) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer ps.roundOnce.Do(func() { close(ps.rounded) })
	synced := make(chan struct{})
	changed := make(chan struct{}, 1)
	go ps.watchMembers(wctx, synced, changed)
	// Join first and learn who else is there before taking anything, so replicas starting
	// together do not each take every partition and hand most back a moment later.
	rctx, rcancel := context.WithTimeout(ctx, ps.ttl/3)
	_, _ = ps.kv.Put(rctx, streams.MemberKey(ps.dedicated, ps.identity), []byte(ps.identity))
	rcancel()
	select {
	case <-synced:
	case <-time.After(ps.ttl / 3):
	case <-ctx.Done():
	}
	// Replicas of one Deployment start about together: give the others a moment to join.
	for deadline := time.Now().Add(ps.ttl / 3); len(ps.live()) < ps.expected && time.Now().Before(deadline) && ctx.Err() == nil; {
		sleepFor(ctx, 100*time.Millisecond)
	}
	tick := time.NewTicker(ps.ttl / 3)
	defer tick.Stop()
	// After the members changed, a few rounds come sooner: the replica a partition moves to
	// takes it soon after its holder let go, not a tick later.
	var soon <-chan time.Time
	quick := 0
	for {
		ps.round(ctx, onChange, busy)
		ps.roundOnce.Do(func() { close(ps.rounded) })
		select {
		case <-ctx.Done():
			ps.leave(onChange)
			return
		case <-tick.C:
		case <-changed:
			quick = 3
			soon = time.After(rebalanceRound)
			continue
		case <-soon:
		}
		if quick > 0 {
			quick--
			soon = time.After(rebalanceRound)
		} else {
			soon = nil
		}
	}
}

// rebalanceRound is how soon the rounds after a change of members come.
const rebalanceRound = 200 * time.Millisecond

// round renews membership, then takes, renews or lets go of each partition: one that
// belongs to another replica now is let go of at once, its lease deleted once busy says the
// work started under it ended (renewed meanwhile).
func (ps *Partitions) round(ctx context.Context, onChange func(p int, held bool), busy func(p int) bool) {
	rctx, cancel := context.WithTimeout(ctx, ps.ttl/3)
	defer cancel()
	if _, err := ps.kv.Put(rctx, streams.MemberKey(ps.dedicated, ps.identity), []byte(ps.identity)); err != nil {
		// NATS unreachable: a holder that cannot renew gives up before others may take over.
		for p := range ps.n {
			ps.set(p, false, onChange)
			ps.draining[p] = false
		}
		return
	}
	members := ps.live()
	for p := range ps.n {
		mine := members[p%len(members)] == ps.identity
		switch {
		case mine:
			ps.draining[p] = false
			ps.set(p, ps.acquire(rctx, p), onChange)
		case ps.held[p].Load() || ps.draining[p]:
			ps.set(p, false, onChange)
			ps.draining[p] = busy(p) && ps.acquire(rctx, p)
			if !ps.draining[p] {
				ps.release(p)
			}
		}
	}
}

// live are the members seen renewing within ttl, this replica included, in name order.
func (ps *Partitions) live() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := []string{ps.identity}
	for id, at := range ps.members {
		if id != ps.identity && time.Since(at) < ps.ttl {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// membersPoll is how often watchMembers reads the member keys.
const membersPoll = 250 * time.Millisecond

// watchMembers follows the member keys until ctx ends (follow.Keys: polled direct gets, no
// consumer); synced is closed once the members there were at the start are known.
func (ps *Partitions) watchMembers(ctx context.Context, synced, changed chan struct{}) {
	var once sync.Once
	prefix := strings.TrimSuffix(streams.MembersFilter(ps.dedicated), ">")
	for ctx.Err() == nil {
		err := follow.Keys(ctx, ps.js, ps.kv.Bucket(), prefix, membersPoll,
			func(id string, m streamread.Msg, deleted bool) {
				ps.mu.Lock()
				_, known := ps.members[id]
				if deleted {
					delete(ps.members, id)
				} else {
					ps.members[id] = m.Time
				}
				ps.mu.Unlock()
				if known == deleted && id != ps.identity {
					select {
					case changed <- struct{}{}:
					default:
					}
				}
			}, func() { once.Do(func() { close(synced) }) })
		if err != nil {
			sleepFor(ctx, time.Second)
		}
	}
}

// acquire takes or renews partition p's lease; false when another replica holds it.
func (ps *Partitions) acquire(ctx context.Context, p int) bool {
	key := streams.LeaseKey(ps.dedicated, p)
	if last := ps.rev[p]; last != 0 {
		// Renewing a lease this replica wrote last: one write, on condition that nobody wrote
		// the key since (taken over, let go, deleted); when it fails, the lease is read.
		if rev, err := ps.kv.Update(ctx, key, []byte(ps.identity), last); err == nil {
			ps.rev[p] = rev
			return true
		}
		ps.rev[p] = 0
	}
	e, err := ps.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		rev, err := ps.kv.Create(ctx, key, []byte(ps.identity))
		if err == nil {
			ps.rev[p] = rev
		}
		return err == nil
	case err != nil:
		return false
	}
	if string(e.Value()) != ps.identity && time.Since(e.Created()) <= ps.ttl {
		return false
	}
	rev, err := ps.kv.Update(ctx, key, []byte(ps.identity), e.Revision())
	if err == nil {
		ps.rev[p] = rev
	}
	return err == nil
}

// release deletes partition p's lease (its work stopped: set) if it is still this replica's,
// so its next holder takes it at once.
func (ps *Partitions) release(p int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if e, err := ps.kv.Get(ctx, streams.LeaseKey(ps.dedicated, p)); err == nil && string(e.Value()) == ps.identity {
		_ = ps.kv.Delete(ctx, streams.LeaseKey(ps.dedicated, p), jetstream.LastRevision(e.Revision()))
	}
}

// leave lets go of every partition and of the membership.
func (ps *Partitions) leave(onChange func(p int, held bool)) {
	for p := range ps.n {
		if ps.held[p].Load() || ps.draining[p] {
			ps.set(p, false, onChange)
			ps.draining[p] = false
			ps.release(p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = ps.kv.Delete(ctx, streams.MemberKey(ps.dedicated, ps.identity))
}

func (ps *Partitions) set(p int, v bool, onChange func(p int, held bool)) {
	if ps.held[p].Load() == v {
		return
	}
	if v {
		ps.held[p].Store(true)
		ps.log.Info("partition", "partition", p, "held", true)
		onChange(p, true)
		return
	}
	// Workers see the change at once; onChange stops the rest of the work before the lease
	// is let go, so nobody else can take it meanwhile.
	ps.held[p].Store(false)
	ps.log.Info("partition", "partition", p, "held", false)
	onChange(p, false)
}

func sleepFor(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
