package cloudevent

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Every request Encode builds is a CloudEvent the official SDK reads back with the event's
// attributes and data, in both content modes, for JSON, text and binary data.
func TestEncodeIsReadByTheSDK(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 123000000, time.UTC)
	for _, tc := range []struct {
		name        string
		contentType string
		data        []byte
	}{
		{"json", "application/json", []byte(`{"order":"o-1","total":42}`)},
		{"default-content-type", "", []byte(`{"order":"o-2"}`)},
		{"text", "text/plain; charset=utf-8", []byte("héllo \"world\"")},
		{"binary-data", "application/octet-stream", []byte{0, 1, 2, 0xff}},
		{"invalid-json", "application/json", []byte(`{not json`)},
	} {
		for _, mode := range []Mode{Binary, Structured} {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				e := Event{ID: "evt_1", Type: "order.created", Source: "/shop", Subject: "orders/o-1", DataSchema: "https://example.com/order.json",
					Time: at, ContentType: tc.contentType, Extensions: map[string]string{PartitionKey: "o-1", "region": "eu \"west\" %"}, Data: tc.data}
				h, body, err := Encode(e, mode)
				if err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequest(http.MethodPost, "http://receiver/", bytes.NewReader(body))
				for k, v := range h {
					req.Header[k] = v
				}
				got, attrs, err := readWithSDK(req, mode)
				if err != nil {
					t.Fatalf("the SDK cannot read the request (%v): %v\n%s", h, err, body)
				}
				if attrs["id"] != "evt_1" || attrs["type"] != "order.created" || attrs["source"] != "/shop" || attrs["subject"] != "orders/o-1" ||
					attrs["dataschema"] != "https://example.com/order.json" || !got.Time().Equal(at) {
					t.Errorf("attributes: %v", attrs)
				}
				if attrs[PartitionKey] != "o-1" || attrs["region"] != "eu \"west\" %" {
					t.Errorf("extensions %v", attrs)
				}
				wantCT := tc.contentType
				if wantCT == "" {
					wantCT = "application/json"
				}
				if got.DataContentType() != wantCT || !bytes.Equal(got.Data(), tc.data) {
					t.Errorf("data %q (%s), want %q (%s)", got.Data(), got.DataContentType(), tc.data, wantCT)
				}
				if mode == Binary && !bytes.Equal(body, tc.data) {
					t.Errorf("a binary-mode body is the data as is: %q", body)
				}
				if mode == Structured && !strings.HasPrefix(h.Get("Content-Type"), "application/cloudevents+json") {
					t.Errorf("structured Content-Type %q", h.Get("Content-Type"))
				}
			})
		}
	}
}

// readWithSDK is a receiver of the HTTP binding: the official SDK reads the request, then, in
// binary mode, every string attribute gets the one round of percent-decoding the binding
// requires (3.1.3.2), which the SDK leaves to its user (cloudevents/sdk-go#1331); the decoding
// is the standard library's, not this package's. The attributes are returned by name (the SDK's
// setters would trim what they are given).
func readWithSDK(req *http.Request, mode Mode) (*event.Event, map[string]string, error) {
	ev, err := cehttp.NewEventFromHTTPRequest(req)
	if err != nil {
		return nil, nil, err
	}
	attrs := map[string]string{"id": ev.ID(), "type": ev.Type(), "source": ev.Source(), "subject": ev.Subject(), "dataschema": ev.DataSchema()}
	for name, v := range ev.Extensions() {
		if s, ok := v.(string); ok {
			attrs[name] = s
		}
	}
	if mode == Binary {
		for name, v := range attrs {
			if attrs[name], err = url.PathUnescape(v); err != nil {
				return nil, nil, err
			}
		}
	}
	return ev, attrs, nil
}

