// Package egressproxy reaches receivers through an HTTP CONNECT proxy (spec.proxy of a
// WebhookEndpoint, or the installation's default), so receivers see one address they can
// allow, while the outbound guard (internal/netguard) still judges the final destination.
//
// A direct connection is checked by the guard at connect time (netguard.Policy.Control). Through
// a proxy the socket connects to the proxy, so the guard would only see the proxy's address.
// Dial therefore resolves the destination itself, checks every resolved address with the guard,
// and asks the proxy to CONNECT to the checked IP address (never to the name, which the proxy
// would resolve again, perhaps differently): what the guard refuses is refused before the proxy
// hears of it, and DNS rebinding between the check and the connection cannot happen. The TLS
// session to the receiver runs inside the tunnel, verified against the URL's host name, so the
// proxy sees neither the request nor its credentials, and a plain http:// destination is
// tunnelled too.
//
// What is left to trust: the proxy routes the checked IP address as the dispatcher would (a
// proxy with other routes, or one that rewrites destinations, is beyond the guard), and a proxy
// whose own allow list is by host name sees only IP addresses. The installation's proxy is the
// installer's choice and its address is not checked; an endpoint's own proxy is something a
// tenant names, so its address must pass the guard like any destination.
package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/netguard"
)

// ErrProxy is wrapped by every failure of the proxy itself (unreachable, refused the tunnel,
// asked for credentials): the delivery fails with reason "proxy", not as the receiver's fault.
var ErrProxy = errors.New("proxy")

// Credentials are the proxy's basic-authentication user and password. A func returning them
// is asked at every new tunnel, so a rotated Secret is used without a restart.
type Credentials func() (user, password string, err error)

// Proxy is an HTTP CONNECT proxy.
type Proxy struct {
	// URL is http://host:port (plain to the proxy) or https://host:port (TLS to the proxy,
	// verified with the system's roots).
	URL *url.URL
	// Credentials, when set, are sent as Proxy-Authorization: Basic.
	Credentials Credentials
	// CheckAddress says the proxy's own address must pass the guard (a proxy a tenant names).
	CheckAddress bool
	// Key identifies the proxy's configuration (address and credentials' source) for Same.
	Key string
}

// Parse reads a proxy URL: http or https, a host, an optional port (default 80 or 443), no
// path, query, fragment or user-info (credentials come from a Secret).
func Parse(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("the proxy URL does not parse")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("the proxy URL's scheme %q is not http or https", u.Scheme)
	case u.User != nil:
		return nil, errors.New("the proxy URL carries user-info; its credentials come from a Secret")
	case u.Hostname() == "":
		return nil, errors.New("the proxy URL has no host")
	case strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return nil, errors.New("the proxy URL is scheme://host:port, without a path, query or fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("the proxy URL's port %q is not 1-65535", p)
		}
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, nil
}

// Same reports whether a and b are the same proxy (nil: none).
func Same(a, b *Proxy) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.URL.String() == b.URL.String() && a.CheckAddress == b.CheckAddress && a.Key == b.Key
}

// Redacted is the proxy's URL for messages (it holds no credentials).
func (p *Proxy) Redacted() string { return p.URL.String() }

// maxConnectResponse bounds the proxy's answer to CONNECT.
const maxConnectResponse = 16 << 10

// Dialer dials through a proxy after the guard checked the destination.
type Dialer struct {
	Guard netguard.Policy
	Proxy *Proxy
	// Dialer connects to the proxy; nil: a net.Dialer with a 10s timeout.
	Dialer *net.Dialer
	// Resolver resolves destinations; nil: net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// UserAgent is sent with CONNECT.
	UserAgent string
}

