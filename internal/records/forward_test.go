package records

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// Producer headers reach receivers except the reserved ones and invalid ones, bounded.
func TestForwardedHeaders(t *testing.T) {
	h := nats.Header{
		"x-tenant":            {"acme"},
		"X-Multi":             {"a", "b"},
		"Nats-Msg-Id":         {"evt_1"},
		"Whk-Test":            {"true"},
		"Whk-Replay-Of":       {"whdl_x"},
		"webhook-signature":   {"v1,forged"},
		"X-Webhook-Event-Id":  {"forged"},
		"Content-Type":        {"application/json"},
		"Content-Length":      {"1"},
		"Host":                {"evil.example"},
		"Connection":          {"close"},
		"Transfer-Encoding":   {"chunked"},
		"Authorization":       {"Bearer t"},
		"Proxy-Authorization": {"x"},
		"Cookie":              {"a=b"},
		"traceparent":         {"00-x"},
		"X-Bad-Value":         {"a\r\nInjected: 1"},
		"Bad Name":            {"x"},
		"X-Del":               {"a\x7f"},
		"X-Tab":               {"a\tb"},
	}
	want := http.Header{"X-Tenant": {"acme"}, "X-Multi": {"a", "b"}, "X-Tab": {"a\tb"}}
	if got := ForwardedHeaders(h); !reflect.DeepEqual(got, want) {
		t.Errorf("ForwardedHeaders = %v, want %v", got, want)
	}
	if got := ForwardedHeaders(nats.Header{"Nats-Msg-Id": {"x"}}); got != nil {
		t.Errorf("nothing to forward gave %v", got)
	}

	// Bounds: at most MaxForwardedHeaders values, MaxForwardedHeaderBytes in all.
	many := nats.Header{}
	for i := range 40 {
		many.Set(fmt.Sprintf("X-H%02d", i), "v")
	}
	got := ForwardedHeaders(many)
	if len(got) != MaxForwardedHeaders || got.Get("X-H00") != "v" || got.Get("X-H15") != "v" || got.Get("X-H16") != "" {
		t.Errorf("40 headers forwarded as %d (want the first %d by name): %v", len(got), MaxForwardedHeaders, got)
	}
	big := nats.Header{"X-A": {strings.Repeat("a", 3000)}, "X-B": {strings.Repeat("b", 3000)}, "X-C": {"c"}}
	got = ForwardedHeaders(big)
	if got.Get("X-A") == "" || got.Get("X-B") != "" || got.Get("X-C") != "c" {
		t.Errorf("over %d bytes, forwarded %v", MaxForwardedHeaderBytes, got)
	}
}
