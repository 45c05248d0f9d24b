package deliver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// The decisions are tables: what each returns for what it is given, without NATS.

func TestRoute(t *testing.T) {
	run := &endpoint.Config{Name: "ep"}
	perKey := &endpoint.Config{Name: "ep", PerKey: true}
	deleting := &endpoint.Config{Name: "ep", Deleting: true}
	for _, tc := range []struct {
		name       string
		v          view
		fromEvents bool
		scheduled  bool
		want       step
		delay      time.Duration
	}{
		{name: "no configuration: handed back", v: view{}, want: stepRelease},
		{name: "a delivery of a running endpoint is taken", v: view{c: run, mode: modeRun}, want: stepTake},
		{name: "an event is admitted first", v: view{c: run, mode: modeRun}, fromEvents: true, want: stepAdmit},
		{name: "a delivery of a paused endpoint comes back in a second", v: view{c: run, mode: modePaused}, want: stepRelease, delay: time.Second},
		{name: "a PerKey delivery of a paused endpoint stays in order here", v: view{c: perKey, mode: modePaused}, want: stepTake},
		{name: "a deleting endpoint's delivery is taken to be dead-lettered", v: view{c: deleting, mode: modeRun}, want: stepTake},
		{name: "a scheduled retry before the deletion is seen: back, never sent early", v: view{c: run, mode: modeRun}, scheduled: true, want: stepRelease, delay: time.Second},
		{name: "a scheduled retry of a deleting endpoint is dead-lettered", v: view{c: deleting, mode: modeRun}, scheduled: true, want: stepTake},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, delay := route(tc.v, tc.fromEvents, tc.scheduled)
			if got != tc.want || delay != tc.delay {
				t.Fatalf("route = %v, %v; want %v, %v", got, delay, tc.want, tc.delay)
			}
		})
	}
	for _, tc := range []struct {
		name                      string
		v                         view
		afterDeletion, endangered bool
		want                      step
		delay                     time.Duration
	}{
		{name: "taken", v: view{c: run, mode: modeRun}, want: stepTake},
		{name: "held while holding", v: view{c: run, mode: modePaused, hold: true}, want: stepHold},
		{name: "a PerKey endpoint holds until what it held came back", v: view{c: perKey, mode: modeRun, heldBefore: true}, want: stepHold},
		{name: "the lease moved: the holder gets it", v: view{c: perKey, mode: modeRun, leaseMoved: true}, want: stepRelease},
		{name: "endangered by the stream's limits: held", v: view{c: run, mode: modeRun}, endangered: true, want: stepHold},
		{name: "paused: back in a second", v: view{c: run, mode: modePaused}, want: stepRelease, delay: time.Second},
		{name: "stored after the deletion: not the endpoint's", v: view{c: deleting, mode: modeRun}, afterDeletion: true, want: stepAck},
		{name: "stored before the deletion: dead-lettered", v: view{c: deleting, mode: modeRun, hold: true}, want: stepTake},
	} {
		t.Run("admitted/"+tc.name, func(t *testing.T) {
			got, delay := routeAdmitted(tc.v, true, tc.afterDeletion, tc.endangered)
			if got != tc.want || delay != tc.delay {
				t.Fatalf("routeAdmitted = %v, %v; want %v, %v", got, delay, tc.want, tc.delay)
			}
		})
	}
}

