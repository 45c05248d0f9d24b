package signing

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// FuzzSignVerifies signs random ids, bodies and timestamps with random keys, with and without
// a rotation, and verifies every signature with the official Standard Webhooks library, as a
// receiver holding either secret would.
func FuzzSignVerifies(f *testing.F) {
	f.Add("msg_p5jXN8AQM9LWM0D4loKWxJek", []byte(`{"test": 2432232314}`), int64(1614265330), []byte("0123456789abcdef"), []byte{})
	f.Add("evt-1", []byte{}, int64(0), []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210"))
	f.Add("a.b.c", []byte("v1,xyz v1,abc"), int64(-1), []byte(strings.Repeat("k", 100)), []byte(strings.Repeat("p", 64)))
	f.Add(strings.Repeat("id", 100), []byte("\x00\xff\n."), int64(1<<40), []byte("kkkkkkkkkkkkkkkk"), []byte("kkkkkkkkkkkkkkkk"))
	f.Add("ünïcødé id", []byte("é"), int64(time.Now().Unix()), []byte("0123456789abcdefX"), []byte("short"))
	f.Fuzz(func(t *testing.T, id string, body []byte, unix int64, curKey, prevKey []byte) {
		if id == "" || len(curKey) < MinKeyBytes {
			return // the dispatcher never signs without an id; ParseSecret refuses short keys
		}
		cur := mustParse(t, Prefix+base64.StdEncoding.EncodeToString(curKey))
		var prev *Secret
		if len(prevKey) >= MinKeyBytes {
			p := mustParse(t, base64.RawStdEncoding.EncodeToString(prevKey))
			prev = &p
		}
		signer := NewSigner(cur, prev)
		ts := time.Unix(unix, 0)
		sig := signer.Sign(id, ts, body)
		if got := string(signer.AppendSign([]byte("x"), id, ts, body)); got != "x"+sig {
			t.Fatalf("AppendSign = %q, Sign = %q", got, sig)
		}
		want := 1
		if prev != nil && string(prevKey) != string(curKey) {
			want = 2
		}
		if n := len(strings.Split(sig, " ")); n != want {
			t.Fatalf("%d signatures in %q, want %d", n, sig, want)
		}

		h := http.Header{}
		h.Set(standardwebhooks.HeaderWebhookID, id)
		h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(unix, 10))
		h.Set(standardwebhooks.HeaderWebhookSignature, sig)
		keys := [][]byte{curKey}
		if prev != nil {
			keys = append(keys, prevKey)
		}
		for _, key := range keys {
			wh, _ := standardwebhooks.NewWebhookRaw(key)
			if err := wh.VerifyIgnoringTimestamp(body, h); err != nil {
				t.Fatalf("official library, key %x: %v (id %q, ts %d, sig %q)", key, err, id, unix, sig)
			}
		}
		// With a current timestamp, the full Verify (tolerance included) passes too.
		now := time.Now()
		h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
		h.Set(standardwebhooks.HeaderWebhookSignature, signer.Sign(id, now, body))
		wh, _ := standardwebhooks.NewWebhookRaw(curKey)
		if err := wh.Verify(body, h); err != nil {
			t.Fatalf("official library, now: %v", err)
		}
	})
}

// FuzzParseSecret: ParseSecret never panics, never puts the input in an error, and what it
// accepts round-trips through the official library's decoding.
func FuzzParseSecret(f *testing.F) {
	for _, s := range []string{secretA, secretB, officialExample, "", "whsec_", "whsec_!!", "whsec_" + strings.Repeat("A", 22), " whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sec, err := ParseSecret(s)
		if err != nil {
			body := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), Prefix))
			if len(body) >= 8 && strings.Contains(err.Error(), body) {
				t.Fatalf("error %q contains the secret", err)
			}
			return
		}
		if len(sec.bytes()) < MinKeyBytes {
			t.Fatalf("accepted a %d-byte key", len(sec.bytes()))
		}
		reencoded := Prefix + base64.StdEncoding.EncodeToString(sec.bytes())
		ts := time.Now()
		sig := NewSigner(sec, nil).Sign("id", ts, []byte("b"))
		if err := verify(t, reencoded, "id", ts, []byte("b"), sig); err != nil {
			t.Fatal(err)
		}
	})
}
