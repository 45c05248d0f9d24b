package records

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// EventID is the id of the event stored at seq in stream with headers h: the producer's
// Nats-Msg-Id, or, without one, an id derived from the stream and the sequence
// (evt_<stream in lower case>_<seq>). A dispatcher names an event by it when it delivers the
// event, and a recover finds the event again by it.
func EventID(stream string, seq uint64, h nats.Header) string {
	if id := h.Get(HeaderMsgID); id != "" {
		return id
	}
	return "evt_" + strings.ToLower(stream) + "_" + strconv.FormatUint(seq, 10)
}

// EventTime is the time of an event with headers h stored at stored: its Webhook-Event-Time
// header when it holds an RFC 3339 time, else stored.
func EventTime(h nats.Header, stored time.Time) time.Time {
	if v := h.Get(HeaderEventTime); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t
		}
	}
	return stored
}
