package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func TestCheckAddr(t *testing.T) {
	cases := []struct {
		addr    string
		allowed []string
		want    string // substring of the refusal; "" means allowed
	}{
		// Globally reachable.
		{"8.8.8.8", nil, ""},
		{"1.1.1.1", nil, ""},
		{"100.63.255.255", nil, ""},
		{"100.128.0.0", nil, ""},
		{"172.15.255.255", nil, ""},
		{"172.32.0.0", nil, ""},
		{"198.17.255.255", nil, ""},
		{"198.20.0.0", nil, ""},
		{"223.255.255.255", nil, ""},
		{"2606:4700:4700::1111", nil, ""},
		{"2a00:1450:4001:80b::200e", nil, ""},
		{"::ffff:8.8.8.8", nil, ""},
		{"64:ff9b::8.8.8.8", nil, "64:ff9b::808:808 is a NAT64 address (64:ff9b::/96, translated to IPv4 by the network); allow it with --allowed-cidrs"},
		{"64:ff9b::8.8.8.8", []string{"64:ff9b::/96"}, ""},
		{"64:ff9b::8.8.8.8", []string{"64:ff9b::808:800/120"}, ""},
		{"64:ff9b::8.8.4.4", []string{"64:ff9b::808:800/120"}, "NAT64 address"},
		{"2002:808:808::1", nil, ""},

		// IPv4 ranges.
		{"0.0.0.0", nil, "0.0.0.0 is an unspecified address"},
		{"0.1.2.3", nil, "unspecified"},
		{"127.0.0.1", nil, "blocked_address: 127.0.0.1 is a loopback address; allow it with --allowed-cidrs"},
		{"127.255.255.254", nil, "loopback"},
		{"10.0.0.1", nil, "10.0.0.1 is a private address"},
		{"10.255.255.255", nil, "private"},
		{"172.16.0.1", nil, "private"},
		{"172.31.255.255", nil, "private"},
		{"192.168.1.1", nil, "private"},
		{"169.254.0.1", nil, "link-local"},
		{"169.254.169.254", nil, "169.254.169.254 is a cloud metadata address"},
		{"169.254.170.2", nil, "metadata"},
		{"100.100.100.200", nil, "100.100.100.200 is a cloud metadata address"},
		{"168.63.129.16", nil, "168.63.129.16 is a cloud metadata address"},
		{"::ffff:168.63.129.16", nil, "metadata"},
		{"64:ff9b::a83f:8110", []string{"64:ff9b::/96"}, "NAT64 form of 168.63.129.16, which is a cloud metadata address"},
		{"168.63.129.17", nil, ""},
		{"192.0.0.192", nil, "metadata"},
		{"100.64.0.1", nil, "carrier-grade NAT"},
		{"100.127.255.255", nil, "carrier-grade NAT"},
		{"224.0.0.1", nil, "multicast"},
		{"239.255.255.250", nil, "multicast"},
		{"255.255.255.255", nil, "broadcast"},
		{"240.0.0.1", nil, "reserved"},
		{"192.0.0.8", nil, "IETF protocol-assignment"},
		{"198.18.0.1", nil, "benchmarking"},
		{"198.19.255.255", nil, "benchmarking"},
		{"192.0.2.1", nil, "documentation"},
		{"198.51.100.7", nil, "documentation"},
		{"203.0.113.9", nil, "documentation"},
		{"192.88.99.1", nil, "6to4 relay"},

		// IPv6 ranges and forms.
		{"::", nil, ":: is an unspecified address"},
		{"::1", nil, "::1 is a loopback address"},
		{"fe80::1", nil, "link-local"},
		{"fe80::1%eth0", nil, "fe80::1 is a link-local address"},
		{"febf:ffff::1", nil, "link-local"},
		{"fec0::1", nil, "site-local"},
		{"fc00::1", nil, "unique-local"},
		{"fd00::1", nil, "unique-local"},
		{"fd12:3456:789a::1", nil, "unique-local"},
		{"fd00:ec2::254", nil, "fd00:ec2::254 is a cloud metadata address"},
		{"ff02::1", nil, "multicast"},
		{"2001:db8::1", nil, "documentation"},
		{"3fff::1", nil, "documentation"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", nil, "Teredo"},
		{"2001:2::1", nil, "benchmarking"},
		{"100::1", nil, "discard-only"},
		{"64:ff9b:1::a00:1", nil, "local-use NAT64"},
		{"5f00::1", nil, "outside global unicast"},
		{"4000::1", nil, "outside global unicast"},
		{"::ffff:127.0.0.1", nil, "::ffff:127.0.0.1 is an IPv4-mapped IPv6 form of 127.0.0.1, which is a loopback address"},
		{"::ffff:7f00:2", nil, "IPv4-mapped IPv6 form of 127.0.0.2"},
		{"::ffff:10.1.2.3", nil, "private"},
		{"::ffff:169.254.169.254", nil, "metadata"},
		{"::ffff:0.0.0.0", nil, "unspecified"},
		{"::127.0.0.1", nil, "::7f00:1 is an IPv4-compatible IPv6 form of 127.0.0.1, which is a loopback address"},
		{"::8.8.8.8", nil, "deprecated IPv4-compatible"},
		{"64:ff9b::127.0.0.1", nil, "NAT64 form of 127.0.0.1"},
		{"64:ff9b::a9fe:a9fe", nil, "NAT64 form of 169.254.169.254, which is a cloud metadata address"},
		{"2002:7f00:1::1", nil, "6to4 form of 127.0.0.1"},
		{"2002:c0a8:101::", nil, "6to4 form of 192.168.1.1"},

		// The allow list opens exactly what it names.
		{"127.0.0.1", []string{"127.0.0.1/32"}, ""},
		{"127.0.0.2", []string{"127.0.0.1/32"}, "loopback"},
		{"::ffff:127.0.0.1", []string{"127.0.0.1/32"}, ""},
		{"::ffff:127.0.0.2", []string{"127.0.0.1/32"}, "loopback"},
		{"::ffff:127.0.0.1", []string{"::/0"}, "IPv4-mapped"},
		{"::ffff:127.0.0.1", []string{"::ffff:0:0/96"}, "loopback"}, // 0.0.0.0/0: wider than any blocked range
		{"::ffff:127.0.0.1", []string{"::ffff:127.0.0.0/104"}, ""},
		{"127.0.0.1", []string{"::ffff:127.0.0.1/128"}, ""},
		{"10.9.8.7", []string{"::ffff:10.0.0.0/104"}, ""},
		{"11.9.8.7", []string{"::ffff:10.0.0.0/104"}, ""},
		{"172.16.0.1", []string{"::ffff:10.0.0.0/104"}, "private"},
		{"::1", []string{"127.0.0.1/32"}, "loopback"},
		{"::1", []string{"::1/128"}, ""},
		{"10.20.3.4", []string{"10.20.0.0/16"}, ""},
		{"10.21.0.1", []string{"10.20.0.0/16"}, "private"},
		{"10.20.3.4", []string{"10.20.9.9/16"}, ""},                 // an unmasked prefix is its network
		{"169.254.169.254", []string{"169.254.0.0/16"}, "metadata"}, // metadata must be named itself
		{"169.254.1.1", []string{"169.254.0.0/16"}, ""},
		{"169.254.169.254", []string{"169.254.169.254/32"}, ""},
		{"169.254.169.254", []string{"10.0.0.0/8", "192.168.0.0/16"}, "metadata"},
		{"fd00::1", []string{"fd00::/8"}, ""},
		{"fc00::1", []string{"fd00::/8"}, "unique-local"},
		{"64:ff9b::a14:304", []string{"10.20.0.0/16"}, "NAT64 address"},
		{"64:ff9b::a14:304", []string{"10.20.0.0/16", "64:ff9b::/96"}, ""},
		{"64:ff9b::a15:304", []string{"10.20.0.0/16", "64:ff9b::/96"}, "NAT64 form of 10.21.3.4, which is a private address"},
		{"fe80::1%eth0", []string{"fe80::/10"}, ""},
		{"2002:a14:304::", []string{"10.20.0.0/16"}, ""},
		{"2002:a15:304::", []string{"10.20.0.0/16", "2002::/16"}, "6to4 form of 10.21.3.4, which is a private address"},
		{"::10.20.3.4", []string{"10.20.0.0/16"}, "deprecated IPv4-compatible"},
		{"::10.20.3.4", []string{"10.20.0.0/16", "::/96"}, ""},
		{"5f00::1", []string{"4000::/2"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.addr+fmt.Sprint(tc.allowed), func(t *testing.T) {
			p := Policy{Allowed: prefixes(tc.allowed...)}
			err := p.CheckAddr(netip.MustParseAddr(tc.addr))
			checkRefusal(t, err, tc.want)
		})
	}
	if err := (Policy{}).CheckAddr(netip.Addr{}); !errors.Is(err, ErrBlocked) {
		t.Errorf("CheckAddr(invalid) = %v, want ErrBlocked", err)
	}
}

// An allowance wider than a blocked range opens nothing in it, and an IPv6 address that carries
// an IPv4 address is judged by that IPv4 address first: allowing ::/0 (the whole IPv6 space)
// must not let loopback, private or metadata addresses through in any IPv6 spelling.
func TestWideAllowancesOpenNothingBlocked(t *testing.T) {
	for _, wide := range [][]string{{"::/0"}, {"::/0", "0.0.0.0/0"}, {"2000::/3", "::/3"}, {"::/0", "2001::/32", "2002::/16", "64:ff9b::/96"}} {
		for _, tc := range []struct{ addr, want string }{
			{"::1", "::1 is a loopback address"},
			{"::", "unspecified"},
			{"::ffff:127.0.0.1", "IPv4-mapped IPv6 form of 127.0.0.1, which is a loopback address"},
			{"::ffff:169.254.169.254", "metadata"},
			{"::127.0.0.1", "IPv4-compatible IPv6 form of 127.0.0.1"},
			{"64:ff9b::7f00:1", "NAT64 form of 127.0.0.1, which is a loopback address"},
			{"64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254, which is a cloud metadata address"},
			{"64:ff9b:1::7f00:1", "local-use NAT64"},
			{"2002:7f00:1::", "6to4 form of 127.0.0.1, which is a loopback address"},
			{"2002:a9fe:a9fe::1", "6to4 form of 169.254.169.254"},
			{"2002:c0a8:101::", "6to4 form of 192.168.1.1, which is a private address"},
			// Teredo: server 65.54.227.120, client 127.0.0.1 (stored inverted: 80ff:fffe).
			{"2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo address whose client is 127.0.0.1, which is a loopback address"},
			// Teredo: server 10.0.0.1, client 8.8.8.8.
			{"2001:0:a00:1::f7f7:f7f7", "Teredo address whose server is 10.0.0.1, which is a private address"},
			{"fd00::1", "unique-local"},
			{"fd00:ec2::254", "metadata"},
			{"fe80::1", "link-local"},
			{"5f00::1", "outside global unicast"},
			{"127.0.0.1", "loopback"},
			{"10.1.2.3", "private"},
			{"169.254.169.254", "metadata"},
			{"2606:4700::1", ""},
			// The NAT64 prefix is refused as a whole, opened only by naming it (the last list).
			{"64:ff9b::808:808", map[bool]string{true: "", false: "NAT64 address"}[slices.Contains(wide, "64:ff9b::/96")]},
			{"2002:808:808::", ""},
			{"8.8.8.8", ""},
		} {
			t.Run(tc.addr+fmt.Sprint(wide), func(t *testing.T) {
				p := Policy{Allowed: prefixes(wide...)}
				checkRefusal(t, p.CheckAddr(netip.MustParseAddr(tc.addr)), tc.want)
				host := tc.addr
				if strings.Contains(host, ":") {
					host = "[" + host + "]"
				}
				checkRefusal(t, p.CheckURL("https://"+host+"/"), tc.want)
			})
		}
	}
}

// Teredo and local-use NAT64 addresses are opened by naming their range, and are still refused
// when the IPv4 address they carry is. A local-use NAT64 address carries it where the allowed
// prefix's length says (RFC 6052).
func TestEmbeddedIPv4UnderOpenedRanges(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		allowed []string
		want    string
	}{
		{"2001:0:4136:e378:8000:63bf:f7f7:f7f7", nil, "Teredo"},
		{"2001:0:4136:e378:8000:63bf:f7f7:f7f7", []string{"2001::/32"}, ""},
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", []string{"2001::/32"}, "client is 127.0.0.1"},
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", []string{"2001::/32", "127.0.0.0/8"}, ""},
		{"64:ff9b:1::808:808", []string{"64:ff9b:1::/96"}, ""},
		{"64:ff9b:1::7f00:1", []string{"64:ff9b:1::/96"}, "local-use NAT64 form of 127.0.0.1, which is a loopback address"},
		{"64:ff9b:1::a00:1", []string{"64:ff9b:1::/96", "10.0.0.0/8"}, ""},
		{"64:ff9b:1:808:8:800::", []string{"64:ff9b:1::/48"}, ""},                                    // 8.8.8.8 in the /48 layout
		{"64:ff9b:1:7f00:0:100::", []string{"64:ff9b:1::/48"}, "local-use NAT64 form of 127.0.0.1"},  // 127.0.0.1 in the /48 layout
		{"64:ff9b:1:0:8:808:800:0", []string{"64:ff9b:1::/64"}, ""},                                  // 8.8.8.8 in the /64 layout
		{"64:ff9b:1:0:a:a00:100:0", []string{"64:ff9b:1::/64"}, "local-use NAT64 form of 10.10.0.1"}, // the /64 layout
		{"64:ff9b:1:7f:0:1:0:0", []string{"64:ff9b:1::/56"}, "local-use NAT64 form of 127.0.0.1"},    // the /56 layout
		{"64:ff9b:1::808:808", []string{"64:ff9b:1::/80"}, "cannot be checked"},
		{"64:ff9b:1::808:808", []string{"64:ff9b::/32"}, "local-use NAT64"}, // wider than the range
	} {
		t.Run(tc.addr+fmt.Sprint(tc.allowed), func(t *testing.T) {
			checkRefusal(t, Policy{Allowed: prefixes(tc.allowed...)}.CheckAddr(netip.MustParseAddr(tc.addr)), tc.want)
		})
	}
}

// The installer's blocked ranges are refused whatever the allow list opens, in every form an
// IPv6 address can carry an IPv4 address in: a cluster's IPv6 pod range (global unicast,
// which nothing built in refuses), a pod range inside an allowed private range, and NAT64 under
// an opened prefix.
func TestInstallerBlockedRanges(t *testing.T) {
	p := Policy{
		Allowed: prefixes("10.0.0.0/8", "64:ff9b::/96", "2001::/32", "::/96"),
		Blocked: prefixes("2600:1f18:abcd::/56", "10.244.0.0/16", "::ffff:100.127.0.0/112", "64:ff9b::c000:200/120"),
	}
	for _, tc := range []struct{ addr, want string }{
		{"2600:1f18:abcd:12::5", "2600:1f18:abcd:12::5 is in 2600:1f18:abcd::/56, a range the installation blocks (--blocked-cidrs)"},
		{"2600:1f18:abce::5", ""},
		{"10.244.3.4", "10.244.3.4 is in 10.244.0.0/16, a range the installation blocks (--blocked-cidrs)"},
		{"10.245.3.4", ""},
		{"::ffff:10.244.3.4", "IPv4-mapped IPv6 form of 10.244.3.4, which is in 10.244.0.0/16, a range the installation blocks"},
		{"64:ff9b::af4:304", "NAT64 form of 10.244.3.4, which is in 10.244.0.0/16, a range the installation blocks"},
		{"2002:af4:304::1", "6to4 form of 10.244.3.4, which is in 10.244.0.0/16"},
		{"::10.244.3.4", "IPv4-compatible IPv6 form of 10.244.3.4"},
		{"2001:0:af4:304::f7f7:f7f7", "Teredo address whose server is 10.244.3.4"},
		// An IPv4-mapped block is its IPv4 range; a block of NAT64 addresses is itself.
		{"100.127.0.9", "100.127.0.9 is in 100.127.0.0/16"},
		{"64:ff9b::c000:201", "64:ff9b::c000:201 is in 64:ff9b::c000:200/120"},
		{"64:ff9b::808:808", ""},
		{"8.8.8.8", ""},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			checkRefusal(t, p.CheckAddr(netip.MustParseAddr(tc.addr)), tc.want)
		})
	}
}

