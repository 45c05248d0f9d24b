package signing

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Secrets used by the tests. officialExample is the one in the Standard Webhooks library's
// own tests.
const (
	officialExample = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretA         = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB         = "whsec_Dt3OXbRlKbdFvD6W8W8ycJf2oGrIiPgcRV30TeLp7+8="
)

func mustParse(t testing.TB, s string) Secret {
	t.Helper()
	sec, err := ParseSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// verify checks header value sig with the official library holding secret.
func verify(t testing.TB, secret, id string, ts time.Time, body []byte, sig string) error {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(standardwebhooks.HeaderWebhookID, id)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	return wh.Verify(body, h)
}

func TestParseSecret(t *testing.T) {
	key32 := bytes.Repeat([]byte{0xfb}, 32)
	cases := []struct {
		name, in string
		want     []byte // nil means an error
		errHas   string
	}{
		{"prefixed", "whsec_" + base64.StdEncoding.EncodeToString(key32), key32, ""},
		{"raw base64", base64.StdEncoding.EncodeToString(key32), key32, ""},
		{"unpadded", "whsec_" + base64.RawStdEncoding.EncodeToString(key32), key32, ""},
		{"trailing newline", "whsec_" + base64.StdEncoding.EncodeToString(key32) + "\n", key32, ""},
		{"official example", officialExample, mustDecode(officialExample), ""},
		{"16 bytes", base64.StdEncoding.EncodeToString(key32[:16]), key32[:16], ""},
		{"empty", "", nil, "empty"},
		{"prefix only", "whsec_", nil, "empty"},
		{"too short", "whsec_" + base64.StdEncoding.EncodeToString([]byte("hunter2hunter2")), nil, "too short: 14 bytes"},
		{"url-safe alphabet", "whsec_" + base64.URLEncoding.EncodeToString(key32), nil, "not valid"},
		{"not base64", "whsec_this is not base64!!", nil, "not valid"},
		{"bad padding", "whsec_" + base64.StdEncoding.EncodeToString(key32)[:42] + "==", nil, "not valid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSecret(tc.in)
			if tc.want == nil {
				if err == nil {
					t.Fatal("no error")
				}
				if !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %q does not contain %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(s.bytes(), tc.want) {
				t.Fatalf("key = %x, want %x", s.bytes(), tc.want)
			}
		})
	}
}

func mustDecode(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// Errors about a secret never contain it, nor any run of it longer than a few characters.
func TestParseSecretErrorsNeverContainTheSecret(t *testing.T) {
	for _, in := range []string{
		"whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ*",      // one bad character at the end
		"whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=extra", // data after padding
		"c2VjcmV0LXNlY3JldC1zZWNyZXQ_-",           // URL alphabet
		"whsec_c2VjcmV0c2VjcmV0",                  // valid but too short
		"whsec_s3cr3t-p@ssw0rd-the-user-pasted-verbatim",
	} {
		_, err := ParseSecret(in)
		if err == nil {
			t.Fatalf("ParseSecret(%q) succeeded", in)
		}
		body := strings.TrimPrefix(in, Prefix)
		for i := 0; i+6 <= len(body); i++ {
			if strings.Contains(err.Error(), body[i:i+6]) {
				t.Fatalf("error %q contains %q from the secret", err, body[i:i+6])
			}
		}
	}
}

func TestSecretNeverPrints(t *testing.T) {
	sec := mustParse(t, secretB)
	key := sec.bytes()
	prev := mustParse(t, secretA)
	signer := NewSigner(sec, &prev)
	type holder struct {
		Exported   Secret
		unexported Secret
		Ptr        *Secret
		Signer     *Signer
		signer     *Signer
		signerVal  Signer
	}
	h := holder{Exported: sec, unexported: sec, Ptr: &sec, Signer: signer, signer: signer, signerVal: *signer}

	var outs []string
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		outs = append(outs, fmt.Sprintf(f, sec), fmt.Sprintf(f, &sec), fmt.Sprintf(f, h), fmt.Sprintf(f, &h),
			fmt.Sprintf(f, signer), fmt.Sprintf(f, []Secret{sec}), fmt.Sprintf(f, map[string]Secret{"k": sec}))
	}
	outs = append(outs, sec.String(), sec.GoString(), fmt.Sprint(sec), fmt.Sprintln(sec, signer), signer.String())
	j, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	outs = append(outs, string(j))
	var logBuf bytes.Buffer
	for _, handler := range []slog.Handler{slog.NewTextHandler(&logBuf, nil), slog.NewJSONHandler(&logBuf, nil)} {
		slog.New(handler).Info("rotating", "secret", sec, "signer", signer, "holder", h)
	}
	outs = append(outs, logBuf.String())

	forbidden := []string{
		base64.StdEncoding.EncodeToString(key), base64.RawStdEncoding.EncodeToString(key)[:20],
		fmt.Sprintf("%x", key[:8]), fmt.Sprintf("%X", key[:8]), fmt.Sprint(key[:6]), fmt.Sprintf("%q", key[:6]),
		strings.Trim(fmt.Sprint(key[:6]), "[]"), string(key[:8]),
		strings.TrimPrefix(secretA, Prefix)[:20],
	}
	for _, out := range outs {
		if !strings.Contains(out, "***") {
			t.Errorf("output %q shows no redaction", out)
		}
		for _, bad := range forbidden {
			if strings.Contains(out, bad) {
				t.Fatalf("output %q leaks the key (%q)", out, bad)
			}
		}
	}
	if got := fmt.Sprintf("%v|%+v|%s", sec, sec, sec); got != "whsec_***|whsec_***|whsec_***" {
		t.Errorf("Secret prints as %q", got)
	}
	if got := fmt.Sprintf("%#v", sec); got != "signing.Secret{whsec_***}" {
		t.Errorf("%%#v prints %q", got)
	}
}

func TestSignMatchesOfficialLibrary(t *testing.T) {
	ts := time.Now()
	cases := []struct {
		name, secret, id string
		body             []byte
	}{
		{"json", secretA, "msg_p5jXN8AQM9LWM0D4loKWxJek", []byte(`{"test": 2432232314}`)},
		{"empty body", secretB, "evt-1", nil},
		{"binary body", secretB, "evt-2", []byte{0, 1, 2, 0xff, '.', '\n'}},
		{"long id", secretA, strings.Repeat("i", 300), []byte("x")},
		{"id with dots", secretA, "a.b.c", []byte("1.2.3")},
		{"1 MB body", secretB, "big", bytes.Repeat([]byte("0123456789abcdef"), 1<<16)},
		{"raw secret", officialExample, "raw", []byte("{}")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sig := NewSigner(mustParse(t, tc.secret), nil).Sign(tc.id, ts, tc.body)
			if !strings.HasPrefix(sig, "v1,") || len(sig) != SignatureLen || strings.Contains(sig, " ") {
				t.Fatalf("signature %q is not one v1 signature", sig)
			}
			if err := verify(t, tc.secret, tc.id, ts, tc.body, sig); err != nil {
				t.Fatalf("official library: %v", err)
			}
			// And byte for byte what the library itself produces.
			wh, _ := standardwebhooks.NewWebhook(tc.secret)
			want, _ := wh.Sign(tc.id, ts, tc.body)
			if sig != want {
				t.Fatalf("Sign = %q, library signs %q", sig, want)
			}
			// A changed body, id or timestamp does not verify.
			if err := verify(t, tc.secret, tc.id, ts, append(append([]byte(nil), tc.body...), ' '), sig); err == nil {
				t.Fatal("a changed body verified")
			}
			if err := verify(t, tc.secret, tc.id+"x", ts, tc.body, sig); err == nil {
				t.Fatal("a changed id verified")
			}
			if err := verify(t, tc.secret, tc.id, ts.Add(time.Second), tc.body, sig); err == nil {
				t.Fatal("a changed timestamp verified")
			}
		})
	}
}

