package natsauth

import (
	"fmt"
	"strings"
	"testing"
)

func testBus(ns string) Bus {
	return Bus{
		Namespace:       ns,
		Events:          Stream{Name: "WEBHOOKS_" + ns, Subjects: []string{"webhooks." + ns + ".>"}},
		Deliveries:      Stream{Name: "WEBHOOKS_DELIVERIES_" + ns, Subjects: []string{"whk.d." + ns + ".>", "whk.r." + ns + ".>"}},
		Attempts:        Stream{Name: "WEBHOOKS_ATTEMPTS_" + ns, Subjects: []string{"whk.log." + ns + ".>"}},
		DeadLetters:     Stream{Name: "WEBHOOKS_DLQ_" + ns, Subjects: []string{"whk.dlq." + ns + ".>"}},
		Bucket:          "webhook-operator-" + ns,
		ReplaySubjects:  []string{"whk.d." + ns + ".>"},
		ReplayKeyPrefix: "replay.",
		OpsEvents:       "webhooks." + ns + ".webhook_operator.>",
		AllEvents:       "webhooks.*.>",
		AllOpsEvents:    "webhooks.*.webhook_operator.>",
	}
}

// The ingress publishes events of every namespace and nothing else: no stream or consumer
// API, no operator subject, no operational event.
func TestIngressPublishesEventsOnly(t *testing.T) {
	p := Permissions(testBus("webhook-operator-system"), Grant{Roles: []Role{RoleIngress}, Inbox: "_INBOX_x"})
	if got := strings.Join(p.Pub.Allow, " "); got != "webhooks.*.>" {
		t.Errorf("the ingress may publish %q, want the events of every namespace only", got)
	}
	if got := strings.Join(p.Pub.Deny, " "); got != "webhooks.*.webhook_operator.>" {
		t.Errorf("the ingress's denials are %q, want every namespace's operational events", got)
	}
	if got := strings.Join(p.Sub.Allow, " "); got != "_INBOX_x.>" {
		t.Errorf("the ingress subscribes to %q, want only its inbox", got)
	}
}

// The data API server reads every stream and publishes every namespace's events, and changes
// nothing else: no stream or consumer change, no message delete, no operator subject.
func TestTheDataAPIReadsEveryStreamAndChangesNothing(t *testing.T) {
	p := Permissions(testBus("webhook-operator-system"), Grant{Roles: []Role{RoleDataAPI}, Inbox: "_INBOX_x"})
	allow := strings.Join(p.Pub.Allow, " ")
	for _, want := range []string{"$JS.API.DIRECT.GET.*", "$JS.API.STREAM.MSG.GET.*", "$JS.API.CONSUMER.INFO.*.*", "webhooks.*.>"} {
		if !strings.Contains(allow, want) {
			t.Errorf("the data API may not publish %s: %s", want, allow)
		}
	}
	for _, bad := range []string{"DELETE", "CREATE", "UPDATE", "PURGE", "NEXT", "whk.", "$JS.ACK", "$KV"} {
		if strings.Contains(allow, bad) {
			t.Errorf("the data API may publish %s: %s", bad, allow)
		}
	}
	if got := strings.Join(p.Pub.Deny, " "); got != "webhooks.*.webhook_operator.>" {
		t.Errorf("the data API's denials are %q, want every namespace's operational events", got)
	}
}

// Operational events are the dispatcher's to publish: a producer, whose events share their
// stream, is denied them.
func TestOperationalEventsAreTheDispatchersOnly(t *testing.T) {
	d := Permissions(testBus("a"), Grant{Roles: []Role{RoleDispatcher}, Inbox: "_INBOX_x"})
	if !strings.Contains(strings.Join(d.Pub.Allow, " "), "webhooks.a.webhook_operator.>") || len(d.Pub.Deny) != 0 {
		t.Errorf("the dispatcher may not publish operational events: %+v", d.Pub)
	}
	p := Permissions(testBus("a"), Grant{Roles: []Role{RoleProducer}, Inbox: "_INBOX_x"})
	if got := strings.Join(p.Pub.Deny, " "); got != "webhooks.a.webhook_operator.>" {
		t.Errorf("a producer's denials are %q, want the operational events", got)
	}
}

