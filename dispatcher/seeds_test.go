package dispatcher_test

// Seed behaviours checked at a real receiver: maxRetryDuration, producer headers, the
// webhook-sequence header, Retry-After as an HTTP date, mTLS, and sub-millisecond latencies in
// the delivery log.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Seed 000: retries stop at an attempt limit or a time limit. With maxRetryDuration, a
// delivery whose next attempt would start past created + the limit is dead-lettered with its
// own reason instead of waiting for it.
func TestMaxRetryDurationDeadLettersWithItsOwnReason(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(testenv.Request) testenv.Response { return testenv.Response{Status: 500, Body: "down"} })
	// Four attempts allowed, the fourth an hour after the third: the 5s limit ends it first.
	ref := e.policy("limited", v1alpha1.RetryPolicySpec{MaxRetryDuration: dur(5 * time.Second), CircuitBreaker: noCircuit(),
		Schedule: []metav1.Duration{{}, {Duration: 200 * time.Millisecond}, {Duration: 200 * time.Millisecond}, {Duration: time.Hour}}})
	e.endpoint("hooks", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("order.created", "evt_limited", []byte(`{}`))

	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter; receiver saw %d attempts%s",
		lazyN(func() int { return rcv.Stats().Requests }), lazy(e.dump))
	dl := e.deadLetters()[0]
	if dl.Reason != records.ReasonRetryDurationExceeded || !strings.Contains(dl.Message, "maxRetryDuration (5s)") {
		t.Errorf("dead letter reason %q (%s), want %s", dl.Reason, dl.Message, records.ReasonRetryDurationExceeded)
	}
	// The schedule's first three attempts fit in 5s (fewer on a slow machine); the fourth never comes.
	if n := len(dl.Attempts); n < 1 || n > 3 || rcv.Stats().Requests != n {
		t.Errorf("%d attempts in the dead letter, %d at the receiver; want the same 1 to 3", n, rcv.Stats().Requests)
	}
	recs := e.logRecords("hooks")
	if last := recs[len(recs)-1]; last.State != records.StateDeadLetter || last.DeadLetterReason != records.ReasonRetryDurationExceeded {
		t.Errorf("last delivery-log record: %+v", last)
	}
}

// Producer headers reach the receiver, except the reserved ones; the endpoint's headers win
// on a name clash; a producer cannot forge the operator's Whk-* headers (here: one that would
// make the delivery a one-shot test, and a replay reference).
func TestProducerHeadersReachTheReceiver(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		if h.Attempt == 1 {
			return testenv.Response{Status: 503, Body: "once more"}
		}
		return testenv.Response{Status: 200, Body: "ok"}
	})
	ref := e.policy("twice", v1alpha1.RetryPolicySpec{CircuitBreaker: noCircuit(),
		Schedule: []metav1.Duration{{}, {Duration: 100 * time.Millisecond}}})
	secret := e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref,
		Headers: []v1alpha1.HTTPHeader{{Name: "X-Team", Value: "payments"}, {Name: "X-Region", Value: "eu"}}})
	rcv.Trust(secret)
	e.dispatcher("d1")
	e.publish("order.created", "evt_hdr", []byte(`{}`),
		"X-Tenant", "acme", "x-request-source", "checkout", "X-Team", "from-the-producer",
		"Authorization", "Bearer producer-token", "Cookie", "session=1", "Host", "evil.example",
		"Whk-Test", "true", "Whk-Replay-Of", "whdl_forged", "webhook-signature", "v1,forged",
		"X-Webhook-Event-Id", "evt_forged")

	testenv.Eventually(t, 20*time.Second, func() bool { return len(attemptsOf(rcv)["evt_hdr"]) == 2 }, "want 2 attempts (the forged Whk-Test must not make it one-shot), got %d%s",
		lazyN(func() int { return len(attemptsOf(rcv)["evt_hdr"]) }), lazy(e.dump))
	for _, h := range attemptsOf(rcv)["evt_hdr"] {
		for name, want := range map[string]string{
			"X-Tenant": "acme", "X-Request-Source": "checkout", "X-Team": "payments", "X-Region": "eu",
			"Authorization": "", "Cookie": "", "Webhook-Replay-Of": "",
			"X-Webhook-Event-Id": "evt_hdr", "Webhook-Id": "evt_hdr",
		} {
			if got := strings.Join(h.Header.Values(name), ","); got != want {
				t.Errorf("attempt %d: %s = %q, want %q", h.Attempt, name, got, want)
			}
		}
	}
	if n := rcv.Stats().BadSignatures; n != 0 {
		t.Errorf("%d requests failed signature verification", n)
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.logRecords("orders")) == 2 }, "delivery log")
	for _, r := range e.logRecords("orders") {
		if r.RequestHeaders["X-Tenant"] != "acme" || r.Test || r.ReplayOf != "" {
			t.Errorf("delivery log record: test=%v replayOf=%q headers=%v", r.Test, r.ReplayOf, r.RequestHeaders)
		}
	}
}

