package harness

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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

// receiver is a webhook receiver on loopback. It answers 200 (or what status says for a
// tag), or hangs until the client gives up, and records per tag what it accepted. It can be
// taken down (connections refused) and brought back on the same address.
type receiver struct {
	name   string
	addr   string
	status func(tag string) int

	hang    atomic.Bool
	hanging atomic.Int64
	release chan struct{}

	mu  sync.Mutex
	srv *http.Server

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

var bufPool = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 2*bodySize)) }}

func newReceiver(name string, status func(tag string) int) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{name: name, addr: ln.Addr().String(), status: status, release: make(chan struct{}), tags: map[string]*tagStats{}}
	r.serve(ln)
	return r, nil
}

func (r *receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 30 * time.Second}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// url is the receiver's URL with path.
func (r *receiver) url(path string) string { return "http://" + r.addr + path }

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now().UnixNano()
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, _ = io.Copy(buf, req.Body)
	sent, tag := parseBody(buf.Bytes())
	bufPool.Put(buf)
	if r.hang.Load() {
		r.hanging.Add(1)
		select {
		case <-req.Context().Done():
		case <-r.release:
		}
		r.hanging.Add(-1)
		return
	}
	code := http.StatusOK
	if r.status != nil {
		code = r.status(tag)
	}
	key := req.URL.Path + "|" + req.Header.Get("webhook-id")
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
	w.WriteHeader(code)
}

// down closes the listener and every connection: clients see refused connections.
func (r *receiver) down() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.srv.Close()
}

// up listens again on the same address.
func (r *receiver) up() error {
	var err error
	for range 50 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			r.serve(ln)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("receiver %s: listening again on %s: %w", r.name, r.addr, err)
}

func (r *receiver) close() {
	r.hang.Store(false)
	select {
	case <-r.release:
	default:
		close(r.release)
	}
	r.down()
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
