package netguard

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// refBlocked4 and refBlocked6 are an independent list of the ranges the guard must refuse,
// written from the RFC 6890 registries and the product brief, checked with package net rather
// than net/netip. A refused address is opened only by an allowance that lies inside the
// narrowest of these ranges containing it (found by mask length, not by list order).
var refBlocked4 = refNets(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"255.255.255.255/32", "169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32", "192.0.0.192/32",
	"168.63.129.16/32",
)

var refBlocked6 = refNets(
	"::/128", "::1/128", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
	"fd00:ec2::254/128", "2001::/32", "2001:db8::/32", "3fff::/20", "2001:2::/48",
	"2001:10::/28", "2001:20::/28", "100::/64", "64:ff9b:1::/48",
	"64:ff9b::/96", // well-known NAT64: refused as a whole unless opened
	"::/96",        // IPv4-compatible (deprecated)
	// Everything outside global unicast (2000::/3).
	"::/3", "4000::/2", "8000::/1",
)

func refNets(cidrs ...string) []*net.IPNet {
	out := make([]*net.IPNet, len(cidrs))
	for i, c := range cidrs {
		_, n, err := net.ParseCIDR(c)
		if err != nil {
			panic(err)
		}
		out[i] = n
	}
	return out
}

// refNarrowest is the net of nets with the longest mask that contains ip, or nil.
func refNarrowest(nets []*net.IPNet, ip net.IP) *net.IPNet {
	var best *net.IPNet
	for _, n := range nets {
		if !n.Contains(ip) {
			continue
		}
		if best == nil {
			best = n
			continue
		}
		a, _ := n.Mask.Size()
		b, _ := best.Mask.Size()
		if a > b {
			best = n
		}
	}
	return best
}

// refInside reports whether inner lies within outer (same family).
func refInside(inner, outer *net.IPNet) bool {
	ib, ibits := inner.Mask.Size()
	ob, obits := outer.Mask.Size()
	return ibits == obits && ib >= ob && outer.Contains(inner.IP)
}

// refMapped reports whether ip (16 bytes) is ::ffff:a.b.c.d.
func refMapped(ip net.IP) bool {
	return len(ip) == 16 && [10]byte(ip[:10]) == [10]byte{} && ip[10] == 0xff && ip[11] == 0xff
}

// refNormalize reads an IPv4-mapped allowance (::ffff:a.b.c.d/96+n) as the IPv4 allowance
// a.b.c.d/n.
func refNormalize(allow []*net.IPNet) []*net.IPNet {
	out := make([]*net.IPNet, 0, len(allow))
	for _, n := range allow {
		ones, bits := n.Mask.Size()
		if bits == 128 && ones >= 96 && refMapped(n.IP) {
			n = &net.IPNet{IP: n.IP[12:16], Mask: net.CIDRMask(ones-96, 32)}
		}
		out = append(out, n)
	}
	return out
}

// refOpens is the longest allowance that contains ip and lies inside rng, or nil.
func refOpens(allow []*net.IPNet, ip net.IP, rng *net.IPNet) *net.IPNet {
	var best *net.IPNet
	for _, n := range allow {
		if len(n.IP) != len(ip) || !n.Contains(ip) || !refInside(n, rng) {
			continue
		}
		if best == nil {
			best = n
		} else if a, _ := n.Mask.Size(); a > func() int { b, _ := best.Mask.Size(); return b }() {
			best = n
		}
	}
	return best
}

func refAllows4(ip net.IP, allow []*net.IPNet) bool {
	rng := refNarrowest(refBlocked4, ip)
	return rng == nil || refOpens(allow, ip, rng) != nil
}

// refAllows is the reference judgement of ip (4 or 16 bytes) under the (normalized) allowances.
func refAllows(ip net.IP, allow []*net.IPNet) bool {
	if len(ip) == 4 {
		return refAllows4(ip, allow)
	}
	if refMapped(ip) {
		return refAllows4(ip[12:16], allow)
	}
	v4s, ok := refEmbedded(ip, allow)
	if !ok {
		return false
	}
	for _, v4 := range v4s {
		if !refAllows4(v4, allow) {
			return false
		}
	}
	rng := refNarrowest(refBlocked6, ip)
	return rng == nil || refOpens(allow, ip, rng) != nil
}

