package testenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

func newTestSecret(t *testing.T) (string, *standardwebhooks.Webhook) {
	t.Helper()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	s := "whsec_" + base64.StdEncoding.EncodeToString(b)
	wh, err := standardwebhooks.NewWebhook(s)
	if err != nil {
		t.Fatal(err)
	}
	return s, wh
}

// send posts body as event id, signed with wh (nil: unsigned), and returns the status.
func send(t *testing.T, c *http.Client, url string, wh *standardwebhooks.Webhook, id, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", fmt.Sprint(now.Unix()))
	req.Header.Set("webhook-attempt", "2")
	if wh != nil {
		sig, err := wh.Sign(id, now, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("webhook-signature", sig)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestReceiverVerifiesCountsAndAnswers(t *testing.T) {
	secret, wh := newTestSecret(t)
	_, other := newTestSecret(t)
	rotated, whRotated := newTestSecret(t)
	var current atomic.Value
	current.Store(secret)
	reads := atomic.Int32{}
	r := StartReceiver(t, ReceiverOptions{Secrets: func(context.Context) ([]string, error) {
		reads.Add(1)
		return []string{current.Load().(string)}, nil
	}})
	c := &http.Client{Timeout: 5 * time.Second}

	for _, tc := range []struct {
		wh   *standardwebhooks.Webhook
		id   string
		want int
	}{{wh, "evt_1", 200}, {wh, "evt_1", 200}, {wh, "evt_2", 200}, {other, "evt_3", 401}, {nil, "evt_4", 401}} {
		if got := send(t, c, r.URL(), tc.wh, tc.id, `{"n":1}`); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.id, got, tc.want)
		}
	}
	if st := r.Stats(); st != (ReceiverStats{Requests: 5, Accepted: 3, Unique: 2, BadSignatures: 2}) {
		t.Errorf("stats %+v", st)
	}
	if got := r.Received(); strings.Join(got, ",") != "evt_1,evt_2" || r.Count("evt_1") != 2 || string(r.Body("evt_2")) != `{"n":1}` {
		t.Errorf("received %v, count %d, body %q", got, r.Count("evt_1"), r.Body("evt_2"))
	}
	if reqs := r.Requests(); len(reqs) != 5 || reqs[0].Attempt != 2 || !reqs[0].Signed || reqs[3].Status != 401 || reqs[3].Signed {
		t.Errorf("requests %+v", reqs)
	}

	// A rotated secret is read again when nothing known verifies; a trusted one is kept.
	current.Store(rotated)
	if got := send(t, c, r.URL(), whRotated, "evt_5", `{}`); got != 200 {
		t.Errorf("after a rotation: %d", got)
	}
	r.Trust(secret)
	before := reads.Load()
	if got := send(t, c, r.URL(), wh, "evt_6", `{}`); got != 200 || reads.Load() != before+1 {
		t.Errorf("a trusted secret: %d, %d reads", got, reads.Load()-before)
	}

	// The Responder answers; a client that gives up during a Delay is counted apart.
	r.SetResponder(Failing)
	if got := send(t, c, r.URL(), wh, "evt_7", `{}`); got != 503 {
		t.Errorf("failing: %d", got)
	}
	r.SetResponder(func(Request) Response { return Response{Delay: time.Minute} })
	if got := send(t, &http.Client{Timeout: 100 * time.Millisecond}, r.URL(), wh, "evt_8", `{}`); got != 0 {
		t.Errorf("a hanging answer reached the client: %d", got)
	}
	Eventually(t, 5*time.Second, func() bool { return r.Stats().Abandoned == 1 }, "the abandoned request to be counted")
	if st := r.Stats(); st.Refused != 1 || st.Accepted != 5 || r.Count("evt_7") != 0 || r.Count("evt_8") != 0 {
		t.Errorf("stats %+v", st)
	}
	// Every request counts by id, whatever its answer.
	if by := r.RequestsByID(); by["evt_1"] != 2 || by["evt_3"] != 1 || by["evt_7"] != 1 || by["evt_8"] != 1 || len(by) != 8 {
		t.Errorf("requests by id %v", by)
	}
}

func TestReceiverWithoutSecretsAcceptsEverything(t *testing.T) {
	r := StartReceiver(t, ReceiverOptions{Path: "/hook"})
	if !strings.HasSuffix(r.URL(), "/hook") {
		t.Errorf("URL %s", r.URL())
	}
	if got := send(t, http.DefaultClient, r.URL(), nil, "evt_1", `{}`); got != 200 {
		t.Errorf("status %d", got)
	}
	if st := r.Stats(); st.Accepted != 1 || st.BadSignatures != 0 || r.Requests()[0].Signed {
		t.Errorf("stats %+v", st)
	}
}

func TestReceiverBoundsWhatItKeeps(t *testing.T) {
	r := StartReceiver(t, ReceiverOptions{})
	r.maxLogged, r.maxLoggedBytes, r.maxIDs = 3, 10, 4
	for i := range 6 {
		send(t, http.DefaultClient, r.URL(), nil, fmt.Sprintf("evt_%d", i), "abcd")
	}
	reqs := r.Requests()
	if len(reqs) != 2 || reqs[0].ID != "evt_4" || reqs[1].ID != "evt_5" {
		t.Errorf("the log keeps the most recent requests within its bounds: %+v", reqs)
	}
	if st := r.Stats(); st.Requests != 6 || st.Accepted != 6 || st.Unique != 4 || st.Untracked != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestReceiverServesEveryPathAndComesBackAfterDown(t *testing.T) {
	r := StartReceiver(t, ReceiverOptions{})
	other := r.URLWithPath("/other")
	if got := send(t, http.DefaultClient, other, nil, "evt_1", `{}`); got != 200 {
		t.Fatalf("status %d", got)
	}
	if reqs := r.Requests(); len(reqs) != 1 || reqs[0].Path != "/other" {
		t.Errorf("requests %+v", reqs)
	}
	r.Down()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if got := send(t, c, r.URL(), nil, "evt_2", `{}`); got != 0 {
		t.Errorf("a receiver that is down answered %d", got)
	}
	if err := r.Up(); err != nil {
		t.Fatal(err)
	}
	if got := send(t, c, r.URL(), nil, "evt_3", `{}`); got != 200 {
		t.Errorf("after Up: status %d", got)
	}
	if got := r.Received(); strings.Join(got, ",") != "evt_1,evt_3" {
		t.Errorf("received %v", got)
	}
}

func TestReceiverKeepsNoRequestsWhenAsked(t *testing.T) {
	r := StartReceiver(t, ReceiverOptions{KeepRequests: -1})
	none := StartReceiver(t, ReceiverOptions{KeepRequests: -1, MaxIDs: -1})
	for i := range 3 {
		send(t, http.DefaultClient, r.URL(), nil, fmt.Sprintf("evt_%d", i), "abcd")
		send(t, http.DefaultClient, none.URL(), nil, fmt.Sprintf("evt_%d", i), "abcd")
	}
	if reqs := r.Requests(); len(reqs) != 0 {
		t.Errorf("kept %d requests", len(reqs))
	}
	if st := r.Stats(); st.Requests != 3 || st.Unique != 3 || len(r.Received()) != 3 {
		t.Errorf("stats %+v, received %v", st, r.Received())
	}
	if st := none.Stats(); st.Requests != 3 || st.Accepted != 3 || st.Untracked != 3 || len(none.Receipts()) != 0 || len(none.RequestsByID()) != 0 {
		t.Errorf("a receiver tracking no ids: stats %+v, receipts %v", st, none.Receipts())
	}
}

// A request held back by a Delay is counted as waiting, and closing the receiver answers it
// at once instead of cutting it after the grace period.
func TestReceiverCloseAnswersDelayedRequests(t *testing.T) {
	r, err := NewReceiver(ReceiverOptions{Respond: func(Request) Response { return Response{Delay: time.Hour} }})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() { got <- send(t, &http.Client{Timeout: time.Minute}, r.URL(), nil, "evt_1", `{}`) }()
	Eventually(t, 10*time.Second, func() bool { return r.Stats().Waiting == 1 }, "the request to wait")
	if err := r.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if status := <-got; status != 200 {
		t.Errorf("the delayed request got %d, want its answer (200)", status)
	}
	if st := r.Stats(); st.Waiting != 0 || st.Accepted != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestMisbehave(t *testing.T) {
	for _, tc := range []struct {
		b      Behaviour
		status int
		delay  bool
	}{
		{Behaviour{}, http.StatusNoContent, false},
		{Behaviour{Down: true}, http.StatusServiceUnavailable, false},
		{Behaviour{FailRatio: 1}, http.StatusServiceUnavailable, false},
		{Behaviour{HangRatio: 1, Hang: time.Minute}, http.StatusServiceUnavailable, true},
		{Behaviour{MaxLatency: time.Second}, http.StatusNoContent, true},
	} {
		resp := Misbehave(tc.b)(Request{})
		if resp.Status != tc.status || (resp.Delay > 0) != tc.delay {
			t.Errorf("%+v: %+v, want status %d, delay %v", tc.b, resp, tc.status, tc.delay)
		}
	}
}