func checkRefusal(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case want == "":
	case err == nil:
		t.Fatalf("allowed, want a refusal containing %q", want)
	case !errors.Is(err, ErrBlocked):
		t.Fatalf("error %v does not wrap ErrBlocked", err)
	case !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	case !strings.HasPrefix(err.Error(), "blocked_address: "):
		t.Fatalf("error %q does not start with blocked_address", err)
	}
}

func TestCheckURL(t *testing.T) {
	cases := []struct {
		url       string
		allowHTTP bool
		allowed   []string
		want      string // substring of the refusal; "" means allowed
	}{
		{"https://hooks.example.com/x", false, nil, ""},
		{"https://hooks.example.com:8443/x?token=abc", false, nil, ""},
		{"HTTPS://Hooks.Example.COM/", false, nil, ""},
		{"https://localhost/", false, nil, ""}, // a hostname: checked at connect time
		{"https://8.8.8.8/", false, nil, ""},
		{"https://[2606:4700:4700::1111]:443/", false, nil, ""},
		{"http://hooks.example.com/", true, nil, ""},
		{"http://hooks.example.com/", false, nil, "http:// URLs are refused, https is required; allow http with --allow-http"},
		{"ftp://hooks.example.com/", true, nil, `scheme "ftp"`},
		{"/relative", false, nil, "not absolute"},
		{"hooks.example.com/x", false, nil, "not absolute"},
		{"https:hooks.example.com", false, nil, "no //host"},
		{"https:///path", false, nil, "no host"},
		{"https://user:pw@hooks.example.com/", false, nil, "user-info"},
		{"https://user@hooks.example.com/", false, nil, "user-info"},
		{"https://hooks.example.com:0/", false, nil, "port"},
		{"https://hooks.example.com:65536/", false, nil, "port"},
		{"https://hooks.example.com:99999999999999999999/", false, nil, "port"},
		{"https://a b/", false, nil, "cannot be parsed"},
		{"https://%31%32%37.0.0.1/", false, nil, "cannot be parsed"},
		{"https://[::1/", false, nil, "cannot be parsed"},

		// Literal IPs.
		{"https://127.0.0.1/", false, nil, "127.0.0.1 is a loopback address"},
		{"https://127.0.0.1:8443/", false, nil, "loopback"},
		{"https://127.0.0.1./", false, nil, "loopback"},
		{"https://10.0.0.5/", false, nil, "private"},
		{"https://192.168.0.1/", false, nil, "private"},
		{"https://172.20.1.1/", false, nil, "private"},
		{"https://169.254.169.254/latest/meta-data/", false, nil, "metadata"},
		{"http://169.254.169.254/", true, nil, "metadata"},
		{"https://100.100.100.200/", false, nil, "metadata"},
		{"https://0.0.0.0/", false, nil, "unspecified"},
		{"https://[::1]/", false, nil, "::1 is a loopback address"},
		{"https://[::1]:8080/", false, nil, "loopback"},
		{"https://[::ffff:127.0.0.1]/", false, nil, "IPv4-mapped IPv6 form of 127.0.0.1"},
		{"https://[::ffff:7f00:1]/", false, nil, "loopback"},
		{"https://[0:0:0:0:0:ffff:127.0.0.1]/", false, nil, "loopback"},
		{"https://[fd00::1]/", false, nil, "unique-local"},
		{"https://[fd00:ec2::254]/", false, nil, "metadata"},
		{"https://[fe80::1%25eth0]/", false, nil, "link-local"},
		{"https://[64:ff9b::7f00:1]/", false, nil, "NAT64"},
		{"https://[2002:a9fe:a9fe::]/", false, nil, "6to4 form of 169.254.169.254"},
		{"https://[::ffff:0177.0.0.1]/", false, nil, "cannot be parsed"},
		{"https://[1.2.3.4]/", false, nil, "cannot be parsed"},

		// Odd IPv4 spellings a libc resolver accepts.
		{"https://2130706433/", false, nil, "127.0.0.1 is a loopback address"},
		{"https://0x7f000001/", false, nil, "127.0.0.1"},
		{"https://0X7F000001/", false, nil, "127.0.0.1"},
		{"https://017700000001/", false, nil, "127.0.0.1"},
		{"https://0177.0.0.1/", false, nil, "127.0.0.1"},
		{"https://0177.0000.0000.0001/", false, nil, "127.0.0.1"},
		{"https://0x7f.0.0.1/", false, nil, "127.0.0.1"},
		{"https://0x7f.1/", false, nil, "127.0.0.1"},
		{"https://127.1/", false, nil, "127.0.0.1"},
		{"https://127.0.1/", false, nil, "127.0.0.1"},
		{"https://127.1./", false, nil, "127.0.0.1"},
		{"https://0/", false, nil, "0.0.0.0 is an unspecified"},
		{"https://0x/", false, nil, "0.0.0.0"},
		{"https://10.1/", false, nil, "10.0.0.1 is a private"},
		{"https://169.16689662/", false, nil, "169.254.169.254 is a cloud metadata"},
		{"https://0xa9fea9fe/", false, nil, "169.254.169.254"},
		{"https://2852039166/", false, nil, "169.254.169.254"},
		{"https://134744072/", false, nil, ""}, // 8.8.8.8
		{"https://0x8.0x8.0x8.0x8/", false, nil, ""},
		{"https://4294967296/", false, nil, ""}, // too big for IPv4: a (failing) hostname
		{"https://256.0.0.1/", false, nil, ""},
		{"https://08.0.0.1/", false, nil, ""}, // not octal: a hostname
		{"https://1.2.3.4.5/", false, nil, ""},
		{"https://127.0.0.1.nip.io/", false, nil, ""}, // a hostname: checked at connect time
		{"https://hooks.example.com./", false, nil, ""},
		{"https://bücher.example/", false, nil, ""},
		{"https://_svc.example.com/", false, nil, ""},
		{"https://100.%250/", false, nil, "not a valid hostname"},
		{"https://a..b/", false, nil, "not a valid hostname"},
		{"https://.a/", false, nil, "not a valid hostname"},
		{"https://a,b/", false, nil, "not a valid hostname"},
		{"https://a+b/", false, nil, "not a valid hostname"},
		{"https://a!b$c&d'e(f)g*h;i=j/", false, nil, "not a valid hostname"},

		// The allow list.
		{"https://127.0.0.1/", false, []string{"127.0.0.1/32"}, ""},
		{"https://127.0.0.2/", false, []string{"127.0.0.1/32"}, "127.0.0.2 is a loopback address"},
		{"https://127.1/", false, []string{"127.0.0.1/32"}, ""},
		{"https://[::ffff:127.0.0.1]/", false, []string{"127.0.0.1/32"}, ""},
		{"https://10.20.1.1/", false, []string{"10.20.0.0/16"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			p := Policy{AllowHTTP: tc.allowHTTP, Allowed: prefixes(tc.allowed...)}
			checkRefusal(t, p.CheckURL(tc.url), tc.want)
		})
	}
}

