package netguard_test

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/netguard"
)

// An HTTP client for deliveries: URLs are checked before a request, addresses at connect time.
func Example() {
	guard := netguard.Policy{Allowed: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}}
	client := &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			Proxy:       nil, // through a proxy, the guard would check the proxy's address
			DialContext: guard.DialContext(&net.Dialer{Timeout: 5 * time.Second}),
		},
	}
	_ = client

	fmt.Println(guard.CheckURL("https://hooks.example.com/orders"))
	fmt.Println(guard.CheckURL("https://10.20.1.5/orders"))
	fmt.Println(guard.CheckURL("https://169.254.169.254/latest/meta-data/"))
	fmt.Println(guard.CheckURL("https://0x7f.1/"))
	fmt.Println(guard.CheckURL("https://[::ffff:10.0.0.1]/"))
	fmt.Println(guard.CheckURL("http://hooks.example.com/"))
	// Output:
	// <nil>
	// <nil>
	// blocked_address: 169.254.169.254 is a cloud metadata address; allow it with --allowed-cidrs
	// blocked_address: 127.0.0.1 is a loopback address; allow it with --allowed-cidrs
	// blocked_address: ::ffff:10.0.0.1 is an IPv4-mapped IPv6 form of 10.0.0.1, which is a private address; allow it with --allowed-cidrs
	// blocked_address: http:// URLs are refused, https is required; allow http with --allow-http
}
