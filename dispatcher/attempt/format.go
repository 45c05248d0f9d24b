package attempt

import (
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/chatformat"
	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// CloudEvent makes req a CloudEvent when the endpoint asks for one (spec.format), of
// the event whose delivery is meta and whose stored headers are h, with the body req already
// holds (the event's, or its transformation's) as the data; the signature is then made over
// the body it sets. Its id is the webhook-id. Nothing changes for a raw endpoint.
func CloudEvent(c *endpoint.Config, meta records.DeliveryMeta, h nats.Header, req *Request) error {
	if c.CloudEvents == "" {
		return nil
	}
	ev := cloudevent.FromMessage(meta.WebhookID(), meta.EventType, meta.Origin(), meta.EventTime, h, req.ContentType, req.Body)
	if meta.EventNamespace != "" {
		// A source namespace's producer does not choose where its events seem to come from
		// (the reader's own source, say): their source is always their namespace's.
		ev.Source = cloudevent.DefaultSource(meta.EventNamespace)
	}
	ceh, body, err := cloudevent.Encode(ev, c.CloudEvents)
	if err != nil {
		return fmt.Errorf("the event cannot be delivered as a CloudEvent: %w", err)
	}
	req.Body, req.ContentType = body, ceh.Get("Content-Type")
	delete(ceh, "Content-Type")
	if req.Extra == nil {
		req.Extra = make(http.Header, len(ceh))
	}
	for k, v := range ceh {
		req.Extra[k] = v
	}
	return nil
}

// Chat makes req's body a Slack or Teams message written from the event when the
// endpoint asks for one (spec.format), from the event's body as stored (the schema keeps
// transform.body off such an endpoint); the signature is then made over the message.
func Chat(c *endpoint.Config, meta records.DeliveryMeta, body []byte, req *Request) error {
	if c.Chat == "" {
		return nil
	}
	ns := meta.EventNamespace
	if ns == "" {
		ns = meta.Namespace
	}
	b, ct, err := chatformat.Message(c.Chat, chatformat.Event{ID: meta.WebhookID(), Type: meta.EventType, Namespace: ns, Time: meta.EventTime, Body: body})
	if err != nil {
		return fmt.Errorf("the event cannot be delivered as a %s message: %w", c.Chat, err)
	}
	req.Body, req.ContentType = b, ct
	return nil
}
