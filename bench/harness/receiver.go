package harness

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// bodySize is the size of every event body: 1 KB.
const bodySize = 1024

// eventBody is a 1 KB JSON event carrying its publish time (unix nanoseconds), a tag naming
// the measurement it belongs to, and its index.
func eventBody(tag string, i int, t time.Time) []byte {
	b := make([]byte, 0, bodySize)
	b = append(b, `{"t":`...)
	b = strconv.AppendInt(b, t.UnixNano(), 10)
	b = append(b, `,"k":"`...)
	b = append(b, tag...)
	b = append(b, `","i":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `,"pad":"`...)
	for len(b) < bodySize-2 {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
}

// parseBody reads the publish time and tag of an eventBody.
func parseBody(b []byte) (sent int64, tag string) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"t":`))
	if !ok {
		return 0, ""
	}
	j := bytes.IndexByte(rest, ',')
	if j < 0 {
		return 0, ""
	}
	sent, _ = strconv.ParseInt(string(rest[:j]), 10, 64)
	rest, ok = bytes.CutPrefix(rest[j+1:], []byte(`"k":"`))
	if !ok {
		return sent, ""
	}
	if k := bytes.IndexByte(rest, '"'); k >= 0 {
		tag = string(rest[:k])
	}
	return sent, tag
}

// receiver is the bench's webhook receiver: a testenv.Receiver on loopback (the tests' one
// receiver, here keeping no request log and no receipts, as it takes thousands of requests a
// second) whose Responder answers 200 (or what status says for a tag) and records per tag
// what it accepted and refused. Down takes it down (connections refused) and Up brings it
// back on the same address; SetResponder(hangUntilTimeout) makes it hang until each client
// gives up (Stats().Waiting counts them).
type receiver struct {
	*testenv.Receiver
	name   string
	status func(tag string) int
	// authorize, when set, says whether a request of tag is authorized; one that is not is
	// answered 401 (and counted as refused).
	authorize func(tag string, req testenv.Request) bool

	smu  sync.Mutex
	tags map[string]*tagStats
}

// tagStats is what a receiver saw of one tag.
type tagStats struct {
	ok, failed int
	seen       map[string]struct{} // path|webhook-id of accepted requests
	recv       []int64             // arrival times (unix ns) of accepted requests
	sent       []int64             // their publish times, from the body
	failedAt   []int64             // arrival times of refused requests
}

func newReceiver(name string, status func(tag string) int) (*receiver, error) {
	r := &receiver{name: name, status: status, tags: map[string]*tagStats{}}
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Respond: r.respond, Path: "/", KeepRequests: -1, MaxIDs: -1})
	if err != nil {
		return nil, fmt.Errorf("receiver %s: %w", name, err)
	}
	r.Receiver = rcv
	return r, nil
}

// hangUntilTimeout holds every answer back until the client gives up.
func hangUntilTimeout(testenv.Request) testenv.Response {
	return testenv.Response{Status: http.StatusServiceUnavailable, Delay: 24 * time.Hour}
}

// respond answers a request as status says for its tag and records it.
func (r *receiver) respond(req testenv.Request) testenv.Response {
	sent, tag := parseBody(req.Body)
	code := http.StatusOK
	if r.status != nil {
		code = r.status(tag)
	}
	if r.authorize != nil && !r.authorize(tag, req) {
		code = http.StatusUnauthorized
	}
	now := req.At.UnixNano()
	key := req.Path + "|" + req.ID
	r.smu.Lock()
	t := r.tags[tag]
	if t == nil {
		t = &tagStats{seen: map[string]struct{}{}}
		r.tags[tag] = t
	}
	if code >= 200 && code < 300 {
		t.ok++
		t.seen[key] = struct{}{}
		t.recv = append(t.recv, now)
		t.sent = append(t.sent, sent)
	} else {
		t.failed++
		t.failedAt = append(t.failedAt, now)
	}
	r.smu.Unlock()
	return testenv.Response{Status: code}
}

// counts returns accepted, distinct accepted and refused (non-2xx) requests of a tag.
func (r *receiver) counts(tag string) (ok, unique, failed int) {
	r.smu.Lock()
	defer r.smu.Unlock()
	t := r.tags[tag]
	if t == nil {
		return 0, 0, 0
	}
	return t.ok, len(t.seen), t.failed
}

// times returns copies of the arrival and publish times of a tag's accepted requests, in
// arrival order.
func (r *receiver) times(tag string) (recv, sent []int64) {
	r.smu.Lock()
	defer r.smu.Unlock()
	t := r.tags[tag]
	if t == nil {
		return nil, nil
	}
	return slices.Clone(t.recv), slices.Clone(t.sent)
}

// failures returns a copy of the arrival times of a tag's refused requests.
func (r *receiver) failures(tag string) []int64 {
	r.smu.Lock()
	defer r.smu.Unlock()
	if t := r.tags[tag]; t != nil {
		return slices.Clone(t.failedAt)
	}
	return nil
}

// paths returns the paths that accepted requests of a tag came to.
func (r *receiver) paths(tag string) map[string]bool {
	r.smu.Lock()
	defer r.smu.Unlock()
	out := map[string]bool{}
	if t := r.tags[tag]; t != nil {
		for k := range t.seen {
			path, _, _ := strings.Cut(k, "|")
			out[path] = true
		}
	}
	return out
}

// forget drops a tag's records.
func (r *receiver) forget(tag string) {
	r.smu.Lock()
	delete(r.tags, tag)
	r.smu.Unlock()
}

// span is the first and last arrival of a tag's accepted requests.
func (r *receiver) span(tag string) (first, last time.Time, n int) {
	recv, _ := r.times(tag)
	if len(recv) == 0 {
		return time.Time{}, time.Time{}, 0
	}
	lo, hi := recv[0], recv[0]
	for _, v := range recv {
		lo, hi = min(lo, v), max(hi, v)
	}
	return time.Unix(0, lo), time.Unix(0, hi), len(recv)
}
