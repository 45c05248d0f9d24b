package natsauth

import "github.com/nats-io/jwt/v2"

// Limits bound what one tenant connection may do. The callout writes them into every user JWT
// it issues, and ServerConfig into AccountTenants' limits: nats-server 2.15 enforces the limits
// of an auth callout's user JWT only in operator mode, not in a configuration like this one,
// where the account's limits bound payload and subscriptions per connection instead. No
// nats-server mechanism enforces MaxData today; it is in the JWT for servers that will.
type Limits struct {
	// MaxPayload is the largest message the connection may publish, in bytes.
	MaxPayload int64
	// MaxSubscriptions is how many subscriptions the connection may hold at once.
	MaxSubscriptions int64
	// MaxData bounds the bytes of the messages the connection may have outstanding.
	MaxData int64
}

// DefaultLimits are the limits of a connection unless the installation sets others: a
// payload of 1 MiB plus headroom for headers (the largest event delivered is 1 MiB by
// default), 4096 subscriptions (a dispatcher has one per replica and a few per request in
// flight), and 64 MiB of data.
var DefaultLimits = Limits{MaxPayload: 1<<20 + 64<<10, MaxSubscriptions: 4096, MaxData: 64 << 20}

// apply writes l, with DefaultLimits for its zero fields, into a user's limits.
func (l Limits) apply(n *jwt.Limits) {
	d := DefaultLimits
	pick := func(v, def int64) int64 {
		if v != 0 {
			return v
		}
		return def
	}
	n.Payload = pick(l.MaxPayload, d.MaxPayload)
	n.Subs = pick(l.MaxSubscriptions, d.MaxSubscriptions)
	n.Data = pick(l.MaxData, d.MaxData)
}
