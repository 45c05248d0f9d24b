package natsauth

import (
	"crypto/sha256"
	"strings"
	"testing"
)

// The bounds of pending requests: in all, per host, per namespace and per token, each refusing
// with its own reason, and a released request making room again.
func TestPendingBounds(t *testing.T) {
	p := newPending(5, 3, 3, 2)
	key := func(host, ns, tok string) pendingKeys {
		return pendingKeys{host: host, namespace: ns, token: sha256.Sum256([]byte(tok))}
	}
	steps := []struct {
		k    pendingKeys
		want string // "" admitted, else a part of the refusal
	}{
		{key("h1", "a", "t1"), ""},
		{key("h1", "a", "t1"), ""},
		{key("h2", "b", "t1"), "the bound per token"},
		{key("h1", "b", "t2"), ""},
		{key("h1", "c", "t3"), "the bound per client host"},
		{key("h2", "a", "t4"), ""},
		{key("h3", "a", "t5"), "the bound per namespace"},
		{key("h3", "c", "t6"), ""},
		{key("h4", "d", "t7"), "its bound"},
	}
	for i, s := range steps {
		err := p.acquire(s.k)
		switch {
		case s.want == "" && err != nil:
			t.Fatalf("step %d: refused: %v", i, err)
		case s.want != "" && (err == nil || !strings.Contains(err.Error(), s.want)):
			t.Fatalf("step %d: %v, want a refusal with %q", i, err, s.want)
		}
	}
	p.release(key("h1", "a", "t1"))
	if err := p.acquire(key("h4", "d", "t7")); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for _, k := range []pendingKeys{key("h1", "a", "t1"), key("h1", "b", "t2"), key("h2", "a", "t4"), key("h3", "c", "t6"), key("h4", "d", "t7")} {
		p.release(k)
	}
	if p.total != 0 || len(p.hosts)+len(p.namespaces)+len(p.tokens) != 0 {
		t.Errorf("after every release: %d pending, %d hosts, %d namespaces, %d tokens remembered", p.total, len(p.hosts), len(p.namespaces), len(p.tokens))
	}
}