// webhook-sequence is the event's sequence in the events stream: for each endpoint it
// increases strictly with the publish order, and a retried event keeps its number. The
// delivery log keeps sub-millisecond latencies (latencyUs).
func TestSequenceIncreasesPerEndpoint(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	failed := map[string]bool{}
	flaky := newReceiver(t, func(h testenv.Request) testenv.Response {
		mu.Lock()
		defer mu.Unlock()
		if n, _ := strconv.Atoi(strings.TrimPrefix(h.ID, "evt_")); n%3 == 0 && !failed[h.ID] {
			failed[h.ID] = true
			return testenv.Response{Status: 500, Body: "retry me"}
		}
		return testenv.Response{Status: 200}
	})
	steady := newReceiver(t, nil)
	ref := e.policy("quick", v1alpha1.RetryPolicySpec{CircuitBreaker: noCircuit(),
		Schedule: []metav1.Duration{{}, {Duration: 50 * time.Millisecond}, {Duration: 50 * time.Millisecond}}})
	e.endpoint("flaky", v1alpha1.WebhookEndpointSpec{URL: flaky.URL(), RetryPolicyRef: ref, EventTypes: []v1alpha1.EventTypePattern{"order.*"}})
	e.endpoint("steady", v1alpha1.WebhookEndpointSpec{URL: steady.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.created"}})
	e.dispatcher("d1")

	const n = 40
	var published []string
	seqOf := map[string]uint64{}
	for i := range n {
		id, typ := fmt.Sprintf("evt_%d", i), "order.created"
		if i%4 == 1 {
			typ = "order.paid" // only flaky gets these: steady's sequence skips them
		}
		if i%5 == 2 {
			e.publish("invoice.sent", fmt.Sprintf("evt_other_%d", i), []byte(`{}`)) // neither endpoint's
		}
		seqOf[id] = e.publish(typ, id, []byte(`{}`))
		published = append(published, id)
	}
	succeeded := func(ep string) int {
		k := 0
		for _, r := range e.logRecords(ep) {
			if r.State == records.StateSucceeded {
				k++
			}
		}
		return k
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return succeeded("flaky") == n && succeeded("steady") == n-n/4 },
		"flaky delivered %d, steady %d%s", lazyN(func() int { return succeeded("flaky") }), lazyN(func() int { return succeeded("steady") }), lazy(e.dump))

	for name, rcv := range map[string]*testenv.Receiver{"flaky": flaky, "steady": steady} {
		got := map[string]uint64{}
		for id, hits := range attemptsOf(rcv) {
			for _, h := range hits {
				seq, err := strconv.ParseUint(h.Header.Get("webhook-sequence"), 10, 64)
				if err != nil {
					t.Fatalf("%s: %s attempt %d has webhook-sequence %q", name, id, h.Attempt, h.Header.Get("webhook-sequence"))
				}
				if prev, ok := got[id]; ok && prev != seq {
					t.Errorf("%s: %s was sent with sequence %d, then %d on a retry", name, id, prev, seq)
				}
				got[id] = seq
			}
		}
		var last uint64
		for _, id := range published {
			seq, ok := got[id]
			if !ok {
				continue // not this endpoint's
			}
			if seq != seqOf[id] {
				t.Errorf("%s: %s has sequence %d, its stream sequence is %d", name, id, seq, seqOf[id])
			}
			if seq <= last {
				t.Errorf("%s: %s has sequence %d after %d: not strictly increasing in publish order", name, id, seq, last)
			}
			last = seq
		}
	}
	if len(failed) == 0 || len(attemptsOf(flaky)["evt_0"]) != 2 {
		t.Errorf("no event was retried: %v", failed)
	}

	for _, r := range e.logRecords("steady") {
		if r.LatencyUS <= 0 || r.LatencyMS != r.LatencyUS/1000 {
			t.Fatalf("delivery log latency: %dms, %dµs", r.LatencyMS, r.LatencyUS)
		}
	}
}

// Retry-After in its HTTP-date form (RFC 9110) on a 503 or 429 replaces the computed wait, up to
// the policy's retryAfter.maxDelay.
func TestRetryAfterHTTPDateIsHonouredUpToTheBound(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	dates := map[string]time.Time{}
	// Both fail once with a Retry-After date; the schedule alone would wait an hour.
	respond := func(ahead time.Duration, code int) func(testenv.Request) testenv.Response {
		return func(h testenv.Request) testenv.Response {
			if h.Attempt > 1 {
				return testenv.Response{Status: 200}
			}
			at := time.Now().Add(ahead).UTC().Truncate(time.Second)
			mu.Lock()
			dates[h.ID] = at
			mu.Unlock()
			return testenv.Response{Status: code, Header: http.Header{"Retry-After": {at.Format(http.TimeFormat)}}, Body: "later"}
		}
	}
	soon := newReceiver(t, respond(3*time.Second, http.StatusServiceUnavailable))
	far := newReceiver(t, respond(2*time.Hour, http.StatusTooManyRequests))
	hourly := []metav1.Duration{{}, {Duration: time.Hour}}
	honour := e.policy("honour", v1alpha1.RetryPolicySpec{Schedule: hourly, CircuitBreaker: noCircuit(),
		RetryAfter: &v1alpha1.RetryAfterSpec{Honor: true, MaxDelay: dur(time.Hour)}})
	bounded := e.policy("bounded", v1alpha1.RetryPolicySpec{Schedule: hourly, CircuitBreaker: noCircuit(),
		RetryAfter: &v1alpha1.RetryAfterSpec{Honor: true, MaxDelay: dur(time.Second)}})
	e.endpoint("soon", v1alpha1.WebhookEndpointSpec{URL: soon.URL(), RetryPolicyRef: honour, EventTypes: []v1alpha1.EventTypePattern{"a"}})
	e.endpoint("far", v1alpha1.WebhookEndpointSpec{URL: far.URL(), RetryPolicyRef: bounded, EventTypes: []v1alpha1.EventTypePattern{"b"}})
	e.dispatcher("d1")
	e.publish("a", "evt_soon", []byte(`{}`))
	e.publish("b", "evt_far", []byte(`{}`))

	delivered := func(ep string) bool {
		for _, r := range e.logRecords(ep) {
			if r.State == records.StateSucceeded {
				return true
			}
		}
		return false
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return delivered("soon") && delivered("far") }, "the retries did not follow Retry-After%s", lazy(e.dump))
	firstFailure := func(ep string) records.LogRecord {
		for _, r := range e.logRecords(ep) {
			if r.State == records.StateFailed {
				return r
			}
		}
		t.Fatalf("%s: no failed attempt in the delivery log", ep)
		return records.LogRecord{}
	}
	mu.Lock()
	defer mu.Unlock()
	// The date is honoured: the retry is planned for it (the date has a second's resolution).
	if r := firstFailure("soon"); r.NextAttemptAt == nil || r.NextAttemptAt.Sub(dates["evt_soon"]).Abs() > time.Second {
		t.Errorf("soon: next attempt planned at %v, Retry-After said %s", r.NextAttemptAt, dates["evt_soon"])
	}
	// A date two hours ahead is cut to maxDelay (1s), not to the schedule's hour.
	if r := firstFailure("far"); r.NextAttemptAt == nil || r.NextAttemptAt.Sub(r.Time) < time.Second || r.NextAttemptAt.Sub(r.Time) > time.Minute {
		t.Errorf("far: next attempt planned at %v after an attempt at %s, want about 1s later (maxDelay)", r.NextAttemptAt, r.Time)
	}
}