// DialContext connects to addr (host:port) through the proxy: it resolves the host, refuses
// the addresses the guard refuses (an error wrapping netguard.ErrBlocked when all are), and
// opens a tunnel to the first allowed address the proxy connects to.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ips, err := d.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	var allowed []netip.Addr
	var refusal error
	for _, ip := range ips {
		if err := d.Guard.CheckAddr(ip); err != nil {
			if refusal == nil {
				refusal = err
			}
			continue
		}
		allowed = append(allowed, ip.WithZone(""))
	}
	if len(allowed) == 0 {
		if refusal == nil {
			refusal = &net.DNSError{Err: "no address", Name: host, IsNotFound: true}
		}
		return nil, refusal
	}
	var last error
	for _, ip := range allowed {
		conn, err := d.tunnel(ctx, net.JoinHostPort(ip.String(), port))
		if err == nil {
			return conn, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

func (d *Dialer) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, ok, err := netguard.ParseHostIP(host); err != nil {
		return nil, err
	} else if ok {
		return []netip.Addr{a}, nil
	}
	var r interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	} = net.DefaultResolver
	if d.Resolver != nil {
		r = d.Resolver
	}
	return r.LookupNetIP(ctx, "ip", host)
}

// proxyError wraps a failure of the proxy itself.
type proxyError struct {
	proxy string
	err   error
}

func (e *proxyError) Error() string { return "proxy " + e.proxy + ": " + e.err.Error() }
func (e *proxyError) Unwrap() []error {
	return []error{ErrProxy, e.err}
}

// tunnel asks the proxy to CONNECT to target (ip:port) and returns the tunnel.
func (d *Dialer) tunnel(ctx context.Context, target string) (net.Conn, error) {
	p := d.Proxy
	fail := func(err error) error { return &proxyError{proxy: p.Redacted(), err: err} }
	nd := d.Dialer
	if nd == nil {
		nd = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	}
	dial := nd.DialContext
	if p.CheckAddress {
		dial = d.Guard.DialContext(nd)
	}
	proxyAddr := p.URL.Host
	if p.URL.Port() == "" {
		proxyAddr = net.JoinHostPort(p.URL.Hostname(), map[string]string{"http": "80", "https": "443"}[p.URL.Scheme])
	}
	conn, err := dial(ctx, "tcp", proxyAddr)
	if err != nil {
		if errors.Is(err, netguard.ErrBlocked) {
			return nil, fail(fmt.Errorf("the proxy's own address is refused: %w", err))
		}
		return nil, fail(err)
	}
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = conn.SetDeadline(dl)
	}
	// The CONNECT exchange ends when ctx does, deadline or not.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if p.URL.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: p.URL.Hostname(), MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fail(err)
		}
		conn = tc
	}
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if d.UserAgent != "" {
		req += "User-Agent: " + d.UserAgent + "\r\n"
	}
	if p.Credentials != nil {
		user, pass, err := p.Credentials()
		if err != nil {
			return nil, fail(fmt.Errorf("reading its credentials: %w", err))
		}
		if user != "" || pass != "" {
			req += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + "\r\n"
		}
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		return nil, fail(err)
	}
	lr := &io.LimitedReader{R: conn, N: maxConnectResponse}
	br := bufio.NewReaderSize(lr, 4096)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		if lr.N <= 0 {
			return nil, fail(fmt.Errorf("its answer to CONNECT is longer than %d bytes", maxConnectResponse))
		}
		return nil, fail(fmt.Errorf("reading its answer to CONNECT: %w", err))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		why := ""
		if resp.StatusCode == http.StatusProxyAuthRequired {
			why = " (its credentials are missing or wrong)"
		}
		return nil, fail(fmt.Errorf("it refused the tunnel: %s%s", resp.Status, why))
	}
	if err := stopDeadline(stop, conn); err != nil {
		return nil, fail(err)
	}
	ok = true
	if n := br.Buffered(); n > 0 {
		// Bytes of the tunnel read with the answer (a server speaking first).
		b, _ := br.Peek(n)
		return &prefixed{Conn: conn, prefix: append([]byte(nil), b...)}, nil
	}
	return conn, nil
}

// stopDeadline ends the CONNECT exchange's deadlines: the transport sets its own from here.
func stopDeadline(stop func() bool, conn net.Conn) error {
	if !stop() {
		return errors.New("the attempt ended during CONNECT")
	}
	return conn.SetDeadline(time.Time{})
}

// prefixed is a connection whose first bytes were read already.
type prefixed struct {
	net.Conn
	prefix []byte
}

func (c *prefixed) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
