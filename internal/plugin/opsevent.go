package plugin

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// maxReplayEventSample bounds the deliveries a replay.completed event names.
const maxReplayEventSample = 10

// announceReplay publishes the webhook_operator.replay.completed operational event of a replay
// that went through dead letters: counts, the idempotency key and the first new deliveries.
// Its id comes from the idempotency key (the same keyed replay run twice within the duplicate
// window is one event), else from the time. The replay itself is done: a failure to publish
// is a warning, not an error.
func (o *Options) announceReplay(ctx context.Context, js jetstream.JetStream, r *ReplayReport, key string) {
	if len(r.Results) == 0 {
		return
	}
	now := o.Now()
	var created []string
	for _, res := range r.Results {
		if res.Status == ReplayCreated && len(created) < maxReplayEventSample {
			created = append(created, res.DeliveryID)
		}
	}
	data := map[string]any{"created": r.Created, "alreadyReplayed": r.Already, "refused": r.Refused, "failed": r.Failed,
		"idempotencyKey": key, "deliveries": created}
	id := "key:" + key
	if key == "" {
		id = "at:" + strconv.FormatInt(now.UnixNano(), 10)
	}
	ev := records.NewOpsEvent(r.Namespace, r.Endpoint, records.OpsReplayCompleted, id, now, data)
	msg, err := records.OpsEventMessage(o.Set(r.Namespace).EventSubject(ev.Type), ev)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = js.PublishMsg(pctx, msg)
		cancel()
	}
	if err != nil {
		fmt.Fprintf(o.IO.ErrOut, "warning: the replay is done, but its %s event could not be published: %v\n", ev.Type, err)
	}
}
