package testenv

import (
	"bufio"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	// User and Password, when set, are required as Proxy-Authorization: Basic.
	User, Password string
}

// Proxy is an HTTP CONNECT proxy on loopback that tunnels to whatever it is asked and records
// each tunnel: the target asked for and the local address of its connection to the target
// (what a receiver sees as the request's remote address), so a test can tell that every
// request came through it and none around it.
type Proxy struct {
	o    ProxyOptions
	addr string
	l    net.Listener
	wg   sync.WaitGroup

	mu       sync.Mutex
	targets  []string
	outbound map[string]bool
	refused  int
	conns    map[net.Conn]bool
	closed   bool
}

// maxProxyRecords bounds what a Proxy keeps.
const maxProxyRecords = 100_000

// StartProxy starts a proxy that stops when the test ends.
func StartProxy(t testing.TB, o ProxyOptions) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{o: o, addr: l.Addr().String(), l: l, outbound: map[string]bool{}, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// URL is the proxy's URL, e.g. http://127.0.0.1:3128.
func (p *Proxy) URL() string { return "http://" + p.addr }

// Targets are the CONNECT targets it tunnelled to, in order.
func (p *Proxy) Targets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

// Refused counts the CONNECTs refused (bad credentials, unreachable target).
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Tunnelled reports whether remote (a request's remote address as a server saw it) is the
// local end of one of the proxy's connections to a target.
func (p *Proxy) Tunnelled(remote string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outbound[remote]
}

// Close stops the proxy and every tunnel.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.l.Close()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

func (p *Proxy) refuse(c net.Conn, status string) {
	p.mu.Lock()
	p.refused++
	p.mu.Unlock()
	_, _ = io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Length: 0\r\n\r\n")
}

func (p *Proxy) handle(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(io.LimitReader(c, 64<<10))
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		p.refuse(c, "405 Method Not Allowed")
		return
	}
	if p.o.User != "" || p.o.Password != "" {
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.o.User+":"+p.o.Password))
		if req.Header.Get("Proxy-Authorization") != want {
			_, _ = io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\n\r\n")
			p.mu.Lock()
			p.refused++
			p.mu.Unlock()
			return
		}
	}
	up, err := net.DialTimeout("tcp", req.Host, 5*time.Second)
	if err != nil {
		p.refuse(c, "502 Bad Gateway")
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	p.mu.Lock()
	if len(p.targets) < maxProxyRecords {
		p.targets = append(p.targets, req.Host)
		p.outbound[up.LocalAddr().String()] = true
	}
	p.mu.Unlock()
	_ = c.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// What the client sent after CONNECT and the bufio reader took already.
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			_, _ = up.Write(b)
		}
		_, _ = io.Copy(up, c)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}
