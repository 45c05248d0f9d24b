package ingress

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Defaults of the bytes of request bodies held at once.
const (
	// DefaultMaxBodyBytesInFlight fits the chart's 256Mi memory limit with the parsed events
	// (about as much again) and the runtime's headroom (SetMemoryLimit).
	DefaultMaxBodyBytesInFlight = 48 << 20
	// initialBodyBuffer is the most a body's buffer starts with, whatever Content-Length
	// announces: it grows as bytes arrive.
	initialBodyBuffer = 16 << 10
)

// bodyBudget bounds the bytes of request bodies held at once, in all and per namespace, so
// that neither many callers nor one namespace's can make a replica hold more than it has.
type bodyBudget struct {
	total, perNamespace int64
	metrics             *Metrics

	mu   sync.Mutex
	used int64
	byNS map[string]int64
}

// budgetError says the budget cannot give what a body needs now: 503, retry.
type budgetError struct{ msg string }

func (e *budgetError) Error() string { return e.msg }

// take takes n bytes for namespace, or says why not.
func (b *bodyBudget) take(namespace string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byNS[namespace]+n > b.perNamespace {
		return &budgetError{fmt.Sprintf("the ingress holds as many bytes of namespace %s's request bodies as it may at once (%d, --max-body-bytes-per-namespace): retry (with the same event ids, which are de-duplicated)",
			namespace, b.perNamespace)}
	}
	if b.used+n > b.total {
		return &budgetError{fmt.Sprintf("the ingress holds as many bytes of request bodies as it may at once (%d, --max-body-bytes-in-flight): retry (with the same event ids, which are de-duplicated)", b.total)}
	}
	if b.byNS == nil {
		b.byNS = make(map[string]int64)
	}
	b.used += n
	b.byNS[namespace] += n
	b.metrics.bodyBytes(n)
	return nil
}

// give gives n bytes of namespace back.
func (b *bodyBudget) give(namespace string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.byNS[namespace] -= n; b.byNS[namespace] <= 0 {
		delete(b.byNS, namespace)
	}
	b.metrics.bodyBytes(-n)
}

// readBody reads r's body, at most limit bytes, into a buffer that starts small
// (initialBodyBuffer, or Content-Length when smaller) and doubles as bytes arrive: memory
// follows what the caller sent, never what it announced. Every byte of the buffer's capacity
// is taken from the budget first; held is what the body holds of it, to give back once the
// request is answered (also on an error).
func (b *bodyBudget) readBody(w http.ResponseWriter, r *http.Request, namespace string, limit int64) (body []byte, held int64, err error) {
	if r.ContentLength > limit {
		return nil, 0, &http.MaxBytesError{Limit: limit}
	}
	size := min(int64(initialBodyBuffer), limit)
	if n := r.ContentLength; n >= 0 && n < size {
		size = n
	}
	size = max(size, 512)
	if err := b.take(namespace, size); err != nil {
		return nil, 0, err
	}
	held = size
	buf := make([]byte, 0, size)
	in := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= limit {
				// Full at the bound: anything more is too much.
				var one [1]byte
				n, err := io.ReadFull(in, one[:])
				if n > 0 {
					return nil, held, &http.MaxBytesError{Limit: limit}
				}
				if errors.Is(err, io.EOF) {
					return buf, held, nil
				}
				return nil, held, err
			}
			grow := min(int64(cap(buf)), limit-int64(cap(buf)))
			if err := b.take(namespace, grow); err != nil {
				return nil, held, err
			}
			held += grow
			next := make([]byte, len(buf), int64(cap(buf))+grow)
			copy(next, buf)
			buf = next
		}
		n, err := in.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, held, nil
		}
		if err != nil {
			return nil, held, err
		}
	}
}
