package egressproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// fakeDNS resolves names from a table: a host name that resolves to a refused address.
type fakeDNS map[string][]netip.Addr

func (f fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func client(d *Dialer) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext, DisableKeepAlives: true}}
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestEveryRequestGoesThroughTheProxy(t *testing.T) {
	rcv := testenv.StartReceiver(t, testenv.ReceiverOptions{})
	proxy := testenv.StartProxy(t, testenv.ProxyOptions{User: "dispatcher", Password: "proxy-pass"})
	_, port, _ := net.SplitHostPort(rcv.Addr())
	guard := netguard.Policy{AllowHTTP: true, Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	d := &Dialer{Guard: guard, Proxy: &Proxy{URL: mustParse(t, proxy.URL()),
		Credentials: func() (string, string, error) { return "dispatcher", "proxy-pass", nil }},
		Resolver: fakeDNS{"receiver.test": {netip.MustParseAddr("127.0.0.1")}}}
	c := client(d)
	for i := range 3 {
		resp, err := c.Post("http://receiver.test:"+port+"/webhooks", "application/json", strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
	reqs := rcv.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the receiver got %d requests", len(reqs))
	}
	for _, r := range reqs {
		if !proxy.Tunnelled(r.RemoteAddr) {
			t.Errorf("a request from %s came around the proxy", r.RemoteAddr)
		}
	}
	// The proxy was asked for the checked address, never the name.
	for _, target := range proxy.Targets() {
		if target != "127.0.0.1:"+port {
			t.Errorf("CONNECT %s, want the checked IP address", target)
		}
	}
}

func TestTheGuardJudgesTheDestinationNotTheProxy(t *testing.T) {
	proxy := testenv.StartProxy(t, testenv.ProxyOptions{})
	// The proxy is on loopback and trusted (the installation's); the guard allows nothing on
	// loopback, so every destination there is refused, by name or by address.
	guard := netguard.Policy{AllowHTTP: true}
	d := &Dialer{Guard: guard, Proxy: &Proxy{URL: mustParse(t, proxy.URL())},
		Resolver: fakeDNS{"rebound.test": {netip.MustParseAddr("169.254.169.254")}, "mixed.test": {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("127.0.0.1")}}}
	for _, addr := range []string{"rebound.test:80", "mixed.test:443", "127.0.0.1:9", "[::1]:80", "0x7f.1:80"} {
		_, err := d.DialContext(context.Background(), "tcp", addr)
		if !errors.Is(err, netguard.ErrBlocked) {
			t.Errorf("%s: %v, want blocked_address", addr, err)
		}
	}
	if n := len(proxy.Targets()); n != 0 || proxy.Refused() != 0 {
		t.Fatalf("the proxy heard of refused destinations: %v", proxy.Targets())
	}
}

func TestAnEndpointsProxyMustPassTheGuard(t *testing.T) {
	proxy := testenv.StartProxy(t, testenv.ProxyOptions{})
	d := &Dialer{Guard: netguard.Policy{AllowHTTP: true}, Proxy: &Proxy{URL: mustParse(t, proxy.URL()), CheckAddress: true},
		Resolver: fakeDNS{"public.test": {netip.MustParseAddr("93.184.216.34")}}}
	_, err := d.DialContext(context.Background(), "tcp", "public.test:443")
	if !errors.Is(err, ErrProxy) || !errors.Is(err, netguard.ErrBlocked) || !strings.Contains(err.Error(), "the proxy's own address is refused") {
		t.Fatalf("a tenant's proxy on loopback: %v", err)
	}
}

func TestProxyFailuresAreTheProxys(t *testing.T) {
	rcv := testenv.StartReceiver(t, testenv.ReceiverOptions{})
	proxy := testenv.StartProxy(t, testenv.ProxyOptions{User: "u", Password: "right"})
	guard := netguard.Policy{AllowHTTP: true, Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	wrong := &Dialer{Guard: guard, Proxy: &Proxy{URL: mustParse(t, proxy.URL()), Credentials: func() (string, string, error) { return "u", "pw-Xq9", nil }}}
	_, err := wrong.DialContext(context.Background(), "tcp", rcv.Addr())
	if !errors.Is(err, ErrProxy) || !strings.Contains(err.Error(), "407") || strings.Contains(err.Error(), "pw-Xq9") {
		t.Fatalf("wrong credentials: %v", err)
	}
	// A proxy that is not there.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := l.Addr().String()
	l.Close()
	down := &Dialer{Guard: guard, Proxy: &Proxy{URL: mustParse(t, "http://"+gone)}}
	if _, err := down.DialContext(context.Background(), "tcp", rcv.Addr()); !errors.Is(err, ErrProxy) {
		t.Fatalf("proxy down: %v", err)
	}
	// A proxy that never answers CONNECT: the attempt's deadline ends the wait.
	sl, _ := net.Listen("tcp", "127.0.0.1:0")
	defer sl.Close()
	go func() {
		for {
			c, err := sl.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	hang := &Dialer{Guard: guard, Proxy: &Proxy{URL: mustParse(t, "http://"+sl.Addr().String())}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := hang.DialContext(ctx, "tcp", rcv.Addr()); !errors.Is(err, ErrProxy) {
		t.Fatalf("a silent proxy: %v", err)
	}
}

func TestParse(t *testing.T) {
	for raw, want := range map[string]string{
		"http://proxy.egress:3128":  "",
		"https://proxy.example.com": "",
		"http://proxy.egress:3128/": "",
		"socks5://proxy:1080":       "is not http or https",
		"http://user:pw@proxy:3128": "user-info",
		"http://proxy:3128/path":    "without a path",
		"http://proxy:0":            "not 1-65535",
		"http://:3128":              "no host",
		"http://proxy:3128?x=1":     "without a path",
		"://":                       "does not parse",
	} {
		_, err := Parse(raw)
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", raw, err, want)
		}
	}
}
