// Package chatformat writes an event as a chat message: a Slack message (incoming webhooks'
// Block Kit) or a Microsoft Teams message (an Adaptive Card, as Teams' workflow webhooks take
// it), for endpoints whose spec.format.type is Slack or Teams.
//
// An operational event (webhook_operator.*: an endpoint disabled, a circuit opened or closed,
// dead letters, a replay completed) becomes a sentence that says what happened to which
// endpoint, its own message and its figures; any other event a title and its body as a code
// block, bounded. Everything the event carries is text in the message, never markup: Slack's
// control characters (&, <, >) are escaped, so an event cannot mention @channel or make a link.
// The message is a pure function of the event: a retry or a replay sends the same message.
package chatformat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Kind is the chat service a message is written for.
type Kind string

// The kinds of message.
const (
	Slack Kind = "Slack"
	Teams Kind = "Teams"
)

// Bounds of what a message holds, within Slack's (a header's 150 characters, a text's 3,000,
// 10 fields) and Teams' (28 KB a card) limits.
const (
	maxTitle   = 150
	maxText    = 2000
	maxFacts   = 10
	maxFactLen = 200
	maxBody    = 1500
)

// Event is what a message is made of: the delivery's event.
type Event struct {
	// ID is the event's id (the request's webhook-id).
	ID string
	// Type is the event's type.
	Type string
	// Namespace is the event's namespace.
	Namespace string
	// Time is the event's time.
	Time time.Time
	// Body is the event's body as published.
	Body []byte
}

// Message is ev written as a message of kind k, and its content type.
func Message(k Kind, ev Event) ([]byte, string, error) {
	m := compose(ev)
	var v any
	switch k {
	case Slack:
		v = slack(m)
	case Teams:
		v = teams(m)
	default:
		return nil, "", fmt.Errorf("unknown chat format %q", k)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The message is JSON for a chat service, not HTML: <, > and & stay as they are in
	// strings (Slack's own escaping is applied to its text).
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, "", err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), "application/json", nil
}

// message is what both kinds say: a title, a severity, a sentence or two, facts, and a block
// of code (a non-operational event's body).
type message struct {
	title   string
	warning bool
	text    string
	facts   []fact
	code    string
	footer  string
}

type fact struct{ name, value string }

// compose reads the event into a message.
func compose(ev Event) message {
	if records.IsOpsType(ev.Type) {
		var op records.OpsEvent
		if err := json.Unmarshal(ev.Body, &op); err == nil && op.Type == ev.Type {
			return opsMessage(op, ev)
		}
	}
	m := message{title: fmt.Sprintf("Event %s in %s", ev.Type, ev.Namespace)}
	m.facts = []fact{{"Event type", ev.Type}, {"Namespace", ev.Namespace}}
	if !ev.Time.IsZero() {
		m.facts = append(m.facts, fact{"Time", ev.Time.UTC().Format(time.RFC3339)})
	}
	m.code = bodyText(ev.Body)
	m.footer = "webhook-operator · " + ev.ID
	return m
}

// opsMessage says what an operational event reports.
func opsMessage(op records.OpsEvent, ev Event) message {
	ep := op.Namespace + "/" + op.Endpoint
	d := op.Data
	m := message{footer: "webhook-operator · " + op.Type + " · " + op.ID, text: str(d["message"])}
	switch op.Type {
	case records.OpsEndpointDisabled:
		m.title, m.warning = "Endpoint "+ep+" was disabled", true
		if m.text == "" {
			m.text = "It receives no new deliveries until it is re-enabled."
		}
		m.text += "\nWhat arrives meanwhile is dead-lettered (endpoint_disabled) and can be replayed once it is enabled again."
	case records.OpsEndpointEnabled:
		m.title = "Endpoint " + ep + " was re-enabled"
	case records.OpsCircuitOpened:
		m.title, m.warning = "Circuit opened for "+ep, true
		if m.text == "" {
			m.text = "Deliveries are held until the circuit probes the receiver again."
		}
	case records.OpsCircuitHalfOpen:
		m.title = "Circuit of " + ep + " is half-open: one probe is let through"
	case records.OpsCircuitClosed:
		m.title = "Circuit closed for " + ep + ": deliveries resume"
	case records.OpsDeliveryDeadLettered:
		n := num(d["count"])
		noun := "deliveries"
		if n == 1 {
			noun = "delivery"
		}
		m.title, m.warning = fmt.Sprintf("%d %s of %s dead-lettered", n, noun, ep), true
		if m.text == "" {
			m.text = "Inspect and replay them from the dead-letter queue."
		}
	case records.OpsReplayCompleted:
		m.title = fmt.Sprintf("Replay %s of %s completed", str(d["replay"]), ep)
		m.warning = num(d["failed"]) > 0
		if m.text == "" {
			m.text = fmt.Sprintf("%d replayed of %d selected, %d skipped, %d failed.", num(d["replayed"]), num(d["selected"]), num(d["skipped"]), num(d["failed"]))
		}
	case records.OpsDeadLettersPurged:
		m.title = fmt.Sprintf("%d dead letters purged in %s", num(d["count"]), op.Namespace)
		if op.Endpoint != "" {
			m.title += " (" + op.Endpoint + ")"
		}
	default:
		m.title = strings.TrimPrefix(op.Type, records.OpsTypePrefix+".") + " in " + op.Namespace
		if op.Endpoint != "" {
			m.title += " (" + op.Endpoint + ")"
		}
	}
	m.facts = []fact{{"Namespace", op.Namespace}}
	if op.Endpoint != "" {
		m.facts = append(m.facts, fact{"Endpoint", op.Endpoint})
	}
	if !op.Time.IsZero() {
		m.facts = append(m.facts, fact{"Time", op.Time.UTC().Format(time.RFC3339)})
	}
	// The figures of data, in a stable order; the message is the text already.
	keys := make([]string, 0, len(d))
	for k, v := range d {
		if k == "message" {
			continue
		}
		switch v.(type) {
		case string, float64, bool:
			keys = append(keys, k)
		case map[string]any:
			if k == "reasons" {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(m.facts) >= maxFacts {
			break
		}
		m.facts = append(m.facts, fact{k, factValue(d[k])})
	}
	return m
}

func factValue(v any) string {
	switch x := v.(type) {
	case string:
		return bound(x, maxFactLen)
	case float64:
		if x == float64(int64(x)) {
			return fmt.Sprint(int64(x))
		}
		return fmt.Sprint(x)
	case bool:
		return fmt.Sprint(x)
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+": "+factValue(x[k]))
		}
		return bound(strings.Join(parts, ", "), maxFactLen)
	}
	return ""
}