func TestCheckURLDoesNotEchoPathOrQuery(t *testing.T) {
	for _, raw := range []string{
		"http://hooks.example.com/secret-path?token=s3cr3t",
		"https://127.0.0.1/secret-path?token=s3cr3t",
		"https://user:s3cr3t@hooks.example.com/secret-path",
		"gopher://hooks.example.com/secret-path?token=s3cr3t",
	} {
		err := Policy{}.CheckURL(raw)
		if err == nil {
			t.Fatalf("%s allowed", raw)
		}
		if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "secret-path") {
			t.Errorf("error %q echoes the URL's path, query or password", err)
		}
	}
}

func TestBlockedErrorCarriesAddr(t *testing.T) {
	err := Policy{}.CheckURL("https://0x7f.1/")
	var be *BlockedError
	if !errors.As(err, &be) || be.Addr != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("error %v: want a *BlockedError for 127.0.0.1", err)
	}
}

func TestControl(t *testing.T) {
	p := Policy{Allowed: prefixes("10.1.0.0/16")}
	cases := []struct {
		network, address string
		want             string
	}{
		{"tcp4", "127.0.0.1:80", "127.0.0.1 is a loopback address"},
		{"tcp6", "[::1]:443", "::1 is a loopback address"},
		{"tcp6", "[::ffff:127.0.0.1]:443", "IPv4-mapped"},
		{"tcp6", "[fe80::1%eth0]:443", "link-local"},
		{"tcp4", "169.254.169.254:80", "metadata"},
		{"tcp4", "10.1.2.3:80", ""},
		{"tcp4", "10.2.0.1:80", "private"},
		{"tcp4", "93.184.215.14:443", ""},
		{"tcp6", "[2606:4700::6810:84e5]:443", ""},
		{"tcp", "localhost:80", "cannot check"},
		{"tcp", "", "cannot check"},
	}
	for _, tc := range cases {
		t.Run(tc.address, func(t *testing.T) {
			checkRefusal(t, p.Control(tc.network, tc.address, nil), tc.want)
		})
	}
}

