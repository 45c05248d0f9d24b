package natsauth

import (
	"slices"
	"strings"
	"testing"
)

// While a namespace's quota sets a publish rate, a producer may not publish its events to the
// bus (only the ingress can hold the rate), nor a replayer write deliveries (test deliveries,
// replays: only the controller's WebhookReplays hold the rate); each keeps the rest, and a
// dispatcher keeps its operational events and its deliveries.
func TestRateLimitedWithholdsEventsAndDeliveriesWrittenByTenants(t *testing.T) {
	bus := testBus("a")
	open := Permissions(bus, Grant{Roles: []Role{RoleProducer}, Inbox: "_INBOX_0123456789abcdef"})
	closed := Permissions(bus, Grant{Roles: []Role{RoleProducer}, Inbox: "_INBOX_0123456789abcdef", RateLimited: true})
	for _, s := range bus.Events.Subjects {
		if !slices.Contains(open.Pub.Allow, s) {
			t.Errorf("a producer may not publish %s without a rate", s)
		}
		if slices.Contains(closed.Pub.Allow, s) {
			t.Errorf("a producer may publish %s while a rate is set", s)
		}
	}
	if !slices.Contains(closed.Pub.Allow, "$JS.API.STREAM.INFO.WEBHOOKS_a") {
		t.Errorf("the producer's other permissions went too: %v", closed.Pub.Allow)
	}
	replayer := Permissions(bus, Grant{Roles: []Role{RoleReplayer}, Inbox: "_INBOX_0123456789abcdef"})
	limited := Permissions(bus, Grant{Roles: []Role{RoleReplayer}, Inbox: "_INBOX_0123456789abcdef", RateLimited: true})
	for _, s := range bus.ReplaySubjects {
		if !slices.Contains(replayer.Pub.Allow, s) {
			t.Errorf("a replayer may not write %s without a rate", s)
		}
		if slices.Contains(limited.Pub.Allow, s) {
			t.Errorf("a replayer may write %s while a rate is set", s)
		}
	}
	for _, s := range limited.Pub.Allow {
		if strings.Contains(s, bus.ReplayKeyPrefix) {
			t.Errorf("a replayer may write replay keys (%s) while a rate is set", s)
		}
	}
	d := Permissions(bus, Grant{Roles: []Role{RoleDispatcher}, Inbox: "_INBOX_0123456789abcdef", RateLimited: true})
	if !slices.Contains(d.Pub.Allow, bus.OpsEvents) || !slices.Contains(d.Pub.Allow, bus.Deliveries.Subjects[0]) {
		t.Errorf("the dispatcher may not publish operational events or deliveries: %v", d.Pub.Allow)
	}
}
