package decide

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
		v          View
		fromEvents bool
		scheduled  bool
		want       Step
		delay      time.Duration
	}{
		{name: "no configuration: handed back", v: View{}, want: StepRelease},
		{name: "a delivery of a running endpoint is taken", v: View{Config: run, Mode: ModeRun}, want: StepTake},
		{name: "an event is admitted first", v: View{Config: run, Mode: ModeRun}, fromEvents: true, want: StepAdmit},
		{name: "a delivery of a paused endpoint comes back in a second", v: View{Config: run, Mode: ModePaused}, want: StepRelease, delay: time.Second},
		{name: "a PerKey delivery of a paused endpoint stays in order here", v: View{Config: perKey, Mode: ModePaused}, want: StepTake},
		{name: "a deleting endpoint's delivery is taken to be dead-lettered", v: View{Config: deleting, Mode: ModeRun}, want: StepTake},
		{name: "a scheduled retry before the deletion is seen: back, never sent early", v: View{Config: run, Mode: ModeRun}, scheduled: true, want: StepRelease, delay: time.Second},
		{name: "a scheduled retry of a deleting endpoint is dead-lettered", v: View{Config: deleting, Mode: ModeRun}, scheduled: true, want: StepTake},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, delay := Route(tc.v, tc.fromEvents, tc.scheduled)
			if got != tc.want || delay != tc.delay {
				t.Fatalf("Route = %v, %v; want %v, %v", got, delay, tc.want, tc.delay)
			}
		})
	}
	for _, tc := range []struct {
		name                      string
		v                         View
		afterDeletion, endangered bool
		want                      Step
		delay                     time.Duration
	}{
		{name: "taken", v: View{Config: run, Mode: ModeRun}, want: StepTake},
		{name: "held while holding", v: View{Config: run, Mode: ModePaused, Hold: true}, want: StepHold},
		{name: "a PerKey endpoint holds until what it held came back", v: View{Config: perKey, Mode: ModeRun, HeldBefore: true}, want: StepHold},
		{name: "the lease moved: the holder gets it", v: View{Config: perKey, Mode: ModeRun, LeaseMoved: true}, want: StepRelease},
		{name: "endangered by the stream's limits: held", v: View{Config: run, Mode: ModeRun}, endangered: true, want: StepHold},
		{name: "paused: back in a second", v: View{Config: run, Mode: ModePaused}, want: StepRelease, delay: time.Second},
		{name: "stored after the deletion: not the endpoint's", v: View{Config: deleting, Mode: ModeRun}, afterDeletion: true, want: StepAck},
		{name: "stored before the deletion: dead-lettered", v: View{Config: deleting, Mode: ModeRun, Hold: true}, want: StepTake},
	} {
		t.Run("admitted/"+tc.name, func(t *testing.T) {
			got, delay := RouteAdmitted(tc.v, true, tc.afterDeletion, tc.endangered)
			if got != tc.want || delay != tc.delay {
				t.Fatalf("RouteAdmitted = %v, %v; want %v, %v", got, delay, tc.want, tc.delay)
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
	base := Admission{Prefix: "events", Own: "shop", Name: "ep", MaxEventBytes: 1 << 20, MD: md, Headers: nats.Header{}}
	for _, tc := range []struct {
		name     string
		c        *endpoint.Config
		subject  string
		data     string
		exact    bool
		noMD     bool
		about    string
		want     Act
		ok       bool
		filtered bool
		reason   string
	}{
		{name: "matching pattern, no filter", c: &endpoint.Config{EventTypes: []string{"order.*"}}, subject: "events.shop.order.created", ok: true},
		{name: "not a pattern of the endpoint", c: &endpoint.Config{EventTypes: []string{"order.*"}}, subject: "events.shop.user.created", want: ActAck},
		{name: "the consumer's filter is the pattern", c: &endpoint.Config{EventTypes: []string{"order.*"}}, subject: "events.shop.user.created", exact: true, ok: true},
		{name: "not an event subject", c: &endpoint.Config{EventTypes: []string{">"}}, subject: "elsewhere.x", want: ActAck},
		{name: "operational events need an explicit pattern", c: &endpoint.Config{EventTypes: []string{">"}}, subject: "events.shop.webhook_operator.endpoint.disabled", want: ActAck},
		{name: "operational events about another endpoint", c: &endpoint.Config{EventTypes: []string{"webhook_operator.>"}}, subject: "events.shop.webhook_operator.endpoint.disabled", about: "other", ok: true},
		{name: "never about itself", c: &endpoint.Config{EventTypes: []string{"webhook_operator.>"}}, subject: "events.shop.webhook_operator.endpoint.disabled", about: "ep", want: ActAck},
		{name: "the filter accepts", c: &endpoint.Config{EventTypes: []string{">"}, Filter: filter}, subject: "events.shop.order.created", data: `{"total":42}`, ok: true},
		{name: "the filter rejects: counted", c: &endpoint.Config{EventTypes: []string{">"}, Filter: filter}, subject: "events.shop.order.created", data: `{"total":2}`, want: ActAck, filtered: true},
		{name: "the filter fails: dead letter", c: &endpoint.Config{EventTypes: []string{">"}, Filter: failing}, subject: "events.shop.order.created", data: `{"total":2}`, want: ActDeadLetter, reason: records.ReasonFilterFailed},
		{name: "unreadable metadata with a filter: back", c: &endpoint.Config{EventTypes: []string{">"}, Filter: filter}, subject: "events.shop.order.created", data: `{}`, noMD: true, want: ActRelease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base
			a.Subject, a.Data, a.Exact = tc.subject, []byte(tc.data), tc.exact
			a.Headers = nats.Header{}
			if tc.about != "" {
				a.Headers.Set(records.HOpsEndpoint, tc.about)
			}
			if tc.noMD {
				a.MD = nil
			}
			v, ok, filtered := Admit(context.Background(), tc.c, a)
			if ok != tc.ok || filtered != tc.filtered || !ok && (v.Act != tc.want || v.Reason != tc.reason) {
				t.Fatalf("Admit = %+v, ok %v, filtered %v; want act %v reason %q ok %v filtered %v", v, ok, filtered, tc.want, tc.reason, tc.ok, tc.filtered)
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
		p      Preflight
		ok     bool
		reason string
	}{
		{name: "deliverable", c: c, p: Preflight{Meta: meta, Size: 10, MaxEventBytes: 100}, ok: true},
		{name: "not an event", c: c, p: Preflight{Meta: meta, Invalid: "no type"}, reason: records.ReasonInvalidEvent},
		{name: "no ids", c: c, p: Preflight{Meta: records.DeliveryMeta{EventID: "evt"}, MaxEventBytes: 100}, reason: records.ReasonInvalidEvent},
		{name: "deleting", c: &endpoint.Config{Name: "ep", Deleting: true}, p: Preflight{Meta: meta, MaxEventBytes: 100, Disabled: true}, reason: records.ReasonEndpointDeleted},
		{name: "deleting, a delivery no router wrote", c: &endpoint.Config{Name: "ep", Deleting: true}, p: Preflight{Meta: records.DeliveryMeta{DeliveryID: "whdl_x"}, MaxEventBytes: 100}, reason: records.ReasonEndpointDeleted},
		{name: "disabled", c: c, p: Preflight{Meta: meta, MaxEventBytes: 100, Disabled: true, Why: "tired"}, reason: records.ReasonEndpointDisabled},
		{name: "too large", c: c, p: Preflight{Meta: meta, Size: 101, MaxEventBytes: 100}, reason: records.ReasonPayloadTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := Check(tc.c, tc.p)
			if ok != tc.ok || !ok && (v.Act != ActDeadLetter || v.Reason != tc.reason) {
				t.Fatalf("Check = %+v, %v; want ok %v reason %q", v, ok, tc.ok, tc.reason)
			}
		})
	}
}

func TestFailed(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	schedule := policy.Policy{MaxAttempts: 3, Schedule: []time.Duration{0, time.Second, time.Hour}}
	noJitter := func() float64 { return 0.5 }
	o := Outcome{Start: now, StatusCode: 500, Reason: records.FailStatusCode}
	meta := records.DeliveryMeta{DeliveryID: "whdl_1", EventID: "evt_1", Created: now}
	for _, tc := range []struct {
		name   string
		c      *endpoint.Config
		meta   records.DeliveryMeta
		n      int
		o      Outcome
		want   Act
		reason string
	}{
		{name: "a retry due soon is waited out here", c: &endpoint.Config{Policy: &schedule}, meta: meta, n: 1, o: o, want: ActWait},
		{name: "a later retry is a message schedule", c: &endpoint.Config{Policy: &schedule}, meta: meta, n: 2, o: o, want: ActSchedule},
		{name: "every PerKey retry waits here", c: &endpoint.Config{Policy: &schedule, PerKey: true}, meta: meta, n: 2, o: o, want: ActWait},
		{name: "the attempts are used up", c: &endpoint.Config{Policy: &schedule}, meta: meta, n: 3, o: o, want: ActDeadLetter, reason: records.ReasonExhausted},
		{name: "a test delivery is not retried", c: &endpoint.Config{Policy: &schedule}, meta: records.DeliveryMeta{DeliveryID: "d", EventID: "e", Test: true}, n: 1, o: o, want: ActDeadLetter, reason: records.ReasonTestFailed},
		{name: "a request that cannot be built", c: &endpoint.Config{Policy: &schedule}, meta: meta, n: 1, o: Outcome{Start: now, Reason: records.FailRequest, Err: "bad header"}, want: ActDeadLetter, reason: records.ReasonInvalidEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Failed(tc.c, tc.meta, tc.n, tc.o, records.LogRecord{}, now, noJitter, 2*time.Second)
			if v.Act != tc.want || v.Reason != tc.reason {
				t.Fatalf("Failed = act %v reason %q (%s); want %v %q", v.Act, v.Reason, v.Why, tc.want, tc.reason)
			}
			switch v.Act {
			case ActWait, ActSchedule:
				if v.Meta.Attempts != tc.n || len(v.Meta.History) != 1 || v.Rec.State != records.StateFailed || v.Rec.NextAttemptAt == nil {
					t.Fatalf("a retry carries the attempt made and its record: %+v %+v", v.Meta, v.Rec)
				}
			case ActDeadLetter:
				if tc.o.Reason == records.FailRequest {
					if v.Meta.Attempts != 0 || v.Rec != nil {
						t.Fatalf("a request never sent counts no attempt: %+v", v)
					}
				} else if v.Rec == nil || v.Rec.State != records.StateDeadLetter || v.Rec.DeadLetterReason != tc.reason || !strings.Contains(v.Why, "last: HTTP 500") {
					t.Fatalf("the final record and explanation: %+v %q", v.Rec, v.Why)
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
		dec  Logged
		want Act
	}{
		{name: "succeeded", c: c, dec: Logged{State: records.StateSucceeded, Attempt: 1}, want: ActAck},
		{name: "dead-lettered", c: c, dec: Logged{State: records.StateDeadLetter, Attempt: 7}, want: ActAck},
		{name: "retry scheduled", c: c, dec: Logged{State: records.StateFailed, Attempt: 2, Wait: time.Hour}, want: ActAck},
		{name: "retry in place", c: c, dec: Logged{State: records.StateFailed, Attempt: 1, Wait: time.Second, Due: now.Add(time.Second)}, want: ActWait},
		{name: "PerKey retries in place", c: perKey, dec: Logged{State: records.StateFailed, Attempt: 2, Wait: time.Hour, Due: now.Add(time.Hour)}, want: ActWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := LoggedAgain(tc.c, meta, tc.dec, now, 2*time.Second)
			if v.Act != tc.want || v.Act == ActWait && (v.Meta.Attempts != tc.dec.Attempt || v.Rec != nil) {
				t.Fatalf("LoggedAgain = %+v; want %v", v, tc.want)
			}
		})
	}
	held := &meta
	for _, tc := range []struct {
		name       string
		c          *endpoint.Config
		m          Mode
		held       *records.DeliveryMeta
		leaseMoved bool
		want       Act
		delay      time.Duration
		wait       bool
	}{
		{name: "a held retry is scheduled", c: c, m: ModePaused, held: held, want: ActSchedule},
		{name: "a PerKey held retry waits in order", c: perKey, m: ModePaused, held: held, wait: true},
		{name: "not attempted yet: back in a second", c: c, m: ModePaused, want: ActRelease, delay: time.Second},
		{name: "another replica probes a PerKey endpoint: it waits", c: perKey, m: ModeProbe, wait: true},
		{name: "the lease moved: back to the holder at once", c: perKey, m: ModePaused, leaseMoved: true, want: ActRelease},
	} {
		t.Run("paused/"+tc.name, func(t *testing.T) {
			v, wait := Paused(tc.c, tc.m, tc.held, tc.leaseMoved)
			if wait != tc.wait || !wait && (v.Act != tc.want || v.Delay != tc.delay) {
				t.Fatalf("Paused = %+v, wait %v; want %v %v, wait %v", v, wait, tc.want, tc.delay, tc.wait)
			}
		})
	}
}