func TestPermissionsAreNamespacedAllowLists(t *testing.T) {
	all := []Role{RoleDispatcher, RoleProducer, RoleReplayer}
	forbidden := []string{"STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.NAMES", "STREAM.LIST",
		"STREAM.MSG.DELETE", "CONSUMER.CREATE", "CONSUMER.DURABLE", "CONSUMER.DELETE", "CONSUMER.NAMES", "CONSUMER.LIST", "$JS.API.INFO"}
	for _, r := range append(all, "") {
		g := Grant{Roles: []Role{r}, Sources: []SourceConsumer{{"WEBHOOKS_c", "ep_a_orders"}}, Inbox: "_INBOX_0123456789abcdefABCDEF"}
		if r == "" {
			g.Roles = nil
		}
		p := Permissions(testBus("a"), g)
		if len(p.Pub.Allow) == 0 && len(p.Pub.Deny) == 0 || len(p.Sub.Allow) == 0 && len(p.Sub.Deny) == 0 {
			t.Errorf("%q: a list is absent, which allows everything: %+v", r, p)
		}
		if got := strings.Join(p.Sub.Allow, " "); got != "_INBOX_0123456789abcdefABCDEF.>" {
			t.Errorf("%q subscribes to %q, want only its inbox", r, got)
		}
		for _, s := range p.Pub.Allow {
			if r == RoleDispatcher && s == "$JS.API.STREAM.MSG.DELETE.WEBHOOKS_DELIVERIES_a" {
				continue // the shared lane deletes the parked deliveries it settled
			}
			for _, f := range forbidden {
				if strings.Contains(s, f) {
					t.Errorf("%q may publish %s", r, s)
				}
			}
			if strings.Contains(s, ">") && !strings.HasSuffix(s, ".>") || s == ">" {
				t.Errorf("%q: %s is too wide", r, s)
			}
			// Every subject names namespace a, or is the state of a source that consents.
			if s != "$JS.API.STREAM.INFO.WEBHOOKS_c" && !strings.Contains(s, "_a") && !strings.Contains(s, ".a.") && !strings.Contains(s, "-a") && !strings.HasSuffix(s, ".router_a") && !strings.Contains(s, ".router_a.") {
				t.Errorf("%q may publish %s, which is not namespace a's", r, s)
			}
		}
	}
	if p := Permissions(testBus("a"), Grant{}); len(p.Pub.Deny) != 1 || p.Pub.Deny[0] != ">" || p.Sub.Deny[0] != ">" {
		t.Errorf("no roles and no inbox: %+v, want everything denied", p)
	}
}

// Tenants read deliveries and dead letters through the data API, never on the bus: whatever
// roles the callout gives a tenant (a producer, a replayer, both), their permissions hold no
// read of the namespace's streams (stored-message gets, consumer and stream state of the log,
// the deliveries and the dead letters), only what publishing and writing deliveries need: the
// events stream's state, and the replay keys of the bucket.
func TestTenantRolesReadNoStream(t *testing.T) {
	bus := testBus("a")
	allowed := map[string]bool{
		"$JS.API.STREAM.INFO." + bus.Events.Name:                                                       true, // a publish's stream
		"$JS.API.STREAM.INFO.KV_" + bus.Bucket:                                                         true, // the replay keys' bucket
		"$JS.API.DIRECT.GET.KV_" + bus.Bucket + ".$KV." + bus.Bucket + "." + bus.ReplayKeyPrefix + ">": true,
	}
	for _, roles := range [][]Role{{RoleProducer}, {RoleReplayer}, {RoleProducer, RoleReplayer}} {
		p := Permissions(bus, Grant{Roles: roles, Inbox: "_INBOX_0123456789abcdef"})
		for _, s := range p.Pub.Allow {
			if strings.HasPrefix(s, jsAPI) && !allowed[s] {
				t.Errorf("tenant roles %v may ask JetStream %s", roles, s)
			}
			for _, stream := range []string{bus.Attempts.Name, bus.DeadLetters.Name} {
				if strings.Contains(s, stream) {
					t.Errorf("tenant roles %v may reach %s: %s", roles, stream, s)
				}
			}
		}
	}
}

