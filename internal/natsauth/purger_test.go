package natsauth_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A purger may read and delete its namespace's dead letters and publish the record of a purge,
// nothing else: no stream purge, no other operational event, no ordinary event, nothing of
// another namespace.
func TestPurgerPermissions(t *testing.T) {
	p := natsauth.Permissions(busFor("a"), natsauth.Grant{Roles: []natsauth.Role{natsauth.RolePurger}, Inbox: "_INBOX_0123456789abcdef"})
	want := []string{
		"$JS.API.STREAM.INFO.WEBHOOKS_DLQ_a",
		"$JS.API.DIRECT.GET.WEBHOOKS_DLQ_a", "$JS.API.DIRECT.GET.WEBHOOKS_DLQ_a.>", "$JS.API.STREAM.MSG.GET.WEBHOOKS_DLQ_a",
		"$JS.API.STREAM.MSG.DELETE.WEBHOOKS_DLQ_a",
		"webhooks.a.webhook_operator.dlq.purged",
	}
	got := slices.Clone(p.Pub.Allow)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(p.Pub.Deny) != 0 {
		t.Errorf("a purger may publish\n %s\ndenied %v; want\n %s", strings.Join(got, "\n "), p.Pub.Deny, strings.Join(want, "\n "))
	}
	if got := strings.Join(p.Sub.Allow, " "); got != "_INBOX_0123456789abcdef.>" {
		t.Errorf("a purger subscribes to %q", got)
	}
}

// Purging is asked for (PurgeUser), by the data API server alone (tenants purge through the
// data API, never on the bus), and decided by RBAC: delete on webhookdeliveries in the
// namespace. A connection that does not ask never holds it, whatever RBAC allows.
func TestPurgeIsAskedForAndDecidedByRBAC(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "viewer", false, rule(natsauth.ResourceDeliveries, "get", "list"))
	serviceAccount(t, "a", "editor", false, rule(natsauth.ResourceDeliveries, "get", "list", "create", "delete"), rule(natsauth.ResourceEvents, "create"))
	serviceAccount(t, "a", "data-api", false, rule(natsauth.ResourceDeliveries, "delete"))
	w.svc.Kube.DataAPI = "a/data-api"
	ctx := context.Background()
	a, b := busFor("a"), busFor("b")
	for _, bus := range []natsauth.Bus{a, b} {
		for i := 0; i < 3; i++ {
			if _, err := w.admin.Publish(ctx, strings.TrimSuffix(bus.DeadLetters.Subjects[0], ">")+"orders.whdl_"+string(rune('x'+i)), []byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A tenant asking to purge is refused, whatever its RBAC, and told where purging is.
	for _, sa := range []string{"viewer", "editor"} {
		if _, err := w.connect(token(t, "a", sa, natsauth.DefaultAudience), natsauth.PurgeUser("a")); err == nil {
			t.Fatalf("a's %s connected to purge", sa)
		}
		if !w.log.has("bus connection refused", "system:serviceaccount:a:"+sa+" may not purge dead letters on the bus: only the data API server does") {
			t.Fatalf("%s's refusal not logged:\n%s", sa, w.log)
		}
	}
	// The editor's ordinary connection cannot delete.
	plain := w.mustConnect(token(t, "a", "editor", natsauth.DefaultAudience), "a")
	sctx, cancel := shortCtx()
	if _, err := plain.nc.RequestWithContext(sctx, "$JS.API.STREAM.MSG.DELETE."+a.DeadLetters.Name, []byte(`{"seq":1}`)); err == nil {
		t.Error("an editor's ordinary connection deleted a dead letter")
	}
	cancel()

	// The data API server's purging connection: the purger role alone.
	c := w.mustConnect(token(t, "a", "data-api", natsauth.DefaultAudience), natsauth.PurgeUser("a"))
	if !w.log.has("bus connection authorized", "system:serviceaccount:a:data-api", `"purger"`) || w.log.has("bus connection authorized", `"purger"`, `"producer"`) {
		t.Errorf("the purger's grant:\n%s", w.log)
	}
	st, err := c.js.Stream(ctx, a.DeadLetters.Name)
	if err != nil {
		t.Fatalf("the purger reads its dead-letter stream: %v", err)
	}
	if err := st.DeleteMsg(ctx, 2); err != nil {
		t.Fatalf("the purger deletes a dead letter: %v", err)
	}
	if _, err := c.js.Publish(ctx, a.PurgeEvents, []byte("{}")); err != nil {
		t.Fatalf("the purger records its purge: %v", err)
	}
	refused := []string{
		"$JS.API.STREAM.MSG.DELETE." + b.DeadLetters.Name, "$JS.API.STREAM.PURGE." + a.DeadLetters.Name, "$JS.API.STREAM.DELETE." + a.DeadLetters.Name,
		"$JS.API.STREAM.MSG.DELETE." + a.Events.Name, "$JS.API.STREAM.MSG.DELETE." + a.Attempts.Name, "$JS.API.DIRECT.GET." + b.DeadLetters.Name,
		"webhooks.a.order.created", "webhooks.a.webhook_operator.endpoint.disabled", "webhooks.b.webhook_operator.dlq.purged",
	}
	for _, s := range refused {
		if err := c.nc.PublishRequest(s, c.nc.NewRespInbox(), []byte(`{"seq":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		v := c.violations()
		for _, s := range refused {
			if !strings.Contains(v, `Publish to "`+s+`"`) {
				return fmt.Errorf("no permissions violation for %s; got:\n%s", s, v)
			}
		}
		return nil
	}, "")
	if n := w.messages(a.DeadLetters.Name); n != 2 {
		t.Errorf("a's dead-letter stream holds %d, want 2", n)
	}
	if n := w.messages(b.DeadLetters.Name); n != 3 {
		t.Errorf("b's dead-letter stream holds %d, want its 3", n)
	}
	if n := w.messages(a.Events.Name); n != 1 {
		t.Errorf("a's events stream holds %d, want the purge's record alone", n)
	}
	// RBAC in a is nothing in b.
	if _, err := w.connect(token(t, "a", "data-api", natsauth.DefaultAudience), natsauth.PurgeUser("b")); err == nil {
		t.Fatal("the data API connected to purge in b, where RBAC does not allow it")
	}
	if !w.log.has("bus connection refused", "system:serviceaccount:a:data-api may not purge dead letters in namespace b: RBAC grants no delete") {
		t.Fatalf("refusal in b not logged:\n%s", w.log)
	}
}