func TestAdmit(t *testing.T) {
	filter, err := expr.CompileFilter(`payload.total > 10`)
	if err != nil {
		t.Fatal(err)
	}
	failing, err := expr.CompileFilter(`payload.missing.field > 1`)
	if err != nil {
		t.Fatal(err)
	}
	md := &jetstream.MsgMetadata{Stream: "events", Sequence: jetstream.SequencePair{Stream: 7}, Timestamp: time.Now()}
	base := admission{prefix: "events", own: "shop", name: "ep", maxEventBytes: 1 << 20, md: md, headers: nats.Header{}}
	for _, tc := range []struct {
		name     string
		c        *endpoint.Config
		subject  string
		data     string
		exact    bool
		noMD     bool
		about    string
		want     act
		ok       bool
		filtered bool
		reason   string
	}{
		{name: "matching pattern, no filter", c: &endpoint.Config{EventTypes: []string{"order.*"}}, subject: "events.shop.order.created", ok: true},
		{name: "not a pattern of the endpoint", c: &endpoint.Config{EventTypes: []string{"order.*"}}, subject: "events.shop.user.created", want: actAck},
		{name: "the consumer's filter is the pattern", c: &endpoint.Config{EventTypes: []string{"order.*"}}, subject: "events.shop.user.created", exact: true, ok: true},
		{name: "not an event subject", c: &endpoint.Config{EventTypes: []string{">"}}, subject: "elsewhere.x", want: actAck},
		{name: "operational events need an explicit pattern", c: &endpoint.Config{EventTypes: []string{">"}}, subject: "events.shop.webhook_operator.endpoint.disabled", want: actAck},
		{name: "operational events about another endpoint", c: &endpoint.Config{EventTypes: []string{"webhook_operator.>"}}, subject: "events.shop.webhook_operator.endpoint.disabled", about: "other", ok: true},
		{name: "never about itself", c: &endpoint.Config{EventTypes: []string{"webhook_operator.>"}}, subject: "events.shop.webhook_operator.endpoint.disabled", about: "ep", want: actAck},
		{name: "the filter accepts", c: &endpoint.Config{EventTypes: []string{">"}, Filter: filter}, subject: "events.shop.order.created", data: `{"total":42}`, ok: true},
		{name: "the filter rejects: counted", c: &endpoint.Config{EventTypes: []string{">"}, Filter: filter}, subject: "events.shop.order.created", data: `{"total":2}`, want: actAck, filtered: true},
		{name: "the filter fails: dead letter", c: &endpoint.Config{EventTypes: []string{">"}, Filter: failing}, subject: "events.shop.order.created", data: `{"total":2}`, want: actDeadLetter, reason: records.ReasonFilterFailed},
		{name: "unreadable metadata with a filter: back", c: &endpoint.Config{EventTypes: []string{">"}, Filter: filter}, subject: "events.shop.order.created", data: `{}`, noMD: true, want: actRelease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base
			a.subject, a.data, a.exact = tc.subject, []byte(tc.data), tc.exact
			a.headers = nats.Header{}
			if tc.about != "" {
				a.headers.Set(records.HOpsEndpoint, tc.about)
			}
			if tc.noMD {
				a.md = nil
			}
			v, ok, filtered := admit(context.Background(), tc.c, a)
			if ok != tc.ok || filtered != tc.filtered || !ok && (v.act != tc.want || v.reason != tc.reason) {
				t.Fatalf("admit = %+v, ok %v, filtered %v; want act %v reason %q ok %v filtered %v", v, ok, filtered, tc.want, tc.reason, tc.ok, tc.filtered)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	meta := records.DeliveryMeta{DeliveryID: "whdl_1", EventID: "evt_1", Namespace: "shop"}
	c := &endpoint.Config{Name: "ep"}
	for _, tc := range []struct {
		name   string
		c      *endpoint.Config
		p      preflight
		ok     bool
		reason string
	}{
		{name: "deliverable", c: c, p: preflight{meta: meta, size: 10, maxEventBytes: 100}, ok: true},
		{name: "not an event", c: c, p: preflight{meta: meta, invalid: "no type"}, reason: records.ReasonInvalidEvent},
		{name: "no ids", c: c, p: preflight{meta: records.DeliveryMeta{EventID: "evt"}, maxEventBytes: 100}, reason: records.ReasonInvalidEvent},
		{name: "deleting", c: &endpoint.Config{Name: "ep", Deleting: true}, p: preflight{meta: meta, maxEventBytes: 100, disabled: true}, reason: records.ReasonEndpointDeleted},
		{name: "deleting, a delivery no router wrote", c: &endpoint.Config{Name: "ep", Deleting: true}, p: preflight{meta: records.DeliveryMeta{DeliveryID: "whdl_x"}, maxEventBytes: 100}, reason: records.ReasonEndpointDeleted},
		{name: "disabled", c: c, p: preflight{meta: meta, maxEventBytes: 100, disabled: true, why: "tired"}, reason: records.ReasonEndpointDisabled},
		{name: "too large", c: c, p: preflight{meta: meta, size: 101, maxEventBytes: 100}, reason: records.ReasonPayloadTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := check(tc.c, tc.p)
			if ok != tc.ok || !ok && (v.act != actDeadLetter || v.reason != tc.reason) {
				t.Fatalf("check = %+v, %v; want ok %v reason %q", v, ok, tc.ok, tc.reason)
			}
		})
	}
}

func TestFailed(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	schedule := policy.Policy{MaxAttempts: 3, Schedule: []time.Duration{0, time.Second, time.Hour}}
	noJitter := func() float64 { return 0.5 }
	o := outcome{Start: now, StatusCode: 500, Reason: records.FailStatusCode}
	meta := records.DeliveryMeta{DeliveryID: "whdl_1", EventID: "evt_1", Created: now}
	for _, tc := range []struct {
		name   string
		c      *endpoint.Config
		meta   records.DeliveryMeta
		n      int
		o      outcome
		want   act
		reason string
	}{
		{name: "a retry due soon is waited out here", c: &endpoint.Config{Policy: schedule}, meta: meta, n: 1, o: o, want: actWait},
		{name: "a later retry is a message schedule", c: &endpoint.Config{Policy: schedule}, meta: meta, n: 2, o: o, want: actSchedule},
		{name: "every PerKey retry waits here", c: &endpoint.Config{Policy: schedule, PerKey: true}, meta: meta, n: 2, o: o, want: actWait},
		{name: "the attempts are used up", c: &endpoint.Config{Policy: schedule}, meta: meta, n: 3, o: o, want: actDeadLetter, reason: records.ReasonExhausted},
		{name: "a test delivery is not retried", c: &endpoint.Config{Policy: schedule}, meta: records.DeliveryMeta{DeliveryID: "d", EventID: "e", Test: true}, n: 1, o: o, want: actDeadLetter, reason: records.ReasonTestFailed},
		{name: "a request that cannot be built", c: &endpoint.Config{Policy: schedule}, meta: meta, n: 1, o: outcome{Start: now, Reason: records.FailRequest, Err: "bad header"}, want: actDeadLetter, reason: records.ReasonInvalidEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := failed(tc.c, tc.meta, tc.n, tc.o, records.LogRecord{}, now, noJitter, 2*time.Second)
			if v.act != tc.want || v.reason != tc.reason {
				t.Fatalf("failed = act %v reason %q (%s); want %v %q", v.act, v.reason, v.why, tc.want, tc.reason)
			}
			switch v.act {
			case actWait, actSchedule:
				if v.meta.Attempts != tc.n || len(v.meta.History) != 1 || v.rec.State != records.StateFailed || v.rec.NextAttemptAt == nil {
					t.Fatalf("a retry carries the attempt made and its record: %+v %+v", v.meta, v.rec)
				}
			case actDeadLetter:
				if tc.o.Reason == records.FailRequest {
					if v.meta.Attempts != 0 || v.rec != nil {
						t.Fatalf("a request never sent counts no attempt: %+v", v)
					}
				} else if v.rec == nil || v.rec.State != records.StateDeadLetter || v.rec.DeadLetterReason != tc.reason || !strings.Contains(v.why, "last: HTTP 500") {
					t.Fatalf("the final record and explanation: %+v %q", v.rec, v.why)
				}
			}
		})
	}
}

func TestLoggedAgainAndPaused(t *testing.T) {
	now := time.Now()
	c := &endpoint.Config{}
	perKey := &endpoint.Config{PerKey: true}
	meta := records.DeliveryMeta{DeliveryID: "d", EventID: "e"}
	for _, tc := range []struct {
		name string
		c    *endpoint.Config
		dec  decision
		want act
	}{
		{name: "succeeded", c: c, dec: decision{State: records.StateSucceeded, Attempt: 1}, want: actAck},
		{name: "dead-lettered", c: c, dec: decision{State: records.StateDeadLetter, Attempt: 7}, want: actAck},
		{name: "retry scheduled", c: c, dec: decision{State: records.StateFailed, Attempt: 2, Wait: time.Hour}, want: actAck},
		{name: "retry in place", c: c, dec: decision{State: records.StateFailed, Attempt: 1, Wait: time.Second, Due: now.Add(time.Second)}, want: actWait},
		{name: "PerKey retries in place", c: perKey, dec: decision{State: records.StateFailed, Attempt: 2, Wait: time.Hour, Due: now.Add(time.Hour)}, want: actWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := loggedAgain(tc.c, meta, tc.dec, now, 2*time.Second)
			if v.act != tc.want || v.act == actWait && (v.meta.Attempts != tc.dec.Attempt || v.rec != nil) {
				t.Fatalf("loggedAgain = %+v; want %v", v, tc.want)
			}
		})
	}
	held := &heldRetry{meta: meta}
	for _, tc := range []struct {
		name       string
		c          *endpoint.Config
		m          mode
		held       *heldRetry
		leaseMoved bool
		want       act
		delay      time.Duration
		wait       bool
	}{
		{name: "a held retry is scheduled", c: c, m: modePaused, held: held, want: actSchedule},
		{name: "a PerKey held retry waits in order", c: perKey, m: modePaused, held: held, wait: true},
		{name: "not attempted yet: back in a second", c: c, m: modePaused, want: actRelease, delay: time.Second},
		{name: "another replica probes a PerKey endpoint: it waits", c: perKey, m: modeProbe, wait: true},
		{name: "the lease moved: back to the holder at once", c: perKey, m: modePaused, leaseMoved: true, want: actRelease},
	} {
		t.Run("paused/"+tc.name, func(t *testing.T) {
			v, wait := paused(tc.c, tc.m, tc.held, tc.leaseMoved)
			if wait != tc.wait || !wait && (v.act != tc.want || v.delay != tc.delay) {
				t.Fatalf("paused = %+v, wait %v; want %v %v, wait %v", v, wait, tc.want, tc.delay, tc.wait)
			}
		})
	}
}