func TestPermissionsOfEachRole(t *testing.T) {
	has := func(p []string, s string) bool {
		for _, x := range p {
			if x == s {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		role        Role
		want, never []string
	}{
		{RoleDispatcher,
			[]string{"$JS.API.CONSUMER.MSG.NEXT.WEBHOOKS_DELIVERIES_a.*", "$JS.API.CONSUMER.MSG.NEXT.WEBHOOKS_c.ep_a_orders", "$JS.ACK.WEBHOOKS_c.ep_a_orders.>", "$JS.API.STREAM.INFO.WEBHOOKS_c", "$JS.API.CONSUMER.MSG.NEXT.WEBHOOKS_a.*", "$JS.ACK.WEBHOOKS_a.>", "whk.d.a.>", "whk.r.a.>", "whk.log.a.>", "whk.dlq.a.>", "$KV.webhook-operator-a.>", "$JS.API.DIRECT.GET.KV_webhook-operator-a.>",
				"$JS.API.DIRECT.GET.WEBHOOKS_a", "$JS.API.DIRECT.GET.WEBHOOKS_ATTEMPTS_a"},
			[]string{"webhooks.a.>", "$JS.API.CONSUMER.MSG.NEXT.*.ep_a_orders", "$JS.ACK.*.ep_a_orders.>", "$JS.API.CONSUMER.MSG.NEXT.WEBHOOKS_ATTEMPTS_a.*", "$JS.API.CONSUMER.MSG.NEXT.WEBHOOKS_b.*", "$JS.API.CONSUMER.MSG.NEXT.*.*", "$JS.ACK.*.>"}},
		{RoleProducer, []string{"webhooks.a.>", "$JS.API.STREAM.INFO.WEBHOOKS_a"}, []string{"whk.d.a.>", "$KV.webhook-operator-a.>"}},
		{RoleReplayer, []string{"whk.d.a.>", "$KV.webhook-operator-a.replay.>", "$JS.API.DIRECT.GET.KV_webhook-operator-a.$KV.webhook-operator-a.replay.>"},
			[]string{"whk.r.a.>", "$KV.webhook-operator-a.>", "$JS.API.DIRECT.GET.WEBHOOKS_DLQ_a"}},
	} {
		p := Permissions(testBus("a"), Grant{Roles: []Role{tc.role}, Sources: []SourceConsumer{{"WEBHOOKS_c", "ep_a_orders"}}, Inbox: "_INBOX_0123456789abcdef"})
		for _, s := range tc.want {
			if !has(p.Pub.Allow, s) {
				t.Errorf("%s may not publish %s:\n%s", tc.role, s, strings.Join(p.Pub.Allow, "\n"))
			}
		}
		for _, s := range tc.never {
			if has(p.Pub.Allow, s) {
				t.Errorf("%s may publish %s", tc.role, s)
			}
		}
	}
}

// One grant holds source consumers up to a bound on their subjects, cut between endpoints: an
// endpoint gets all its sources or none.
func TestFitSourcesCutsBetweenEndpoints(t *testing.T) {
	var sources []SourceConsumer
	long := strings.Repeat("x", 180)
	for i := 0; len(sources) < 4000; i++ {
		for j := range 3 {
			sources = append(sources, SourceConsumer{Stream: fmt.Sprintf("WEBHOOKS_source-%d", j), Consumer: fmt.Sprintf("ep_a_%s%04d", long, i)})
		}
	}
	fit := FitSources(sources)
	if fit == 0 || fit >= len(sources) || fit%3 != 0 {
		t.Fatalf("%d of %d fit, want a whole number of endpoints (3 each), some but not all", fit, len(sources))
	}
	size := 0
	for _, s := range sourceSubjects(sources[:fit]) {
		size += len(s) + 3
	}
	if size > MaxSourceGrantBytes || fit < 512 {
		t.Errorf("%d sources in %d bytes (bound %d)", fit, size, MaxSourceGrantBytes)
	}
	if got := FitSources(sources[:600]); got != 600 {
		t.Errorf("600 sources with names of 190 bytes: %d fit", got)
	}
}
