package intake

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/pull"
)

// Taker is an endpoint's worker as the intake sees it: what it is routed by, whether it has
// room for a view, and where its views go.
type Taker interface {
	// Name is the endpoint's; Config its configuration (nil before it has one).
	Name() string
	Config() *endpoint.Config
	// Share is how many views it may hold now; 0 says it takes none (paused): its views are
	// parked at once.
	Share() int64
	// Reserve takes a place for one more view when it has room now (see Returned).
	Reserve() bool
	// Take hands it view v, for which it reserved a place.
	Take(v *View)
	// Returned gives back the place of a view it took, now settled.
	Returned()
	// Park copies v onto its park subject and settles it (admitting an event first); c is its
	// configuration.
	Park(ctx context.Context, c *endpoint.Config, v *View)
	// Parked tells it how many deliveries its park holds, at the last count.
	Parked(n int64)
	// Changed says its pending deliveries changed.
	Changed()
}

// View is one endpoint's view of a message of the shared lane: many endpoints may see one
// message, which is acknowledged once every view of it is settled. A view handed back is
// parked for its endpoint instead.
type View struct {
	// Msg is the message (shared by every view: read it, never change it), Meta its metadata
	// and Stamp how it came (pull.Stamp.Again).
	Msg   *nats.Msg
	Meta  *jetstream.MsgMetadata
	Stamp pull.Stamp

	share *shared
	owner Taker
	// handed says its owner holds it (a place Reserved), parking that it is being parked.
	handed, parking bool
}

// Ack settles the view: one fewer outstanding on its message.
func (v *View) Ack() { v.share.settled(v, false, 0) }

// HandBack hands the view back: it is parked for its endpoint (or, when it cannot be, or
// the dispatcher stops, goes back with its message after delay).
func (v *View) HandBack(delay time.Duration) { v.share.handedBack(v, delay) }

// Progress says the view is still being worked on.
func (v *View) Progress() { v.share.progress() }
