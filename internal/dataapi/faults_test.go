package dataapi

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// NATS down: every resource answers 503 with the reason and a retry hint, through the
// aggregator; when NATS is back the same server answers again, without a restart.
func TestNATSDownIs503WithAReasonAndRecovers(t *testing.T) {
	tn := newTenant(t)
	tn.seed()
	viewer := tn.user("viewer", []string{"get", "list"}, datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters)
	before, err := list(viewer, tn.ns, "limit", "10")
	if err != nil || len(before.Items) != 10 {
		t.Fatalf("before: %v, %d items", err, len(before.Items))
	}

	world.nats.Stop()
	restarted := false
	defer func() {
		if !restarted {
			_ = world.nats.Start()
		}
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return !world.nc.IsConnected() }, "the server's connection to notice NATS is down")
	// The answer comes at once, with its reason: no Retry-After, which client-go would retry
	// by itself ten times before the caller saw anything (each call has its own bound).
	request := func(kind, name string, kv ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r := viewer.Get().Namespace(tn.ns).Resource(kind).MaxRetries(0)
		if name != "" {
			r = r.Name(name)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			r = r.Param(kv[i], kv[i+1])
		}
		return r.Do(ctx).Error()
	}
	for what, err := range map[string]error{
		"list deliveries":    request(datav1alpha1.ResourceDeliveries, "", "limit", "10"),
		"get a delivery":     request(datav1alpha1.ResourceDeliveries, before.Items[0].Name),
		"list dead letters":  request(datav1alpha1.ResourceDeadLetters, ""),
		"continue of a list": request(datav1alpha1.ResourceDeliveries, "", "limit", "10", "continue", before.Continue),
	} {
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "NATS is unreachable") {
			t.Errorf("%s with NATS down: %v; want 503 saying NATS is unreachable", what, err)
			continue
		}
		if _, ok := apierrors.SuggestsClientDelay(err); ok {
			t.Errorf("%s with NATS down: a Retry-After, which clients retry silently (%v)", what, err)
		}
	}

	if err := world.nats.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	var after *datav1alpha1.WebhookDeliveryList
	testenv.Eventually(t, 30*time.Second, func() error {
		after, err = list(viewer, tn.ns, "limit", "10")
		return err
	}, "the same server to answer again once NATS is back")
	if len(after.Items) != 10 || after.Items[0].Name != before.Items[0].Name {
		t.Errorf("after NATS came back: %d items, first %s; want the same page as before (first %s)", len(after.Items), after.Items[0].Name, before.Items[0].Name)
	}
}

// At most MaxConcurrentReads requests read the streams at once; one that waits its whole time
// for a turn is a 429 that says why, and a turn freed is taken by the next.
func TestReadsAreBoundedAndAWaitThatRunsOutIsA429(t *testing.T) {
	b := &Bus{}
	var releases []func()
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	for range MaxConcurrentReads {
		r, err := b.read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.read(ctx); !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "waited its whole time for a turn") {
		t.Fatalf("a read beyond the bound: %v; want 429", err)
	}
	releases[0]()
	releases = releases[1:]
	r, err := b.read(context.Background())
	if err != nil {
		t.Fatalf("a read after a turn was freed: %v", err)
	}
	releases = append(releases, r)
}
