package chatformat

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

func opsBody(t *testing.T, ev records.OpsEvent) []byte {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var at = time.Date(2026, 11, 30, 21, 29, 4, 0, time.UTC)

func disabled(t *testing.T, message string) Event {
	ev := records.NewOpsEvent("shop", "crm", records.OpsEndpointDisabled, "k", at, map[string]any{
		"reason": "consecutive_failures", "consecutiveFailures": 10, "threshold": 10, "message": message})
	return Event{ID: ev.ID, Type: ev.Type, Namespace: "shop", Time: at, Body: opsBody(t, ev)}
}

func TestSlackMessageOfAnOperationalEvent(t *testing.T) {
	b, ct, err := Message(Slack, disabled(t, "endpoint auto-disabled: 10 consecutive failures"))
	if err != nil || ct != "application/json" {
		t.Fatal(err, ct)
	}
	var m struct {
		Text   string           `json:"text"`
		Blocks []map[string]any `json:"blocks"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Text != ":rotating_light: Endpoint shop/crm was disabled" {
		t.Errorf("text %q", m.Text)
	}
	s := string(b)
	for _, want := range []string{`"type":"header"`, "endpoint auto-disabled: 10 consecutive failures", `*consecutiveFailures*\n10`, `*reason*\nconsecutive_failures`, "*Endpoint*\\ncrm"} {
		if !strings.Contains(s, want) {
			t.Errorf("the message lacks %q: %s", want, s)
		}
	}
}

func TestTeamsMessageOfAnOperationalEvent(t *testing.T) {
	b, _, err := Message(Teams, disabled(t, "endpoint auto-disabled"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Type        string `json:"type"`
		Attachments []struct {
			ContentType string `json:"contentType"`
			Content     struct {
				Type string           `json:"type"`
				Body []map[string]any `json:"body"`
			} `json:"content"`
		} `json:"attachments"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Type != "message" || len(m.Attachments) != 1 || m.Attachments[0].ContentType != "application/vnd.microsoft.card.adaptive" || m.Attachments[0].Content.Type != "AdaptiveCard" {
		t.Fatalf("not a Teams card: %s", b)
	}
	body := m.Attachments[0].Content.Body
	if body[0]["text"] != "Endpoint shop/crm was disabled" || body[0]["color"] != "Attention" {
		t.Errorf("title block %v", body[0])
	}
}

// What an event carries is text: no Slack mention, link or code-block escape, no Teams link.
func TestHostileEventsStayText(t *testing.T) {
	hostile := "<!channel> <https://evil.example|click> & ``` [x](https://evil.example) *bold*"
	for _, ev := range []Event{
		disabled(t, hostile),
		{ID: "evt_1", Type: "order.created", Namespace: "shop", Body: []byte(`{"note":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`)},
		{ID: "evt_2", Type: "order.created", Namespace: "shop", Body: []byte("not json \xff " + hostile)},
	} {
		b, _, err := Message(Slack, ev)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Text   string `json:"text"`
			Blocks []struct {
				Type   string `json:"type"`
				Text   *struct{ Type, Text string }
				Fields []struct{ Type, Text string }
			} `json:"blocks"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, blk := range m.Blocks {
			var texts []string
			if blk.Text != nil && blk.Text.Type == "mrkdwn" {
				texts = append(texts, strings.TrimSuffix(strings.TrimPrefix(blk.Text.Text, "```"), "```"))
			}
			for _, f := range blk.Fields {
				texts = append(texts, f.Text)
			}
			for _, s := range texts {
				if strings.ContainsAny(s, "<>") || strings.Contains(s, "```") {
					t.Errorf("a mrkdwn text holds Slack markup: %q", s)
				}
			}
		}
		tb, _, err := Message(Teams, ev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(tb), "[x](") {
			t.Errorf("a Teams message holds a Markdown link: %s", tb)
		}
	}
}

func TestAnyEventAsAMessage(t *testing.T) {
	long := `{"items":"` + strings.Repeat("é", 3000) + `"}`
	b, _, err := Message(Slack, Event{ID: "evt_1", Type: "order.created", Namespace: "shop", Body: []byte(long)})
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) || !strings.Contains(string(b), "Event order.created in shop") || !strings.Contains(string(b), "…") {
		t.Errorf("message %s", b)
	}
	if len(b) > 4000 {
		t.Errorf("the message is %d bytes: the body is not bounded", len(b))
	}
	if _, _, err := Message("Discord", Event{}); err == nil {
		t.Error("an unknown kind was accepted")
	}
}

func TestDeadLetterAndReplayTitles(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		data map[string]any
		want string
	}{
		{records.OpsDeliveryDeadLettered, map[string]any{"count": 1}, "1 delivery of shop/crm dead-lettered"},
		{records.OpsDeliveryDeadLettered, map[string]any{"count": 12, "reasons": map[string]any{"exhausted": 12}}, "12 deliveries of shop/crm dead-lettered"},
		{records.OpsReplayCompleted, map[string]any{"replay": "r1", "selected": 3, "replayed": 3}, "Replay r1 of shop/crm completed"},
		{records.OpsCircuitClosed, nil, "Circuit closed for shop/crm: deliveries resume"},
	} {
		ev := records.NewOpsEvent("shop", "crm", tc.typ, "k", at, tc.data)
		b, _, err := Message(Slack, Event{ID: ev.ID, Type: ev.Type, Namespace: "shop", Body: opsBody(t, ev)})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), tc.want) {
			t.Errorf("%s: %s lacks %q", tc.typ, b, tc.want)
		}
	}
}
