package ingress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Defaults of the HTTP server's bounds.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	// DefaultMaxHeaderBytes fits a bearer token of natsauth.MaxTokenBytes and the CloudEvents
	// attributes of binary mode.
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxConnections bounds the connections open at once, and
	// DefaultMaxConnectionsPerClient those of one client address.
	DefaultMaxConnections          = 4096
	DefaultMaxConnectionsPerClient = 256
)

// ServerOptions are the HTTP server's own bounds and TLS.
type ServerOptions struct {
	Addr                                               string
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, Idle time.Duration
	MaxHeaderBytes                                     int
	// CertFile and KeyFile, when set, serve HTTPS; both are read again when they change
	// (a renewed certificate is used without a restart).
	CertFile, KeyFile string
	// ShutdownGrace is how long requests in flight may finish after ctx ends.
	ShutdownGrace time.Duration
	// MaxConnections bounds the connections open at once (default DefaultMaxConnections),
	// MaxConnectionsPerClient those from one client address (default
	// DefaultMaxConnectionsPerClient, negative: no bound per client): one more is closed as
	// soon as it is accepted.
	MaxConnections, MaxConnectionsPerClient int
	// Metrics, when set, counts connections open and refused.
	Metrics *Metrics
	Log     logr.Logger
}

// Serve serves h until ctx ends, then shuts down gracefully: the listener closes at once
// (a Service sends new requests to other replicas) and requests in flight finish within the
// grace period. ready is called once the listener is up, with its address.
func Serve(ctx context.Context, h http.Handler, o ServerOptions, ready func(net.Addr)) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: or(o.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       or(o.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      or(o.WriteTimeout, DefaultWriteTimeout),
		IdleTimeout:       or(o.Idle, DefaultIdleTimeout),
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		ErrorLog:          nil,
	}
	if o.MaxHeaderBytes > 0 {
		srv.MaxHeaderBytes = o.MaxHeaderBytes
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Addr, err)
	}
	limited := &limitListener{Listener: ln, max: o.MaxConnections, perClient: o.MaxConnectionsPerClient, metrics: o.Metrics}
	if limited.max <= 0 {
		limited.max = DefaultMaxConnections
	}
	if limited.perClient == 0 {
		limited.perClient = DefaultMaxConnectionsPerClient
	}
	ln = limited
	if o.CertFile != "" {
		kp := &keyPair{cert: o.CertFile, key: o.KeyFile}
		if _, err := kp.get(nil); err != nil {
			ln.Close()
			return err
		}
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.get}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	if ready != nil {
		ready(ln.Addr())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), or(o.ShutdownGrace, 10*time.Second))
	defer cancel()
	err = srv.Shutdown(sctx)
	if e := <-done; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// limitListener bounds the connections open at once, in all and per client address: one more
// is closed as soon as it is accepted (the client sees the connection end, and retries: the
// Service may send it to another replica), so a caller cannot hold more than its share of what
// the ingress keeps open.
type limitListener struct {
	net.Listener
	max, perClient int
	metrics        *Metrics

	mu       sync.Mutex
	open     int
	byClient map[string]int
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(client); err == nil {
			client = host
		}
		l.mu.Lock()
		if l.open >= l.max || l.perClient > 0 && l.byClient[client] >= l.perClient {
			l.mu.Unlock()
			_ = c.Close()
			l.metrics.reject(RejectConnections, 1)
			continue
		}
		if l.byClient == nil {
			l.byClient = make(map[string]int)
		}
		l.open++
		l.byClient[client]++
		l.mu.Unlock()
		l.metrics.connections(1)
		return &limitedConn{Conn: c, l: l, client: client}, nil
	}
}

// limitedConn gives its place back when it closes.
type limitedConn struct {
	net.Conn
	l      *limitListener
	client string
	once   sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		if c.l.byClient[c.client]--; c.l.byClient[c.client] <= 0 {
			delete(c.l.byClient, c.client)
		}
		c.l.mu.Unlock()
		c.l.metrics.connections(-1)
	})
	return err
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// keyPair is a certificate and key read from files, again at most every 30 seconds.
type keyPair struct {
	cert, key string
	mu        sync.Mutex
	loaded    *tls.Certificate
	at        time.Time
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loaded != nil && time.Since(k.at) < 30*time.Second {
		return k.loaded, nil
	}
	c, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		if k.loaded != nil {
			return k.loaded, nil
		}
		return nil, fmt.Errorf("the ingress's TLS certificate and key: %w", err)
	}
	k.loaded, k.at = &c, time.Now()
	return k.loaded, nil
}

// SetMemoryLimit tunes the Go runtime for the ingress's many short-lived request buffers: the
// heap may grow to four times the live heap between collections (GOGC=400) within a soft
// limit that fits the chart's 256Mi memory limit, unless GOGC or GOMEMLIMIT say otherwise.
func SetMemoryLimit() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(192 << 20)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