// A known answer, independent of both this package and the official library's signing code
// path: HMAC-SHA256 of "msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}" with the
// Standard Webhooks example secret, as published in the specification's test vectors.
func TestSignKnownAnswer(t *testing.T) {
	sig := NewSigner(mustParse(t, secretA), nil).Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; sig != want {
		t.Fatalf("Sign = %q, want %q", sig, want)
	}
}

func TestRotation(t *testing.T) {
	cur, prev := mustParse(t, secretB), mustParse(t, secretA)
	ts := time.Now()
	id, body := "evt-rotation", []byte(`{"type":"order.created"}`)

	signer := NewSigner(cur, &prev)
	if !signer.Rotating() {
		t.Fatal("not rotating")
	}
	sig := signer.Sign(id, ts, body)
	parts := strings.Split(sig, " ")
	if len(parts) != 2 || len(sig) != 2*SignatureLen+1 {
		t.Fatalf("rotation header %q: want two space-separated signatures", sig)
	}
	if parts[0] != NewSigner(cur, nil).Sign(id, ts, body) || parts[1] != NewSigner(prev, nil).Sign(id, ts, body) {
		t.Fatalf("rotation header %q: want the current secret's signature first", sig)
	}
	// A receiver holding only the new secret and one holding only the old both verify.
	for _, s := range []string{secretA, secretB} {
		if err := verify(t, s, id, ts, body, sig); err != nil {
			t.Errorf("receiver holding %s...: %v", s[:10], err)
		}
	}
	// One that holds another secret does not.
	other, _ := GenerateSecret()
	if err := verify(t, other, id, ts, body, sig); err == nil {
		t.Error("a receiver holding an unrelated secret verified")
	}
	// After the rotation, only the new secret verifies.
	after := NewSigner(cur, nil).Sign(id, ts, body)
	if err := verify(t, secretA, id, ts, body, after); err == nil {
		t.Error("the previous secret verified after the rotation ended")
	}
	if err := verify(t, secretB, id, ts, body, after); err != nil {
		t.Error(err)
	}
	// A previous secret equal to the current one adds nothing.
	same := mustParse(t, secretB)
	if s := NewSigner(cur, &same); s.Rotating() || strings.Contains(s.Sign(id, ts, body), " ") {
		t.Error("the same secret as previous signed twice")
	}
}

