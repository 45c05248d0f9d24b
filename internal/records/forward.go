package records

import (
	"net/http"
	"slices"

	"github.com/nats-io/nats.go"
	"golang.org/x/net/http/httpguts"
)

// Bounds of the producer headers forwarded to receivers: at most MaxForwardedHeaders header
// values, MaxForwardedHeaderBytes of names and values together. What does not fit is dropped
// (names in sorted order decide which), never failing the delivery.
const (
	MaxForwardedHeaders     = 16
	MaxForwardedHeaderBytes = 4096
)

// notForwarded are headers a producer may not send to a receiver: the request framing and
// identity the dispatcher owns, trace context (forwarded on its own), and credentials, which
// belong in the endpoint's headersFrom (a Secret, redacted in the delivery log) rather than in
// events that the delivery log and dead letters store.
var notForwarded = map[string]bool{
	"content-type": true, "content-length": true, "transfer-encoding": true, "host": true,
	"user-agent": true, "connection": true, "keep-alive": true, "proxy-connection": true,
	"te": true, "trailer": true, "upgrade": true, "expect": true,
	"traceparent": true, "tracestate": true,
	"authorization": true, "proxy-authorization": true, "cookie": true,
}

// notForwardedPrefixes are header families a producer may not send: JetStream's (Nats-*), the
// operator's own (Whk-*), what the dispatcher sends to receivers (webhook-*, X-Webhook-*), and
// the event's CloudEvents attributes (ce-*), which reach an endpoint as attributes when it
// asks for CloudEvents and only then.
var notForwardedPrefixes = []string{"nats-", "whk-", "webhook-", "x-webhook-", "proxy-", "ce-"}

// ForwardedHeaders returns the headers of a published event (a delivery message's headers)
// that reach the receiver: every producer header except the reserved ones (see notForwarded
// and notForwardedPrefixes) and those that are not valid HTTP (a name that is no token, a
// value with a control character), within the bounds above; names are canonical. The
// endpoint's headers and headersFrom are set after them, so they win on a name clash. Nil
// when nothing is forwarded.
func ForwardedHeaders(h nats.Header) http.Header {
	var names []string
	for k := range h {
		if Forwardable(k) {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	var out http.Header
	count, size := 0, 0
	for _, k := range names {
		for _, v := range h[k] {
			if !httpguts.ValidHeaderFieldValue(v) || count == MaxForwardedHeaders || size+len(k)+len(v) > MaxForwardedHeaderBytes {
				continue
			}
			if out == nil {
				out = make(http.Header, len(names))
			}
			ck := http.CanonicalHeaderKey(k)
			out[ck] = append(out[ck], v)
			count++
			size += len(k) + len(v)
		}
	}
	return out
}

// Forwardable says whether a producer header named name may reach receivers.
func Forwardable(name string) bool {
	if !httpguts.ValidHeaderFieldName(name) || len(name) > 128 {
		return false
	}
	// Lower case on the stack: every header of every event passes here.
	var buf [128]byte
	lk := buf[:len(name)]
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lk[i] = c
	}
	if notForwarded[string(lk)] {
		return false
	}
	for _, p := range notForwardedPrefixes {
		if len(lk) >= len(p) && string(lk[:len(p)]) == p {
			return false
		}
	}
	return true
}
