package netguard

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// refBlocked4 and refBlocked6 are an independent list of the ranges the guard must refuse,
// written from the RFC 6890 registries and the product brief, checked with package net rather
// than net/netip.
var refBlocked4 = refNets(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"255.255.255.255/32", "169.254.169.254/32", "100.100.100.200/32",
)

var refBlocked6 = refNets(
	"::/128", "::1/128", "fc00::/7", "fd00::/8", "fe80::/10", "fec0::/10", "ff00::/8",
	"fd00:ec2::254/128", "2001::/32", "2001:db8::/32", "3fff::/20", "2001:2::/48",
	"2001:10::/28", "2001:20::/28", "100::/64", "64:ff9b:1::/48",
	"::/96", // IPv4-compatible (deprecated): refused whatever it embeds
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

func refIn(nets []*net.IPNet, ip net.IP) bool {
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// refBlockedIP reports whether ip (4 or 16 bytes) must be refused by default.
func refBlockedIP(ip net.IP) bool {
	if len(ip) == 4 {
		return refIn(refBlocked4, ip)
	}
	var zero10 [10]byte
	switch {
	case [10]byte(ip[:10]) == zero10 && ip[10] == 0xff && ip[11] == 0xff: // ::ffff:a.b.c.d
		return refIn(refBlocked4, ip[12:16])
	case refIn(refBlocked6, ip):
		return true
	case ip[0] == 0x00 && ip[1] == 0x64 && ip[2] == 0xff && ip[3] == 0x9b && [8]byte(ip[4:12]) == [8]byte{}: // 64:ff9b::/96
		return refIn(refBlocked4, ip[12:16])
	case ip[0] == 0x20 && ip[1] == 0x02: // 2002::/16
		return refIn(refBlocked4, ip[2:6])
	default:
		return ip[0]&0xe0 != 0x20 // outside 2000::/3
	}
}

// refEmbedded is the IPv4 address an IPv6 form embeds, if any. :: and ::1 are themselves,
// not IPv4-compatible forms of 0.0.0.0 and 0.0.0.1.
func refEmbedded(ip net.IP) net.IP {
	if len(ip) != 16 || ip.Equal(net.IPv6unspecified) || ip.Equal(net.IPv6loopback) {
		return nil
	}
	switch {
	case [10]byte(ip[:10]) == [10]byte{} && ((ip[10] == 0xff && ip[11] == 0xff) || (ip[10] == 0 && ip[11] == 0)):
		return ip[12:16]
	case ip[0] == 0x00 && ip[1] == 0x64 && ip[2] == 0xff && ip[3] == 0x9b && [8]byte(ip[4:12]) == [8]byte{}:
		return ip[12:16]
	case ip[0] == 0x20 && ip[1] == 0x02:
		return ip[2:6]
	}
	return nil
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
	} {
		a := netip.MustParseAddr(s)
		f.Add(a.AsSlice(), []byte{}, uint8(0))
		f.Add(a.AsSlice(), a.AsSlice(), uint8(a.BitLen()))
		f.Add(a.AsSlice(), []byte{127, 0, 0, 1}, uint8(32))
	}
	f.Fuzz(func(t *testing.T, addr, allowed []byte, bits uint8) {
		a := addrFromBytes(addr)
		var p Policy
		var allowNet *net.IPNet
		if len(allowed) > 0 {
			pa := addrFromBytes(allowed)
			pr, err := pa.Prefix(int(bits) % (pa.BitLen() + 1))
			if err != nil {
				t.Fatal(err)
			}
			p.Allowed = []netip.Prefix{pr}
			allowNet = &net.IPNet{IP: ipOf(pr.Addr()), Mask: net.CIDRMask(pr.Bits(), pr.Addr().BitLen())}
		}
		err := p.CheckAddr(a)
		if err != nil && !errors.Is(err, ErrBlocked) {
			t.Fatalf("CheckAddr(%s) = %v, not ErrBlocked", a, err)
		}
		ip := ipOf(a)
		refAllowed := !refBlockedIP(ip)
		if allowNet != nil && allowNet.Contains(ip) {
			refAllowed = true
		}
		if e := refEmbedded(ip); e != nil && allowNet != nil && allowNet.Contains(e) {
			refAllowed = true
		}
		if (err == nil) != refAllowed {
			t.Fatalf("CheckAddr(%s) with allowed %v = %v, reference allows: %v", a, p.Allowed, err, refAllowed)
		}
		// The same address with a zone is judged the same.
		if a.Is6() {
			if err2 := p.CheckAddr(a.WithZone("eth0")); (err2 == nil) != (err == nil) {
				t.Fatalf("CheckAddr(%s%%eth0) = %v, without zone %v", a, err2, err)
			}
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
			if refBlockedIP(ip) {
				t.Fatalf("CheckURL(%q) accepted %s, which is blocked", raw, ip)
			}
		}
	})
}