// An endpoint whose receiver demands a client certificate (mTLS): with
// tls.clientCertificateSecretRef the delivery succeeds and the receiver sees the certificate;
// without it every attempt fails with reason tls and the receiver's handler is never reached.
func TestMTLSEndpointNeedsItsClientCertificate(t *testing.T) {
	e := newEnv(t)
	ca := newTestCA(t)
	serverCert := ca.issue(t, "receiver", false, net.ParseIP("127.0.0.1"))
	clientCert := ca.issue(t, "dispatcher-orders", true)

	var mu sync.Mutex
	var peers []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			peers = append(peers, r.TLS.PeerCertificates[0].Subject.CommonName)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert.pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)

	ctx := context.Background()
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "orders-client", Annotations: map[string]string{consent.AllowedEndpoints: "with-cert"}}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: clientCert.certPEM, corev1.TLSPrivateKeyKey: clientCert.keyPEM}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "receiver-ca", Annotations: map[string]string{consent.AllowedEndpoints: "*"}}, Data: map[string][]byte{"ca.crt": ca.certPEM}},
	} {
		if err := e.k8s.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	once := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	caRef := &v1alpha1.SecretKeySelector{Name: "receiver-ca", Key: "ca.crt"}
	e.endpoint("with-cert", v1alpha1.WebhookEndpointSpec{URL: srv.URL + "/hook", RetryPolicyRef: once, EventTypes: []v1alpha1.EventTypePattern{"a"},
		TLS: &v1alpha1.TLSSpec{ClientCertificateSecretRef: &v1alpha1.LocalObjectReference{Name: "orders-client"}, CABundleSecretRef: caRef}})
	e.endpoint("without-cert", v1alpha1.WebhookEndpointSpec{URL: srv.URL + "/hook", RetryPolicyRef: once, EventTypes: []v1alpha1.EventTypePattern{"b"},
		TLS: &v1alpha1.TLSSpec{CABundleSecretRef: caRef}})
	e.dispatcher("d1")
	e.publish("a", "evt_mtls", []byte(`{}`))
	e.publish("b", "evt_nocert", []byte(`{}`))

	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.logRecords("with-cert")) == 1 && len(e.deadLetters()) == 1 },
		"want one delivery and one dead letter%s", lazy(e.dump))
	if r := e.logRecords("with-cert")[0]; r.State != records.StateSucceeded || r.Response.StatusCode != http.StatusNoContent {
		t.Errorf("with the client certificate: %+v", r)
	}
	dl := e.deadLetters()[0]
	if dl.Endpoint != "without-cert" || len(dl.Attempts) != 1 || dl.Attempts[0].Reason != records.FailTLS {
		t.Errorf("without the client certificate: dead letter %+v", dl)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(peers) != 1 || peers[0] != "dispatcher-orders" {
		t.Errorf("the receiver's handler saw client certificates %v, want one request from dispatcher-orders", peers)
	}
}

// testCA is a certificate authority for one test.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	pool    *x509.CertPool
}

// issued is a certificate and key, as PEM and as a tls.Certificate.
type issued struct {
	certPEM, keyPEM []byte
	pair            tls.Certificate
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: pool}
}

// issue signs a certificate for a client (client true) or a server at ips.
func (ca *testCA) issue(t *testing.T, cn string, client bool, ips ...net.IP) issued {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, IPAddresses: ips,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	out := issued{certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
	if out.pair, err = tls.X509KeyPair(out.certPEM, out.keyPEM); err != nil {
		t.Fatal(err)
	}
	return out
}
