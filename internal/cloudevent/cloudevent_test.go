package cloudevent

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/records"
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
				got, err := cehttp.NewEventFromHTTPRequest(req)
				if err != nil {
					t.Fatalf("the SDK cannot read the request (%v): %v\n%s", h, err, body)
				}
				if got.ID() != "evt_1" || got.Type() != "order.created" || got.Source() != "/shop" || got.Subject() != "orders/o-1" ||
					got.DataSchema() != "https://example.com/order.json" || !got.Time().Equal(at) {
					t.Errorf("attributes: %s", got)
				}
				if ext := got.Extensions(); ext[PartitionKey] != "o-1" || ext["region"] != "eu \"west\" %" {
					t.Errorf("extensions %v", ext)
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