// newCountingServer is a real HTTP server on loopback that counts the connections it accepts
// and the requests it receives.
func newCountingServer(t *testing.T) (srv *httptest.Server, conns, reqs *atomic.Int64) {
	conns, reqs = new(atomic.Int64), new(atomic.Int64)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reqs.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, conns, reqs
}

func guardedClient(p Policy) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:       nil,
			DialContext: p.DialContext(&net.Dialer{Timeout: 5 * time.Second}),
		},
	}
}

// A hostname that resolves to 127.0.0.1 passes CheckURL (it is not resolved there) and is
// refused when connecting: the server receives nothing, not even a connection.
func TestDialContextRefusesHostnameResolvingToLoopback(t *testing.T) {
	srv, conns, reqs := newCountingServer(t)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	target := "http://localhost:" + port + "/hook"

	p := Policy{AllowHTTP: true}
	if err := p.CheckURL(target); err != nil {
		t.Fatalf("CheckURL(%s) = %v; a hostname must be left to connect time", target, err)
	}
	resp, err := guardedClient(p).Post(target, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("POST %s succeeded with status %d", target, resp.StatusCode)
	}
	if !errors.Is(err, ErrBlocked) {
		t.Fatalf("POST %s: %v, want ErrBlocked", target, err)
	}
	if !strings.Contains(err.Error(), "is a loopback address") {
		t.Errorf("error %q does not say why", err)
	}
	if n, m := conns.Load(), reqs.Load(); n != 0 || m != 0 {
		t.Fatalf("server saw %d connections and %d requests, want none", n, m)
	}

	// The same request through an allow list naming exactly 127.0.0.1/32 goes through, which
	// shows that the refusal above was the guard's.
	resp, err = guardedClient(Policy{AllowHTTP: true, Allowed: prefixes("127.0.0.1/32")}).
		Post(target, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatalf("POST %s with 127.0.0.1/32 allowed: %v", target, err)
	}
	resp.Body.Close()
	if reqs.Load() != 1 {
		t.Fatalf("server saw %d requests, want 1", reqs.Load())
	}
}

