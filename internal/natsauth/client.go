package natsauth

import (
	"crypto/rand"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnectTimeout bounds a connection's handshake through the callout: a TokenReview and a few
// SubjectAccessReviews on the way.
const ConnectTimeout = 10 * time.Second

// NewInbox returns a new random inbox prefix: 22 letters and digits after _INBOX_.
func NewInbox() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 22)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "_INBOX_" + string(b)
}

// ClientOptions connect through the callout: token is called at every (re)connection, so a
// refreshed token file is read again; the namespace is the NATS user and a new random inbox
// prefix, the only subjects the connection may subscribe to, is the password.
func ClientOptions(token func() string, namespace string) []nats.Option {
	inbox := NewInbox()
	return []nats.Option{
		nats.TokenHandler(token),
		nats.UserInfo(namespace, inbox),
		nats.CustomInboxPrefix(inbox),
		nats.Timeout(ConnectTimeout),
	}
}
