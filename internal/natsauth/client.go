package natsauth

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ConnectTimeout bounds a connection's handshake through the callout: a TokenReview and a few
// SubjectAccessReviews on the way.
const ConnectTimeout = 10 * time.Second

// InboxOf is the inbox prefix of the connection that proves the user nkey pub: the only
// subjects it may subscribe to are InboxOf(pub)+".>". The callout derives it from the key whose
// signature of the server's nonce it has verified, so no connection can name another's.
func InboxOf(pub string) string { return "_INBOX_" + pub }

// ClientOptions connect through the callout: token is called at every (re)connection, so a
// refreshed token file is read again; the namespace is the NATS user. Each call makes a new
// user nkey, which the connection (and its reconnections) proves by signing the server's
// nonce: its inbox prefix is InboxOf that key, and no other connection can subscribe there.
// The key lives in memory only.
func ClientOptions(token func() string, namespace string) []nats.Option {
	kp, err := nkeys.CreateUser()
	if err != nil {
		panic(err) // only when the system's random source fails
	}
	pub, err := kp.PublicKey()
	if err != nil {
		panic(err)
	}
	return []nats.Option{
		nats.TokenHandler(token),
		nats.UserInfo(namespace, ""),
		nats.Nkey(pub, kp.Sign),
		nats.CustomInboxPrefix(InboxOf(pub)),
		nats.Timeout(ConnectTimeout),
	}
}
