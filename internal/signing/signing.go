// Package signing signs webhook requests as Standard Webhooks (https://www.standardwebhooks.com)
// specifies: the webhook-signature header is "v1,<base64 of HMAC-SHA256(key, id.timestamp.body)>",
// and during a secret rotation it carries a signature with each secret, space-separated, so
// receivers holding either secret verify.
//
// Secrets never print: Secret and Signer format as a redaction with every fmt verb, in slog
// and in logr, and errors about a secret never contain it.
package signing

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"hash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Prefix starts a Standard Webhooks secret: "whsec_" followed by the base64 of the key.
const Prefix = "whsec_"

// MinKeyBytes is the shortest key ParseSecret accepts (128 bits). Standard Webhooks
// recommends 24 to 64 random bytes; GenerateSecret makes 32.
const MinKeyBytes = 16

// redacted is how a Secret prints.
const redacted = Prefix + "***"

// Secret is a decoded signing key. It prints as "whsec_***" whatever the verb, so a %v or %+v
// in a log can never leak it, not even as an unexported field of another struct, where fmt
// cannot call its methods: the key is held by a closure, and fmt prints a func as an address.
// The zero Secret is an empty key.
type Secret struct {
	key func() []byte
}

func secretOf(b []byte) Secret { return Secret{key: func() []byte { return b }} }

func (s Secret) bytes() []byte {
	if s.key == nil {
		return nil
	}
	return s.key()
}

// ParseSecret decodes "whsec_<base64>" (standard base64, padded or not), or the same without
// the prefix. Surrounding whitespace (a trailing newline in a Secret file) is ignored. The key
// must be at least MinKeyBytes long. Errors never contain the secret or any part of it.
func ParseSecret(s string) (Secret, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, Prefix)
	if s == "" {
		return Secret{}, fmt.Errorf("signing secret is empty: want %s followed by the base64 of %d to 64 random bytes", Prefix, MinKeyBytes)
	}
	enc := base64.StdEncoding
	if !strings.HasSuffix(s, "=") && len(s)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	key, err := enc.Strict().DecodeString(s)
	if err != nil {
		// Deliberately not wrapping err: it quotes a position in the secret.
		return Secret{}, fmt.Errorf("signing secret is not valid: want %s followed by standard base64 (A-Z, a-z, 0-9, '+', '/'), %d characters given", Prefix, len(s))
	}
	if len(key) < MinKeyBytes {
		return Secret{}, fmt.Errorf("signing secret is too short: %d bytes, want at least %d (24 to 64 random bytes recommended)", len(key), MinKeyBytes)
	}
	return secretOf(key), nil
}

// GenerateSecret returns a new secret: "whsec_" followed by the base64 of 32 random bytes.
func GenerateSecret() (string, error) {
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return "", fmt.Errorf("generating a signing secret: %w", err)
	}
	return Prefix + base64.StdEncoding.EncodeToString(key[:]), nil
}

// Equal reports, in constant time, whether s and o are the same key.
func (s Secret) Equal(o Secret) bool { return subtle.ConstantTimeCompare(s.bytes(), o.bytes()) == 1 }

// IsZero reports whether s is the zero Secret (no key).
func (s Secret) IsZero() bool { return len(s.bytes()) == 0 }

// String returns a redaction.
func (s Secret) String() string { return redacted }

// GoString returns a redaction, for %#v.
func (s Secret) GoString() string { return "signing.Secret{" + redacted + "}" }

// Format prints a redaction for every verb.
func (s Secret) Format(f fmt.State, verb rune) { formatRedacted(f, verb, s.GoString()) }

// LogValue returns a redaction for log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalLog returns a redaction for github.com/go-logr/logr.
func (s Secret) MarshalLog() any { return redacted }

// MarshalText returns a redaction, so encoders (JSON, YAML) never see the key.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

func formatRedacted(f fmt.State, verb rune, gostring string) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(gostring))
		return
	}
	_, _ = f.Write([]byte(redacted))
}

// Signer signs with a current secret and, during a rotation, a previous one. It is safe for
// concurrent use.
type Signer struct {
	current  *keyed
	previous *keyed // nil outside a rotation
	// end, when not zero, ends the rotation: a request timestamped at or after it is signed
	// with the current secret alone.
	end time.Time
}

