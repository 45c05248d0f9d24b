package streamread_test

import (
	"context"
	"encoding/base64"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Every request of a reader names a reply inbox no other connection can guess (issue 30: a
// tenant's requests could name another's inbox as their reply): one inbox per request,
// ending in 18 bytes from a cryptographic source, never the connection's shared reply
// subject with a counter. A subscription that sees the API's requests (as the server does)
// records them here.
func TestRequestInboxesAreUnguessable(t *testing.T) {
	for _, direct := range []bool{true, false} {
		// The reader's own connection sees its requests too (echo).
		spy, st, _ := open(t, direct, 50, 2)
		ctx := context.Background()
		var mu sync.Mutex
		var replies []string
		for _, api := range []string{"$JS.API.DIRECT.GET.S", "$JS.API.DIRECT.GET.S.>", "$JS.API.STREAM.MSG.GET.S"} {
			if _, err := spy.Subscribe(api, func(m *nats.Msg) {
				mu.Lock()
				replies = append(replies, m.Reply)
				mu.Unlock()
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if _, err := st.Forward(ctx, "s.0", 1, 5); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Last(ctx, "s.1"); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(replies) >= 20 }, "the spy saw too few requests")
		mu.Lock()
		seen := map[string]bool{}
		for _, r := range replies {
			i := strings.LastIndexByte(r, '.')
			token, err := base64.RawURLEncoding.DecodeString(r[i+1:])
			if i < 0 || !strings.HasPrefix(r, nats.InboxPrefix) || err != nil || len(token) != 18 {
				t.Errorf("direct=%v: reply %q does not end in 18 random bytes", direct, r)
			}
			if seen[r] {
				t.Errorf("direct=%v: reply %q named by two requests", direct, r)
			}
			seen[r] = true
		}
		mu.Unlock()
	}
}
