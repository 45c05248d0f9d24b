package plugin

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A publish acknowledgement of another stream (another connection's publish, answered into
// this connection's inbox) is refused, not reported as this publish's.
func TestCheckAckRefusesAnotherStreamsAcknowledgement(t *testing.T) {
	if err := checkAck(&jetstream.PubAck{Stream: "WEBHOOKS_b", Sequence: 7}, "WEBHOOKS_b"); err != nil {
		t.Errorf("the stream's own acknowledgement: %v", err)
	}
	for _, ack := range []*jetstream.PubAck{{Stream: "WEBHOOKS_a", Sequence: 7}, {}, nil} {
		if err := checkAck(ack, "WEBHOOKS_b"); err == nil || !strings.Contains(err.Error(), "not WEBHOOKS_b") {
			t.Errorf("acknowledgement %+v: %v", ack, err)
		}
	}
}