// refEmbedded lists the IPv4 addresses ip (16 bytes, not IPv4-mapped) carries; ok is false
// when they cannot be told (a local-use NAT64 address opened by a prefix of a length RFC 6052
// does not define). :: and ::1 are themselves, not IPv4-compatible forms.
func refEmbedded(ip net.IP, allow []*net.IPNet) (v4s []net.IP, ok bool) {
	if ip.Equal(net.IPv6unspecified) || ip.Equal(net.IPv6loopback) {
		return nil, true
	}
	switch {
	case [12]byte(ip[:12]) == [12]byte{}: // ::/96
		return []net.IP{ip[12:16]}, true
	case ip[0] == 0x00 && ip[1] == 0x64 && ip[2] == 0xff && ip[3] == 0x9b && [8]byte(ip[4:12]) == [8]byte{}: // 64:ff9b::/96
		return []net.IP{ip[12:16]}, true
	case ip[0] == 0x20 && ip[1] == 0x02: // 2002::/16
		return []net.IP{ip[2:6]}, true
	case ip[0] == 0x20 && ip[1] == 0x01 && ip[2] == 0 && ip[3] == 0: // Teredo 2001::/32
		client := net.IP{^ip[12], ^ip[13], ^ip[14], ^ip[15]}
		return []net.IP{ip[4:8], client}, true
	case ip[0] == 0x00 && ip[1] == 0x64 && ip[2] == 0xff && ip[3] == 0x9b && ip[4] == 0 && ip[5] == 1: // 64:ff9b:1::/48
		n := refOpens(allow, ip, refNets("64:ff9b:1::/48")[0])
		if n == nil {
			return nil, true // refused as local-use NAT64 anyway
		}
		ones, _ := n.Mask.Size()
		// RFC 6052, section 2.2: the IPv4 address follows the prefix; bits 64-71 stay zero.
		var bits []byte
		switch ones {
		case 48:
			bits = []byte{ip[6], ip[7], ip[9], ip[10]}
		case 56:
			bits = []byte{ip[7], ip[9], ip[10], ip[11]}
		case 64:
			bits = []byte{ip[9], ip[10], ip[11], ip[12]}
		case 96:
			bits = []byte{ip[12], ip[13], ip[14], ip[15]}
		default:
			return nil, false
		}
		return []net.IP{net.IP(bits)}, true
	}
	return nil, true
}

func ipOf(a netip.Addr) net.IP {
	s := a.AsSlice()
	return net.IP(s)
}

// addrFromBytes makes an IPv4 address from 4 bytes or fewer, an IPv6 one otherwise.
func addrFromBytes(b []byte) netip.Addr {
	if len(b) <= 4 {
		var a [4]byte
		copy(a[:], b)
		return netip.AddrFrom4(a)
	}
	var a [16]byte
	copy(a[:], b)
	return netip.AddrFrom16(a)
}

func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1", "10.1.2.3", "169.254.169.254", "8.8.8.8", "100.64.0.1", "255.255.255.255",
		"::1", "::", "::ffff:127.0.0.1", "::ffff:8.8.8.8", "::127.0.0.1", "fd00::1", "fd00:ec2::254",
		"fe80::1", "64:ff9b::7f00:1", "64:ff9b::808:808", "2002:7f00:1::", "2002:808:808::",
		"2001::1", "2606:4700::1", "5f00::1", "ff02::1", "3fff::1",
		"64:ff9b:1::7f00:1", "64:ff9b:1:7f00:0:100::", "2001:0:4136:e378:8000:63bf:80ff:fffe",
		"2001:0:a00:1::f7f7:f7f7", "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
	} {
		a := netip.MustParseAddr(s)
		f.Add(a.AsSlice(), []byte{}, uint8(0), []byte{}, uint8(0))
		f.Add(a.AsSlice(), a.AsSlice(), uint8(a.BitLen()), []byte{}, uint8(0))
		f.Add(a.AsSlice(), []byte{127, 0, 0, 1}, uint8(32), []byte{}, uint8(0))
		// The wide allowances of the issue: ::/0 (with 0.0.0.0/0), and the ranges themselves.
		f.Add(a.AsSlice(), make([]byte, 16), uint8(0), []byte{0, 0, 0, 0}, uint8(0))
		f.Add(a.AsSlice(), netip.MustParseAddr("2001::").AsSlice(), uint8(32), []byte{127, 0, 0, 0}, uint8(8))
		for _, bits := range []uint8{48, 56, 64, 80, 96} {
			f.Add(a.AsSlice(), netip.MustParseAddr("64:ff9b:1::").AsSlice(), bits, []byte{127, 0, 0, 0}, uint8(8))
		}
	}
	prefixOf := func(t *testing.T, b []byte, bits uint8) (netip.Prefix, *net.IPNet) {
		pa := addrFromBytes(b)
		pr, err := pa.Prefix(int(bits) % (pa.BitLen() + 1))
		if err != nil {
			t.Fatal(err)
		}
		return pr, &net.IPNet{IP: ipOf(pr.Addr()), Mask: net.CIDRMask(pr.Bits(), pr.Addr().BitLen())}
	}
	f.Fuzz(func(t *testing.T, addr, allowed []byte, bits uint8, allowed2 []byte, bits2 uint8) {
		a := addrFromBytes(addr)
		var p Policy
		var allow []*net.IPNet
		for _, al := range []struct {
			b    []byte
			bits uint8
		}{{allowed, bits}, {allowed2, bits2}} {
			if len(al.b) == 0 {
				continue
			}
			pr, n := prefixOf(t, al.b, al.bits)
			p.Allowed = append(p.Allowed, pr)
			allow = append(allow, n)
		}
		err := p.CheckAddr(a)
		if err != nil && !errors.Is(err, ErrBlocked) {
			t.Fatalf("CheckAddr(%s) = %v, not ErrBlocked", a, err)
		}
		refAllowed := refAllows(ipOf(a), refNormalize(allow))
		if (err == nil) != refAllowed {
			t.Fatalf("CheckAddr(%s) with allowed %v = %v, reference allows: %v", a, p.Allowed, err, refAllowed)
		}
		// The same address with a zone is judged the same.
		if a.Is6() {
			if err2 := p.CheckAddr(a.WithZone("eth0")); (err2 == nil) != (err == nil) {
				t.Fatalf("CheckAddr(%s%%eth0) = %v, without zone %v", a, err2, err)
			}
		}
		// Allowing ::/0 (or 0.0.0.0/0) on top changes nothing.
		wide := Policy{Allowed: append(slices.Clone(p.Allowed), netip.MustParsePrefix("::/0"), netip.MustParsePrefix("0.0.0.0/0"))}
		if err3 := wide.CheckAddr(a); (err3 == nil) != (err == nil) {
			t.Fatalf("CheckAddr(%s) with ::/0 and 0.0.0.0/0 added to %v = %v, without %v", a, p.Allowed, err3, err)
		}
	})
}

