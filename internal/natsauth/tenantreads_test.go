package natsauth_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Tenants read deliveries and dead letters through the data API: the callout gives no tenant
// a read of its namespace's streams. Someone RBAC lets only read (get, list on
// webhookdeliveries) has nothing to do on the bus and is refused; an editor (get, list,
// create, delete on webhookdeliveries, create on webhookevents) publishes events and writes
// deliveries, and every stored-message get, stream and consumer state of the delivery log,
// the deliveries and the dead letters is a permission violation on its connection.
func TestTenantsHoldNoReadOfTheStreams(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "viewer", false, rule(natsauth.ResourceDeliveries, "get", "list"))
	serviceAccount(t, "a", "editor", false, rule(natsauth.ResourceDeliveries, "get", "list", "create", "delete"), rule(natsauth.ResourceEvents, "create"))
	ctx := context.Background()
	a := busFor("a")

	if _, err := w.connect(token(t, "a", "viewer", natsauth.DefaultAudience), "a"); err == nil {
		t.Fatal("a reader connected to the bus")
	}
	if !w.log.has("bus connection refused", "system:serviceaccount:a:viewer may do nothing with webhooks on the bus in namespace a") {
		t.Fatalf("the reader's refusal not logged:\n%s", w.log)
	}

	e := w.mustConnect(token(t, "a", "editor", natsauth.DefaultAudience), "a")
	if !w.log.has("bus connection authorized", "system:serviceaccount:a:editor", `"producer"`, `"replayer"`) || w.log.has("bus connection authorized", "a:editor", `"reader"`) {
		t.Errorf("the editor's grant:\n%s", w.log)
	}
	// What it still does: publish an event, write a delivery.
	if _, err := e.js.Publish(ctx, "webhooks.a.order.created", []byte("{}")); err != nil {
		t.Fatalf("the editor publishes an event: %v", err)
	}
	if _, err := e.js.Publish(ctx, strings.TrimSuffix(a.ReplaySubjects[0], ">")+"orders", []byte("{}")); err != nil {
		t.Fatalf("the editor writes a delivery: %v", err)
	}
	var refused []string
	for _, st := range []string{a.Attempts.Name, a.Deliveries.Name, a.DeadLetters.Name, a.Events.Name} {
		refused = append(refused, "$JS.API.DIRECT.GET."+st, "$JS.API.DIRECT.GET."+st+".whk.x", "$JS.API.STREAM.MSG.GET."+st,
			"$JS.API.CONSUMER.INFO."+st+".ep_a_orders")
		if st != a.Events.Name {
			refused = append(refused, "$JS.API.STREAM.INFO."+st)
		}
	}
	for _, s := range refused {
		if err := e.nc.PublishRequest(s, e.nc.NewRespInbox(), []byte(`{"seq":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		v := e.violations()
		for _, s := range refused {
			if !strings.Contains(v, `Publish to "`+s+`"`) {
				return fmt.Errorf("no permissions violation for %s; got:\n%s", s, v)
			}
		}
		return nil
	}, "")
}
