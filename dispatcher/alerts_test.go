package dispatcher_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// slackMessage is what a Slack incoming webhook reads of a request.
type slackMessage struct {
	Text   string `json:"text"`
	Blocks []struct {
		Type string `json:"type"`
		Text *struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"text"`
	} `json:"blocks"`
}

// An endpoint's owners hear that it was disabled in their Slack channel, once: an alerting
// endpoint with format Slack, subscribed to webhook_operator.endpoint.disabled, gets one
// Slack message (signed and logged like any delivery) saying which endpoint was disabled and
// why, and nothing more while the disabled endpoint dead-letters what keeps arriving.
func TestAnEndpointDisabledIsOneSlackMessage(t *testing.T) {
	e := newEnv(t)
	down := newReceiver(t, func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusServiceUnavailable, Body: "down"}
	})
	// Slack answers an incoming webhook with 200 "ok".
	slack := newReceiver(t, func(testenv.Request) testenv.Response { return testenv.Response{Status: http.StatusOK, Body: "ok"} })
	strict := e.policy("strict", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit(),
		AutoDisable: &v1alpha1.AutoDisableSpec{ConsecutiveFailures: ptr(int32(3))}})
	e.endpoint("crm", v1alpha1.WebhookEndpointSpec{URL: down.URL(), EventTypes: []v1alpha1.EventTypePattern{"contact.*"}, RetryPolicyRef: strict})
	slack.Trust(e.endpoint("crm-owners", v1alpha1.WebhookEndpointSpec{URL: slack.URL(),
		EventTypes: []v1alpha1.EventTypePattern{"webhook_operator.endpoint.disabled"},
		Format:     &v1alpha1.FormatSpec{Type: v1alpha1.FormatSlack}}))
	e.dispatcher("d1", func(o *dispatcher.Options) { o.OpsSweepInterval = 200 * time.Millisecond })

	for i := range 3 {
		e.publish("contact.updated", fmt.Sprintf("evt_%02d", i), []byte(`{}`))
	}
	messages := func() []slackMessage {
		var out []slackMessage
		for _, r := range slack.Requests() {
			var m slackMessage
			if err := json.Unmarshal(r.Body, &m); err != nil {
				t.Errorf("the alert is not JSON: %v: %q", err, r.Body)
				continue
			}
			if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("webhook-event-type") != records.OpsEndpointDisabled {
				t.Errorf("the alert came with content-type %q and webhook-event-type %q", r.Header.Get("Content-Type"), r.Header.Get("webhook-event-type"))
			}
			out = append(out, m)
		}
		return out
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(messages()) > 0 }, "no Slack message")
	m := messages()[0]
	want := ":rotating_light: Endpoint " + e.ns + "/crm was disabled"
	if m.Text != want {
		t.Errorf("the message's text is %q, want %q", m.Text, want)
	}
	var all strings.Builder
	for _, b := range m.Blocks {
		if b.Text != nil {
			all.WriteString(b.Text.Text + "\n")
		}
	}
	if !strings.Contains(all.String(), "consecutive") {
		t.Errorf("the message does not say why: %q", all.String())
	}
	// The endpoint stays disabled: what arrives now is dead-lettered, and no second message.
	for i := 3; i < 6; i++ {
		e.publish("contact.updated", fmt.Sprintf("evt_%02d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		n := 0
		for _, dl := range e.deadLetters() {
			if dl.Endpoint == "crm" && dl.Reason == records.ReasonEndpointDisabled {
				n++
			}
		}
		return n == 3
	}, "the disabled endpoint did not dead-letter the events that came after")
	if n := len(messages()); n != 1 {
		t.Errorf("%d Slack messages, want 1", n)
	}
	// The alert is a delivery like any other: in the delivery log, succeeded once.
	var logged int
	for _, r := range e.logRecords("crm-owners") {
		if r.State == records.StateSucceeded {
			logged++
		}
	}
	if logged != 1 {
		t.Errorf("the delivery log holds %d successful alert deliveries, want 1", logged)
	}
}
