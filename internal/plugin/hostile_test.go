package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// hostileText clears the screen, retitles the terminal, rings its bell, returns the cursor to
// overwrite the line, starts colours with the one-byte C1 CSI (as a character and as a bare
// byte), and reverses what follows it with bidirectional controls and hides a zero-width space.
const hostileText = "\x1b[2J\x1b[H\x1b]0;owned\x07\rHACKED \u009b31mred\x9b32mgreen\x1b[0m \u202e\u2066dettimda\u2069\u200b"

// rawControls lists the control characters and non-UTF-8 bytes of terminal output other than
// its line ends.
func rawControls(s string) []string {
	var found []string
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			found = append(found, fmt.Sprintf("byte %#x at %d", s[i], i))
		case r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x80 && unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp):
			found = append(found, fmt.Sprintf("%U at %d", r, i))
		}
		i += size
	}
	return found
}

// A hostile receiver's response and a hostile producer's event reach an admin's terminal
// through kubectl webhooks only as visible escapes; JSON output still holds them exactly.
func TestHostileTextIsEscapedOnTheTerminal(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	hostile := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusInternalServerError, Body: hostileText + "\nline two\t" + hostileText}
	}})
	once := &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "once"},
		Spec: v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}}}
	if err := cp.Client.Create(ctx, once); err != nil {
		t.Fatal(err)
	}
	e.wiredEndpoint("evil", hostile.URL(), func(s *v1alpha1.WebhookEndpointSpec) {
		s.RetryPolicyRef = &v1alpha1.LocalObjectReference{Name: "once"}
	})
	set := e.cfg.For(e.ns)
	e.runDispatcher()

	// The producer's: a payload and a header of escapes, delivered to the hostile receiver and
	// dead-lettered after its one attempt; and an event whose id and type are escapes,
	// dead-lettered as invalid_event with both kept.
	publish := func(typ, id string, h nats.Header, body string) {
		t.Helper()
		msg := &nats.Msg{Subject: set.EventSubject(typ), Header: h, Data: []byte(body)}
		msg.Header.Set(records.HeaderMsgID, id)
		if _, err := e.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	publish("order.created", "evt_payload", nats.Header{"X-Evil": {"\x1b]0;owned\x07\x1b[31m\u009b1m"}}, hostileText)
	publish("order.\x1b[31mcreated\u009b", "evt_\x1b[2J\x07", nats.Header{}, `{}`)
	var dead []plugin.DeadLetterItem
	testenv.Eventually(t, 60*time.Second, func() error {
		var p plugin.Page[plugin.DeadLetterItem]
		e.run("dlq", "list", "evil", "-o", "json").must(t, plugin.ExitOK).decode(t, &p)
		if dead = p.Data; len(dead) != 2 {
			return fmt.Errorf("%d dead letters of 2", len(dead))
		}
		return nil
	}, "")
	var fromReceiver, invalid plugin.DeadLetterItem
	for _, d := range dead {
		if d.Reason == records.ReasonInvalidEvent {
			invalid = d
		} else {
			fromReceiver = d
		}
	}
	if fromReceiver.Reason != records.ReasonExhausted || invalid.EventID != "evt_\x1b[2J\x07" || invalid.EventType != "order.\x1b[31mcreated\u009b" {
		t.Fatalf("dead letters: %+v", dead)
	}

	// A one-shot test delivery, answered by the same receiver.
	test := e.run("test", "evil", "--wait", "--data", `{"note":"`+"\u009b31m\x7f"+`"}`)
	if test.code != plugin.ExitError {
		t.Fatalf("the test delivery: %s", test)
	}
	terminal := map[string]result{"test": test}
	for _, args := range [][]string{
		{"dlq", "list"}, {"dlq", "list", "evil"}, {"dlq", "show", fromReceiver.DeliveryID}, {"dlq", "show", invalid.DeliveryID},
		{"log", "evil"}, {"log", "evil", "--attempts"}, {"status"}, {"status", "evil"},
	} {
		terminal[strings.Join(args, " ")] = e.run(args...).must(t, plugin.ExitOK)
	}
	for cmd, r := range terminal {
		if bad := rawControls(r.out + r.errOut); len(bad) > 0 {
			t.Errorf("kubectl webhooks %s printed raw control characters %v:\n%q", cmd, bad, r.out+r.errOut)
		}
	}
	// What the attacker wrote is there, visibly.
	show := terminal["dlq show "+fromReceiver.DeliveryID].out
	for _, want := range []string{
		`    \x1b[2J\x1b[H\x1b]0;owned\a\rHACKED \u009b31mred`, // the body (its bare 0x9b stored as U+FFFD)
		"    line two    ",                       // a body's tabs stay spaces
		`X-Evil: \x1b]0;owned\a\x1b[31m\u009b1m`, // a header
		`  \x1b[2J\x1b[H\x1b]0;owned\a\rHACKED`,  // the payload, not JSON
		`green\x1b[0m`,
	} {
		if !strings.Contains(show, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, show)
		}
	}
	for _, cmd := range []string{"dlq list evil", "log evil", "dlq show " + invalid.DeliveryID} {
		if out := terminal[cmd].out; !strings.Contains(out, `order.\x1b[31mcreated\u009b`) {
			t.Errorf("kubectl webhooks %s does not show the event type escaped:\n%s", cmd, out)
		}
	}

	// JSON holds exactly what was stored.
	var d plugin.DeadLetterItem
	r := e.run("dlq", "show", fromReceiver.DeliveryID, "-o", "json").must(t, plugin.ExitOK)
	r.decode(t, &d)
	stored := strings.ToValidUTF8(hostileText, "\uFFFD")
	if d.LastResponse == nil || d.LastResponse.Body != stored+"\nline two\t"+stored || d.Headers["X-Evil"][0] != "\x1b]0;owned\x07\x1b[31m\u009b1m" {
		t.Errorf("dlq show -o json: %+v", d)
	}
	var payload string
	if err := json.Unmarshal(d.Payload, &payload); err != nil || payload != stored {
		t.Errorf("payload %q (%v), want %q", payload, err, stored)
	}
	if bad := rawControls(r.out); len(bad) > 0 {
		t.Errorf("dlq show -o json printed raw control characters %v", bad)
	}
	yamlValid(t, e.run("dlq", "show", fromReceiver.DeliveryID, "-o", "yaml").must(t, plugin.ExitOK))
}
