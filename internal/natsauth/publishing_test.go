package natsauth

import (
	"slices"
	"testing"
)

// While a namespace's quota sets a publish rate, a producer may not publish its events to the
// bus (only the ingress can hold the rate); it keeps the rest, and a dispatcher keeps its
// operational events.
func TestNoEventPublishWithholdsOnlyTheProducersEvents(t *testing.T) {
	bus := testBus("a")
	open := Permissions(bus, Grant{Roles: []Role{RoleProducer, RoleReader}, Inbox: "_INBOX_0123456789abcdef"})
	closed := Permissions(bus, Grant{Roles: []Role{RoleProducer, RoleReader}, Inbox: "_INBOX_0123456789abcdef", NoEventPublish: true})
	for _, s := range bus.Events.Subjects {
		if !slices.Contains(open.Pub.Allow, s) {
			t.Errorf("a producer may not publish %s without a rate", s)
		}
		if slices.Contains(closed.Pub.Allow, s) {
			t.Errorf("a producer may publish %s while a rate is set", s)
		}
	}
	if !slices.Contains(closed.Pub.Allow, "$JS.API.DIRECT.GET.WEBHOOKS_DLQ_a") || len(closed.Pub.Allow) == 0 {
		t.Errorf("the reader's permissions went too: %v", closed.Pub.Allow)
	}
	d := Permissions(bus, Grant{Roles: []Role{RoleDispatcher}, Inbox: "_INBOX_0123456789abcdef", NoEventPublish: true})
	if !slices.Contains(d.Pub.Allow, bus.OpsEvents) {
		t.Errorf("the dispatcher may not publish operational events: %v", d.Pub.Allow)
	}
}