func TestDialContextLiteralAddresses(t *testing.T) {
	srv, conns, reqs := newCountingServer(t)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	dial := Policy{}.DialContext(nil)
	for _, addr := range []string{"127.0.0.1:" + port, "[::ffff:127.0.0.1]:" + port, "[::1]:" + port, "0.0.0.0:" + port} {
		c, err := dial(context.Background(), "tcp", addr)
		if err == nil {
			c.Close()
			t.Fatalf("dial %s succeeded", addr)
		}
		if !errors.Is(err, ErrBlocked) {
			t.Fatalf("dial %s: %v, want ErrBlocked", addr, err)
		}
	}
	if n, m := conns.Load(), reqs.Load(); n != 0 || m != 0 {
		t.Fatalf("server saw %d connections and %d requests, want none", n, m)
	}
}

func TestDialContextKeepsExistingControl(t *testing.T) {
	srv, _, _ := newCountingServer(t)
	addr := srv.Listener.Addr().String()
	var calls atomic.Int64
	d := &net.Dialer{Control: func(string, string, syscall.RawConn) error { calls.Add(1); return nil }}

	if c, err := (Policy{}).DialContext(d)(context.Background(), "tcp", addr); err == nil {
		c.Close()
		t.Fatal("dial to loopback succeeded")
	}
	if calls.Load() != 0 {
		t.Fatal("the dialer's own Control ran for a refused address")
	}
	c, err := Policy{Allowed: prefixes("127.0.0.0/8")}.DialContext(d)(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if calls.Load() != 1 {
		t.Fatalf("the dialer's own Control ran %d times, want 1", calls.Load())
	}
	if d.Control == nil || d.ControlContext != nil {
		t.Fatal("DialContext modified the dialer it was given")
	}

	var ctxCalls atomic.Int64
	d2 := &net.Dialer{ControlContext: func(context.Context, string, string, syscall.RawConn) error { ctxCalls.Add(1); return nil }}
	if c, err := (Policy{}).DialContext(d2)(context.Background(), "tcp", addr); err == nil {
		c.Close()
		t.Fatal("dial to loopback with a ControlContext dialer succeeded")
	}
	if c, err := (Policy{Allowed: prefixes("127.0.0.0/8")}).DialContext(d2)(context.Background(), "tcp", addr); err != nil {
		t.Fatal(err)
	} else {
		c.Close()
	}
	if ctxCalls.Load() != 1 {
		t.Fatalf("the dialer's own ControlContext ran %d times, want 1", ctxCalls.Load())
	}
}

func TestParseHostIP(t *testing.T) {
	cases := []struct {
		host string
		want string // "" means not an IP
	}{
		{"127.0.0.1", "127.0.0.1"},
		{"::1", "::1"},
		{"[::1]", "::1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f.0x0.0x0.0x1", "127.0.0.1"},
		{"0177.1", "127.0.0.1"},
		{"1.2.3", "1.2.0.3"},
		{"1.65535", "1.0.255.255"},
		{"1.65536", "1.1.0.0"},
		{"1.16777215", "1.255.255.255"},
		{"1.16777216", ""},
		{"1.2.256", "1.2.1.0"},
		{"1.2.65536", ""},
		{"0xffffffff", "255.255.255.255"},
		{"00", "0.0.0.0"},
		{"09", ""},
		{"0x1g", ""},
		{"1.2.3.4.", "1.2.3.4"},
		{"example.com", ""},
		{"deadbeef", ""},
		{"0xdeadbeef", "222.173.190.239"},
		{"-1", ""},
		{"1_0", ""},
		{"0b1", ""},
		{"0o1", ""},
	}
	for _, host := range []string{"a:b", "::ffff:0177.0.0.1", "[x]", "1..2", ".1", "1.2.3.4..", "+1", "a%b", ""} {
		if _, _, err := ParseHostIP(host); !errors.Is(err, ErrBlocked) {
			t.Errorf("ParseHostIP(%q) = %v, want ErrBlocked", host, err)
		}
	}
	for _, tc := range cases {
		a, ok, err := ParseHostIP(tc.host)
		if err != nil {
			t.Errorf("ParseHostIP(%q): %v", tc.host, err)
			continue
		}
		got := ""
		if ok {
			got = a.String()
		}
		if got != tc.want {
			t.Errorf("ParseHostIP(%q) = %q, want %q", tc.host, got, tc.want)
		}
	}
}

func BenchmarkCheckAddrPublic(b *testing.B) {
	p := Policy{Allowed: prefixes("10.20.0.0/16")}
	a4, a6 := netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("2606:4700::6810:84e5")
	b.ReportAllocs()
	for b.Loop() {
		if p.CheckAddr(a4) != nil || p.CheckAddr(a6) != nil {
			b.Fatal("refused")
		}
	}
}

// What BlockedRanges and EmbeddedForms list is what CheckAddr refuses: every address of each
// range (its first and last) is refused, and so are the 6to4 and NAT64 forms of a refused IPv4
// range.
func TestBlockedRangesAreRefused(t *testing.T) {
	last := func(p netip.Prefix) netip.Addr {
		b := p.Masked().Addr().AsSlice()
		for i := p.Bits(); i < len(b)*8; i++ {
			b[i/8] |= 0x80 >> (i % 8)
		}
		a, _ := netip.AddrFromSlice(b)
		return a
	}
	var p Policy
	ranges := BlockedRanges()
	if len(ranges) == 0 {
		t.Fatal("no ranges")
	}
	for _, r := range ranges {
		check := []netip.Prefix{r}
		check = append(check, EmbeddedForms(r)...)
		for _, c := range check {
			for _, a := range []netip.Addr{c.Masked().Addr(), last(c)} {
				if c.Addr().Is4() || a.Is4In6() {
					a = a.Unmap()
				}
				if err := p.CheckAddr(a); err == nil {
					t.Errorf("%s (of %s, listed as blocked) is allowed", a, c)
				}
			}
		}
	}
	if got := EmbeddedForms(netip.MustParsePrefix("10.0.0.0/8")); fmt.Sprint(got) != "[2002:a00::/24 64:ff9b::a00:0/104]" {
		t.Errorf("EmbeddedForms(10.0.0.0/8) = %v", got)
	}
	if EmbeddedForms(netip.MustParsePrefix("fd00::/8")) != nil {
		t.Error("EmbeddedForms of an IPv6 range")
	}
}
