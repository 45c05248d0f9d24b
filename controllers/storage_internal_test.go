package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func TestStorageCondition(t *testing.T) {
	set := streams.DefaultConfig().For("shop")
	info := func(name string, maxBytes, maxMsgs int64, maxAge time.Duration, bytes, msgs uint64) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{
			Config: jetstream.StreamConfig{Name: name, MaxBytes: maxBytes, MaxMsgs: maxMsgs, MaxAge: maxAge},
			State:  jetstream.StreamState{Bytes: bytes, Msgs: msgs},
		}
	}
	dlq := func(maxBytes, maxMsgs int64, bytes, msgs uint64) *jetstream.StreamInfo {
		return info(set.DeadLetterStream(), maxBytes, maxMsgs, 0, bytes, msgs)
	}
	log := func(maxBytes int64, bytes uint64) *jetstream.StreamInfo {
		return info(set.AttemptsStream(), maxBytes, -1, 30*24*time.Hour, bytes, 10)
	}
	dl := func(maxBytes, maxMsgs int64, bytes, msgs uint64) *jetstream.StreamInfo {
		return info(set.DeliveriesStream(), maxBytes, maxMsgs, 0, bytes, msgs)
	}
	roomy := dl(1000, 100, 10, 1)
	for _, tc := range []struct {
		name      string
		dlq, log  *jetstream.StreamInfo
		status    string
		reason    string
		mentioned []string
		dl        *jetstream.StreamInfo // nil: roomy
	}{
		{"room in both", dlq(1000, -1, 900, 9), log(1000, 940), "False", v1alpha1.ReasonWithinLimits,
			[]string{"WEBHOOKS_DLQ_shop (limit 1k)", "WEBHOOKS_ATTEMPTS_shop (limit 1k)"}, nil},
		{"unbounded", dlq(-1, -1, 1<<40, 9), log(-1, 1<<40), "False", v1alpha1.ReasonWithinLimits,
			[]string{"limit none"}, nil},
		{"dead letters at 95% of their bytes", dlq(1000, -1, 950, 9), log(1000, 10), "True", v1alpha1.ReasonDeadLetterStreamFull,
			[]string{"WEBHOOKS_DLQ_shop", "95% of its 1k limit", "New dead letters are refused", "--dead-letter-max-bytes", "nats stream purge WEBHOOKS_DLQ_shop"}, nil},
		{"dead letters at their count", dlq(-1, 5, 100, 5), log(1000, 10), "True", v1alpha1.ReasonDeadLetterStreamFull,
			[]string{"its limit of 5 dead letters"}, nil},
		{"log at its bytes", dlq(1000, -1, 10, 1), log(1000, 999), "True", v1alpha1.ReasonDeliveryLogAtLimit,
			[]string{"WEBHOOKS_ATTEMPTS_shop", "1k", "before they are 30 days old", "--attempts-max-bytes"}, nil},
		{"both: the dead letters first, the log too", dlq(1000, -1, 1000, 10), log(1000, 1000), "True", v1alpha1.ReasonDeadLetterStreamFull,
			[]string{"100% of its 1k limit", "WEBHOOKS_ATTEMPTS_shop"}, nil},
		{"deliveries below the hold threshold", dlq(1000, -1, 10, 1), log(1000, 10), "False", v1alpha1.ReasonWithinLimits,
			[]string{"deliveries stream WEBHOOKS_DELIVERIES_shop (limit 1k)"}, dl(1000, 100, 799, 79)},
		{"deliveries at 80% of their bytes", dlq(1000, -1, 10, 1), log(1000, 999), "True", v1alpha1.ReasonDeliveriesStreamFull,
			[]string{"WEBHOOKS_DELIVERIES_shop", "80% of its 1k limit", "events stream", "none is dropped", "--deliveries-max-bytes", "WEBHOOKS_ATTEMPTS_shop"}, dl(1000, 100, 800, 10)},
		{"deliveries at 80% of their messages", dlq(1000, -1, 10, 1), log(1000, 10), "True", v1alpha1.ReasonDeliveriesStreamFull,
			[]string{"80% of its limit of 100 messages"}, dl(-1, 100, 10, 80)},
		{"dead letters before deliveries", dlq(1000, -1, 1000, 10), log(1000, 10), "True", v1alpha1.ReasonDeadLetterStreamFull,
			nil, dl(1000, 100, 1000, 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dl == nil {
				tc.dl = roomy
			}
			c := storageCondition(set, tc.dlq, tc.dl, tc.log)
			if c.Type != v1alpha1.ConditionStorageLimitReached || string(c.Status) != tc.status || c.Reason != tc.reason {
				t.Fatalf("got %s %s/%s, want %s/%s: %s", c.Type, c.Status, c.Reason, tc.status, tc.reason, c.Message)
			}
			for _, want := range tc.mentioned {
				if !strings.Contains(c.Message, want) {
					t.Errorf("message %q does not mention %q", c.Message, want)
				}
			}
		})
	}
}