// A rotation with an end signs with both secrets the requests timestamped before it, and with
// the current one alone from then on.
func TestRotationEnds(t *testing.T) {
	cur, prev := mustParse(t, secretB), mustParse(t, secretA)
	end := time.Unix(1700000000, 0)
	signer := NewSignerUntil(cur, &prev, end)
	id, body := "evt-rotation", []byte(`{}`)
	for _, tc := range []struct {
		ts   time.Time
		want string
	}{
		{end.Add(-time.Nanosecond), NewSigner(cur, &prev).Sign(id, end.Add(-time.Nanosecond), body)},
		{end, NewSigner(cur, nil).Sign(id, end, body)},
		{end.Add(time.Hour), NewSigner(cur, nil).Sign(id, end.Add(time.Hour), body)},
	} {
		if got := signer.Sign(id, tc.ts, body); got != tc.want {
			t.Errorf("signed at %s: %q, want %q", tc.ts.Sub(end), got, tc.want)
		}
	}
}

func TestAppendSign(t *testing.T) {
	prev := mustParse(t, secretA)
	signer := NewSigner(mustParse(t, secretB), &prev)
	ts := time.Unix(1700000000, 0)
	body := []byte("{}")
	dst := []byte("webhook-signature: ")
	got := signer.AppendSign(dst, "id", ts, body)
	if want := "webhook-signature: " + signer.Sign("id", ts, body); string(got) != want {
		t.Fatalf("AppendSign = %q, want %q", got, want)
	}
	buf := make([]byte, 0, 2*SignatureLen+1)
	allocs := testing.AllocsPerRun(100, func() {
		buf = signer.AppendSign(buf[:0], "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body)
	})
	if allocs != 0 && !raceEnabled {
		t.Errorf("AppendSign into a buffer with capacity: %v allocations, want 0", allocs)
	}
}

func TestConcurrentSigning(t *testing.T) {
	prev := mustParse(t, secretA)
	signer := NewSigner(mustParse(t, secretB), &prev)
	ts := time.Now()
	want := map[int]string{}
	for i := range 16 {
		want[i] = signer.Sign(strconv.Itoa(i), ts, []byte(strings.Repeat("b", i*100)))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			var buf []byte
			for n := range 2000 {
				i := n % 16
				buf = signer.AppendSign(buf[:0], strconv.Itoa(i), ts, []byte(strings.Repeat("b", i*100)))
				if string(buf) != want[i] {
					errs <- fmt.Sprintf("signature %d differs under concurrency", i)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

func TestGenerateSecret(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		s, err := GenerateSecret()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(s, Prefix) || seen[s] {
			t.Fatalf("GenerateSecret = %q (repeated: %v)", s, seen[s])
		}
		seen[s] = true
		sec := mustParse(t, s)
		if len(sec.bytes()) != 32 {
			t.Fatalf("key of %d bytes, want 32", len(sec.bytes()))
		}
		// The official library accepts it as is.
		ts := time.Now()
		if err := verify(t, s, "id", ts, []byte("b"), NewSigner(sec, nil).Sign("id", ts, []byte("b"))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSecretEqual(t *testing.T) {
	a, a2, b := mustParse(t, secretA), mustParse(t, strings.TrimPrefix(secretA, Prefix)), mustParse(t, secretB)
	if !a.Equal(a2) || a.Equal(b) || a.Equal(Secret{}) || !(Secret{}).Equal(Secret{}) {
		t.Fatal("Equal is wrong")
	}
	if a.IsZero() || !(Secret{}).IsZero() {
		t.Fatal("IsZero is wrong")
	}
}

func BenchmarkSign1KB(b *testing.B) {
	signer := NewSigner(mustParse(b, secretB), nil)
	body := bytes.Repeat([]byte("x"), 1024)
	ts := time.Now()
	buf := make([]byte, 0, 2*SignatureLen+1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		buf = signer.AppendSign(buf[:0], "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body)
	}
}

func BenchmarkSign1KBRotating(b *testing.B) {
	prev := mustParse(b, secretA)
	signer := NewSigner(mustParse(b, secretB), &prev)
	body := bytes.Repeat([]byte("x"), 1024)
	ts := time.Now()
	buf := make([]byte, 0, 2*SignatureLen+1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		buf = signer.AppendSign(buf[:0], "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body)
	}
}

// BenchmarkSign1KBString is Sign (a string result), for comparison with AppendSign.
func BenchmarkSign1KBString(b *testing.B) {
	signer := NewSigner(mustParse(b, secretB), nil)
	body := bytes.Repeat([]byte("x"), 1024)
	ts := time.Now()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		_ = signer.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body)
	}
}

// BenchmarkSign1KBOfficial is the official library's Sign, for comparison.
func BenchmarkSign1KBOfficial(b *testing.B) {
	wh, _ := standardwebhooks.NewWebhook(secretB)
	body := bytes.Repeat([]byte("x"), 1024)
	ts := time.Now()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = wh.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body)
	}
}