// keyed holds a key and a pool of HMAC states keyed with it, so signing does not allocate.
// The key itself lives only in the pool's New closure, and the pool's contents sit behind
// unsafe pointers: nothing of it prints.
type keyed struct {
	pool sync.Pool // of *macState
}

type macState struct {
	mac     hash.Hash
	scratch [64]byte
}

func newKeyed(s Secret) *keyed {
	key := append([]byte(nil), s.bytes()...)
	k := &keyed{}
	k.pool.New = func() any { return &macState{mac: hmac.New(sha256.New, key)} }
	return k
}

// NewSigner returns a Signer for current and, when previous is not nil and differs from
// current, the previous secret too. Secrets come from ParseSecret; a zero Secret would sign
// with an empty key.
func NewSigner(current Secret, previous *Secret) *Signer {
	return NewSignerUntil(current, previous, time.Time{})
}

// NewSignerUntil is NewSigner for a rotation that ends at end (zero: when previous is let
// go): the previous secret signs the requests timestamped before end, and no other. The end
// is kept to the request, not to when a configuration is rebuilt.
func NewSignerUntil(current Secret, previous *Secret, end time.Time) *Signer {
	s := &Signer{current: newKeyed(current), end: end}
	if previous != nil && !previous.Equal(current) {
		s.previous = newKeyed(*previous)
	}
	return s
}

// Rotating reports whether s holds a previous secret (which signs until its end, if any).
func (s *Signer) Rotating() bool { return s.previous != nil }

// signsPrevious reports whether a request timestamped ts is signed with the previous secret.
func (s *Signer) signsPrevious(ts time.Time) bool {
	return s.previous != nil && (s.end.IsZero() || ts.Before(s.end))
}

// SignatureLen is the length of one "v1,<base64>" signature.
const SignatureLen = len("v1,") + 44

// Sign returns the value of the webhook-signature header for a message id, a timestamp (its
// Unix seconds, the same value as the webhook-timestamp header) and the body as sent:
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>", and during rotation (before its end) two
// space-separated signatures (current first).
func (s *Signer) Sign(id string, ts time.Time, body []byte) string {
	var buf [2*SignatureLen + 1]byte
	return string(s.AppendSign(buf[:0], id, ts, body))
}

// AppendSign appends what Sign returns to dst. It allocates only when dst lacks capacity.
func (s *Signer) AppendSign(dst []byte, id string, ts time.Time, body []byte) []byte {
	unix := ts.Unix()
	dst = s.current.appendSignature(dst, id, unix, body)
	if s.signsPrevious(ts) {
		dst = append(dst, ' ')
		dst = s.previous.appendSignature(dst, id, unix, body)
	}
	return dst
}

func (k *keyed) appendSignature(dst []byte, id string, unix int64, body []byte) []byte {
	st := k.pool.Get().(*macState)
	st.mac.Reset()
	// The id is copied through scratch: writing []byte(id) to the hash would allocate.
	for rest := id; len(rest) > 0; {
		n := copy(st.scratch[:], rest)
		st.mac.Write(st.scratch[:n])
		rest = rest[n:]
	}
	b := append(st.scratch[:0], '.')
	b = strconv.AppendInt(b, unix, 10)
	b = append(b, '.')
	st.mac.Write(b)
	st.mac.Write(body)
	sum := st.mac.Sum(st.scratch[:0])
	dst = append(dst, "v1,"...)
	dst = base64.StdEncoding.AppendEncode(dst, sum)
	k.pool.Put(st)
	return dst
}

// String returns a redaction.
func (s *Signer) String() string {
	if s != nil && s.previous != nil {
		return "signing.Signer{current: " + redacted + ", previous: " + redacted + "}"
	}
	return "signing.Signer{current: " + redacted + "}"
}

// GoString returns a redaction, for %#v.
func (s *Signer) GoString() string { return s.String() }

// Format prints a redaction for every verb.
func (s *Signer) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// LogValue returns a redaction for log/slog.
func (s *Signer) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalLog returns a redaction for github.com/go-logr/logr.
func (s *Signer) MarshalLog() any { return s.String() }