// refAton parses the IPv4 forms inet_aton accepts, written independently of parseInetAton.
func refAton(s string) net.IP {
	s = strings.TrimSuffix(s, ".")
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return nil
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base := 10
		lp := strings.ToLower(p)
		switch {
		case strings.HasPrefix(lp, "0x"):
			base, p = 16, p[2:]
			if p == "" {
				p = "0"
			}
		case len(p) > 1 && p[0] == '0':
			base = 8
		}
		if p == "" || strings.ContainsAny(p, "+-_") {
			return nil
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return nil
		}
		vals[i] = v
	}
	var out uint32
	for i, v := range vals {
		if i == len(vals)-1 {
			if v >= 1<<(8*(4-i)) {
				return nil
			}
			out |= uint32(v)
		} else {
			if v > 255 {
				return nil
			}
			out |= uint32(v) << (8 * (3 - i))
		}
	}
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, out)
	return ip
}

func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{
		"https://hooks.example.com/x", "http://hooks.example.com/", "https://127.0.0.1/",
		"https://[::1]:8443/", "https://[::ffff:127.0.0.1]/", "https://2130706433/",
		"https://0177.0.0.1/", "https://127.1/", "https://0x7f.1/", "https://169.254.169.254/",
		"https://[fd00::1]/", "https://[fe80::1%25eth0]/", "https://user:pw@x.example.com/",
		"https:x", "ftp://x/", "https://0/", "https://8.8.8.8/", "https://[64:ff9b::a9fe:a9fe]/",
		"https://127.0.0.1./", "https://x:0/", "//x/", "", "https://%ff/",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, raw string, allowHTTP bool) {
		p := Policy{AllowHTTP: allowHTTP}
		err := p.CheckURL(raw)
		if err != nil {
			if !errors.Is(err, ErrBlocked) {
				t.Fatalf("CheckURL(%q) = %v, not ErrBlocked", raw, err)
			}
			return
		}
		u, perr := url.Parse(raw)
		if perr != nil {
			t.Fatalf("CheckURL(%q) accepted a URL url.Parse rejects: %v", raw, perr)
		}
		switch strings.ToLower(u.Scheme) {
		case "https":
		case "http":
			if !allowHTTP {
				t.Fatalf("CheckURL(%q) accepted http without AllowHTTP", raw)
			}
		default:
			t.Fatalf("CheckURL(%q) accepted scheme %q", raw, u.Scheme)
		}
		if u.User != nil || u.Hostname() == "" {
			t.Fatalf("CheckURL(%q) accepted user-info or an empty host", raw)
		}
		host := u.Hostname()
		if strings.Contains(host, ":") {
			host, _, _ = strings.Cut(host, "%") // an IPv6 zone
		}
		for _, c := range host {
			if !(c == '.' || c == '-' || c == '_' || c == ':' || c >= 0x80 ||
				'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
				t.Fatalf("CheckURL(%q) accepted host %q", raw, host)
			}
		}
		// Every way a resolver may read the host as an IP address must be allowed.
		for _, ip := range []net.IP{net.ParseIP(host), refAton(host)} {
			if ip == nil {
				continue
			}
			if ip4 := ip.To4(); ip4 != nil && !strings.Contains(host, ":") {
				ip = ip4
			}
			if !refAllows(ip, nil) {
				t.Fatalf("CheckURL(%q) accepted %s, which is blocked", raw, ip)
			}
		}
	})
}