func str(v any) string {
	s, _ := v.(string)
	return bound(s, maxText)
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// bodyText is an event's body for a code block: JSON indented, anything else as text with
// invalid UTF-8 replaced, bounded.
func bodyText(b []byte) string {
	var out bytes.Buffer
	if json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
		return bound(out.String(), maxBody)
	}
	return bound(strings.ToValidUTF8(string(b), "\uFFFD"), maxBody)
}

// bound cuts s to at most n bytes at a rune boundary, marking the cut.
func bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// slackEscape makes s plain text in Slack's mrkdwn: its three control characters escaped, so
// that nothing in an event becomes a mention (<!channel>), a link or a user reference.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// slack is the message as a Slack incoming webhook takes it: text (the notification's and
// the fallback's) and blocks.
func slack(m message) map[string]any {
	icon := ":white_check_mark:"
	if m.warning {
		icon = ":rotating_light:"
	}
	text := icon + " " + slackEscape(m.title)
	blocks := []any{
		map[string]any{"type": "header", "text": map[string]any{"type": "plain_text", "text": bound(m.title, maxTitle), "emoji": false}},
	}
	if m.text != "" {
		blocks = append(blocks, map[string]any{"type": "section", "text": map[string]any{"type": "plain_text", "text": bound(m.text, maxText), "emoji": false}})
	}
	if len(m.facts) > 0 {
		fields := make([]any, 0, len(m.facts))
		for _, f := range m.facts {
			fields = append(fields, map[string]any{"type": "mrkdwn", "text": "*" + slackEscape(f.name) + "*\n" + slackEscape(f.value)})
		}
		blocks = append(blocks, map[string]any{"type": "section", "fields": fields})
	}
	if m.code != "" {
		// Backticks in the body would end the code block: they are replaced by a look-alike.
		code := strings.ReplaceAll(slackEscape(m.code), "```", "ˋˋˋ")
		blocks = append(blocks, map[string]any{"type": "section", "text": map[string]any{"type": "mrkdwn", "text": "```" + code + "```"}})
	}
	blocks = append(blocks, map[string]any{"type": "context", "elements": []any{map[string]any{"type": "plain_text", "text": bound(m.footer, maxFactLen), "emoji": false}}})
	return map[string]any{"text": text, "blocks": blocks}
}

// teams is the message as a Teams workflow webhook takes it: a message with one Adaptive Card.
// TextBlocks render a subset of Markdown, so every text of the event is in a block of its
// own, and no text of the event can become a link.
func teams(m message) map[string]any {
	color := "Good"
	if m.warning {
		color = "Attention"
	}
	body := []any{
		map[string]any{"type": "TextBlock", "text": teamsText(bound(m.title, maxTitle)), "weight": "Bolder", "size": "Medium", "color": color, "wrap": true},
	}
	if m.text != "" {
		body = append(body, map[string]any{"type": "TextBlock", "text": teamsText(bound(m.text, maxText)), "wrap": true})
	}
	if len(m.facts) > 0 {
		facts := make([]any, 0, len(m.facts))
		for _, f := range m.facts {
			facts = append(facts, map[string]any{"title": teamsText(f.name), "value": teamsText(f.value)})
		}
		body = append(body, map[string]any{"type": "FactSet", "facts": facts})
	}
	if m.code != "" {
		body = append(body, map[string]any{"type": "TextBlock", "text": teamsText(m.code), "fontType": "Monospace", "wrap": true})
	}
	body = append(body, map[string]any{"type": "TextBlock", "text": teamsText(m.footer), "isSubtle": true, "size": "Small", "wrap": true})
	return map[string]any{
		"type":    "message",
		"summary": bound(m.title, maxTitle),
		"attachments": []any{map[string]any{
			"contentType": "application/vnd.microsoft.card.adaptive",
			"content": map[string]any{
				"$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
				"type":    "AdaptiveCard",
				"version": "1.4",
				"body":    body,
			},
		}},
	}
}

// teamsText keeps an event's text from becoming a link in Teams, whose TextBlocks render
// Markdown links: a zero-width space between "]" and "(" breaks the syntax and shows the same.
func teamsText(s string) string {
	return strings.ReplaceAll(s, "](", "]\u200b(")
}