// A binary-mode request carries every ce-* value percent-encoded as the HTTP binding requires
// (printable ASCII without space, double quote or an unescaped percent), so a receiver of the
// binding reads back exactly what was sent over real HTTP: non-ASCII, '%', quotes, a literal
// %41 and surrounding spaces (which HTTP would trim from a raw value) included.
func TestBinaryHeadersArePercentEncoded(t *testing.T) {
	rcv := testenv.StartReceiver(t, testenv.ReceiverOptions{})
	values := []string{" padded  ", "héllo wörld ✓ 日本", `100% of "quotes"`, "%41 is not A", "plain-ascii:/?#[]@!$&'()*+,;="}
	for i, v := range values {
		e := Event{ID: "evt " + v, Type: "order.created", Source: "/shop/" + url.PathEscape(v), Subject: v, Time: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
			Extensions: map[string]string{"region": v, PartitionKey: "k" + v}, Data: []byte(`{}`)}
		h, body, err := Encode(e, Binary)
		if err != nil {
			t.Fatal(err)
		}
		for k, vs := range h {
			if !strings.HasPrefix(k, "Ce-") {
				continue
			}
			for _, c := range []byte(vs[0]) {
				if c <= ' ' || c >= 0x7f || c == '"' {
					t.Errorf("value %d: header %s %q is not percent-encoded printable ASCII", i, k, vs[0])
					break
				}
			}
		}
		req, _ := http.NewRequest(http.MethodPost, rcv.URL(), bytes.NewReader(body))
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		reqs := rcv.Requests()
		if len(reqs) != i+1 {
			t.Fatalf("the receiver recorded %d requests, want %d", len(reqs), i+1)
		}
		in, _ := http.NewRequest(http.MethodPost, "http://x/", bytes.NewReader(reqs[i].Body))
		in.Header = reqs[i].Header.Clone()
		got, attrs, err := readWithSDK(in, Binary)
		if err != nil {
			t.Fatalf("value %d: %v", i, err)
		}
		if attrs["id"] != e.ID || attrs["source"] != e.Source || attrs["subject"] != v || attrs["region"] != v ||
			attrs[PartitionKey] != "k"+v || !got.Time().Equal(e.Time) {
			t.Errorf("value %d %q read back as %q (wire %v)", i, v, attrs, reqs[i].Header)
		}
	}
}

// What a receiver of the binding decodes is what was encoded; unneeded escapes decode, a '%'
// that escapes nothing is kept, and bytes that are not UTF-8 are refused.
func TestDecodeHeaderValue(t *testing.T) {
	for _, v := range []string{"", "a b", "100%", "é✓", `"q"`, "%41", " x "} {
		if got, err := DecodeHeaderValue(EncodeHeaderValue(v)); err != nil || got != v {
			t.Errorf("%q: encoded %q, decoded %q (%v)", v, EncodeHeaderValue(v), got, err)
		}
	}
	for in, want := range map[string]string{"a%20b": "a b", "%61": "a", "100%": "100%", "%zz": "%zz", "%C3%A9": "é", "50%2": "50%2"} {
		if got, err := DecodeHeaderValue(in); err != nil || got != want {
			t.Errorf("%q decoded %q (%v), want %q", in, got, err, want)
		}
	}
	if _, err := DecodeHeaderValue("%C3"); err == nil {
		t.Error("%C3 alone decoded: it is not UTF-8")
	}
}

// What the ingress stores is what a dispatcher reads back, with the namespace's source when
// the event has none; other producer headers are no attributes.
func TestStoredAttributesRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	in := Event{Source: "//github.com/org/repo", Subject: "pr/7", DataSchema: "https://s/x", Time: at, ContentType: "application/json",
		Extensions: map[string]string{PartitionKey: "k1", "comexampleext": "v"}}
	h := nats.Header{}
	in.SetHeaders(h)
	h.Set("X-Region", "eu")
	h.Set(records.HeaderMsgID, "evt_9")
	h.Set("Ce-Id", "forged")
	out := FromMessage("evt_9", "pr.opened", "ns", at, h, h.Get(records.HeaderContentType), nil)
	if out.Source != in.Source || out.Subject != in.Subject || out.DataSchema != in.DataSchema || out.ID != "evt_9" ||
		len(out.Extensions) != 2 || out.Extensions[PartitionKey] != "k1" || out.Extensions["comexampleext"] != "v" {
		t.Errorf("read back %+v from %v", out, h)
	}
	if h.Get(HeaderPartitionKey) != "k1" {
		t.Errorf("the ordering key is not in %s: %v", HeaderPartitionKey, h)
	}
	if d := FromMessage("evt_9", "t", "ns", at, nats.Header{}, "", nil); d.Source != DefaultSource("ns") {
		t.Errorf("default source %q", d.Source)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		e    Event
		want string
	}{
		{Event{Source: "/ok", Subject: "s"}, ""},
		{Event{Source: "/ok", Subject: "a\nb"}, "control character"},
		{Event{Source: "/ok", Subject: strings.Repeat("x", MaxAttributeBytes+1)}, "at most"},
		{Event{Source: "/ok", DataSchema: "relative"}, "absolute URI"},
		{Event{Source: "/ok", Extensions: map[string]string{"Bad-Name": "v"}}, "not an extension attribute name"},
		{Event{Source: "/ok", Extensions: map[string]string{"traceparent": "v"}}, "not an extension attribute name"},
		{Event{Source: "/ok", ContentType: "not a type"}, "not a media type"},
	} {
		err := tc.e.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.e, err, tc.want)
		}
	}
	many := Event{Source: "/ok", Extensions: map[string]string{}}
	for i := 0; i <= MaxExtensions; i++ {
		many.Extensions["e"+strings.Repeat("x", i)] = "v"
	}
	if err := many.Validate(); err == nil || !strings.Contains(err.Error(), "extension attributes") {
		t.Errorf("too many extensions: %v", err)
	}
}
