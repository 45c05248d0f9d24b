package netguard

import "net/netip"

// What a blocked range is, as said in refusals ("127.0.0.1 is a loopback address").
const (
	kindUnspecified = "an unspecified address (it reaches this host)"
	kindLoopback    = "a loopback address"
	kindPrivate     = "a private address"
	kindULA         = "a private (unique-local) address"
	kindLinkLocal   = "a link-local address"
	kindSiteLocal   = "a site-local address (deprecated, private)"
	kindMetadata    = "a cloud metadata address"
	kindCGNAT       = "a carrier-grade NAT (shared, 100.64.0.0/10) address"
	kindMulticast   = "a multicast address"
	kindBroadcast   = "the broadcast address"
	kindIETF        = "an IETF protocol-assignment address (192.0.0.0/24)"
	kindBenchmark   = "a benchmarking address"
	kindDocs        = "a documentation address"
	kindReserved    = "a reserved address"
	kind6to4Relay   = "a reserved address (the former 6to4 relay anycast)"
	kindDiscard     = "a discard-only address"
	kindTeredo      = "a Teredo tunnelling address"
	kindORCHID      = "a non-routable ORCHID address"
	kindLocalNAT64  = "a local-use NAT64 address"
	kindNAT64       = "a NAT64 address (64:ff9b::/96, translated to IPv4 by the network)"
	kindNonGlobal6  = "a reserved IPv6 address (outside global unicast 2000::/3)"
	kindCompat      = "a deprecated IPv4-compatible IPv6 address"
)

// Forms of IPv6 addresses that embed an IPv4 address.
const (
	formMapped       = "an IPv4-mapped IPv6 form of"
	formCompat       = "an IPv4-compatible IPv6 form of"
	formNAT64        = "a NAT64 form of"
	formLocalNAT64   = "a local-use NAT64 form of"
	form6to4         = "a 6to4 form of"
	formTeredoSrv    = "a Teredo address whose server is"
	formTeredoClient = "a Teredo address whose client is"
)

type blockedRange struct {
	prefix netip.Prefix
	kind   string
}

func r(prefix, kind string) blockedRange {
	return blockedRange{netip.MustParsePrefix(prefix), kind}
}

// blocked4 and blocked6 are searched in order; the first match names the range (and is the
// range an allowance must lie in to open the address), so specific entries (metadata,
// broadcast) come before the ranges that contain them.
var blocked4 = []blockedRange{
	r("169.254.169.254/32", kindMetadata), // AWS, GCP, Azure, DigitalOcean, OpenStack...
	r("169.254.170.2/32", kindMetadata),   // AWS ECS task metadata
	r("100.100.100.200/32", kindMetadata), // Alibaba Cloud
	r("192.0.0.192/32", kindMetadata),     // Oracle Cloud
	r("168.63.129.16/32", kindMetadata),   // Azure's wire server (DHCP, DNS, health, the VM agent)
	r("255.255.255.255/32", kindBroadcast),
	r("0.0.0.0/8", kindUnspecified),
	r("10.0.0.0/8", kindPrivate),
	r("100.64.0.0/10", kindCGNAT),
	r("127.0.0.0/8", kindLoopback),
	r("169.254.0.0/16", kindLinkLocal),
	r("172.16.0.0/12", kindPrivate),
	r("192.0.0.0/24", kindIETF),
	r("192.0.2.0/24", kindDocs),
	r("192.88.99.0/24", kind6to4Relay),
	r("192.168.0.0/16", kindPrivate),
	r("198.18.0.0/15", kindBenchmark),
	r("198.51.100.0/24", kindDocs),
	r("203.0.113.0/24", kindDocs),
	r("224.0.0.0/4", kindMulticast),
	r("240.0.0.0/4", kindReserved),
}

// blocked6 ends with the complement of global unicast (2000::/3). IPv4-mapped addresses
// (::ffff:0:0/96) are judged as IPv4. The well-known NAT64 prefix (64:ff9b::/96) is refused
// as a whole: through a cluster's translator it reaches IPv4 addresses the installer may not
// have thought of (its nodes' own network behind the translator); opening it (with
// --allowed-cidrs) still refuses the NAT64 forms of refused IPv4 addresses.
var blocked6 = []blockedRange{
	r("fd00:ec2::254/128", kindMetadata), // AWS instance metadata over IPv6
	r("::/128", kindUnspecified),
	r("::1/128", kindLoopback),
	r("::/96", kindCompat),
	r("64:ff9b::/96", kindNAT64),
	r("64:ff9b:1::/48", kindLocalNAT64),
	r("100::/64", kindDiscard),
	r("2001::/32", kindTeredo),
	r("2001:2::/48", kindBenchmark),
	r("2001:10::/28", kindORCHID),
	r("2001:20::/28", kindORCHID),
	r("2001:db8::/32", kindDocs),
	r("3fff::/20", kindDocs),
	r("fc00::/7", kindULA),
	r("fe80::/10", kindLinkLocal),
	r("fec0::/10", kindSiteLocal),
	r("ff00::/8", kindMulticast),
	r("::/3", kindNonGlobal6),
	r("4000::/2", kindNonGlobal6),
	r("8000::/1", kindNonGlobal6),
}

var (
	prefixCompat     = netip.MustParsePrefix("::/96")
	prefixNAT64      = netip.MustParsePrefix("64:ff9b::/96")
	prefixLocalNAT64 = netip.MustParsePrefix("64:ff9b:1::/48")
	prefix6to4       = netip.MustParsePrefix("2002::/16")
	prefixTeredo     = netip.MustParsePrefix("2001::/32")
)

// lookup is the first range of ranges that contains a.
func lookup(ranges []blockedRange, a netip.Addr) (blockedRange, bool) {
	for _, br := range ranges {
		if br.prefix.Contains(a) {
			return br, true
		}
	}
	return blockedRange{}, false
}

// embedded is an IPv4 address an IPv6 address carries, and in which form.
type embedded struct {
	form string
	addr netip.Addr
}

// embeddedIPv4 lists the IPv4 addresses the IPv6 address a (not IPv4-mapped, without zone)
// carries: the last 32 bits of an IPv4-compatible (::/96, but :: and ::1 are themselves) or
// NAT64 (64:ff9b::/96) address, bits 16-47 of a 6to4 address (2002::/16), and both the
// server's (bits 32-63) and the client's (the last 32 bits, inverted) address of a Teredo one
// (2001::/32). Where a local-use NAT64 address (64:ff9b:1::/48) carries its IPv4 address
// depends on the length of the network's NAT64 prefix (RFC 6052): it is read from the allowed
// prefix that opens it, which must have one of the lengths RFC 6052 defines inside a /48 (48,
// 56, 64 or 96); not opened, it is refused as a local-use NAT64 address anyway.
func embeddedIPv4(a netip.Addr, allowed []netip.Prefix) ([]embedded, error) {
	b := a.As16()
	v4 := func(p [4]byte) netip.Addr { return netip.AddrFrom4(p) }
	switch {
	case prefixCompat.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return []embedded{{formCompat, v4([4]byte(b[12:16]))}}, nil
	case prefixNAT64.Contains(a):
		return []embedded{{formNAT64, v4([4]byte(b[12:16]))}}, nil
	case prefix6to4.Contains(a):
		return []embedded{{form6to4, v4([4]byte(b[2:6]))}}, nil
	case prefixTeredo.Contains(a):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return []embedded{{formTeredoSrv, v4([4]byte(b[4:8]))}, {formTeredoClient, v4(client)}}, nil
	case prefixLocalNAT64.Contains(a):
		pr := opener(allowed, a, prefixLocalNAT64)
		if !pr.IsValid() {
			return nil, nil
		}
		switch pr.Bits() {
		case 48, 56, 64, 96:
			return []embedded{{formLocalNAT64, rfc6052(b, pr.Bits())}}, nil
		}
		return nil, blockedf(a, "%s is a local-use NAT64 address under %s, whose length is not one RFC 6052 defines (48, 56, 64 or 96), so the IPv4 address it carries cannot be checked; allow the network's NAT64 prefix itself with %s", a, pr, AllowCIDRsFlag)
	}
	return nil, nil
}

// rfc6052 is the IPv4 address an IPv4-embedded IPv6 address under a NAT64 prefix of length
// bits carries: the 32 bits after the prefix, skipping bits 64-71 (the "u" octet).
func rfc6052(b [16]byte, bits int) netip.Addr {
	var v [4]byte
	for i, pos := 0, bits/8; i < 4; pos++ {
		if pos == 8 {
			continue
		}
		v[i] = b[pos]
		i++
	}
	return netip.AddrFrom4(v)
}

// BlockedRanges lists the ranges CheckAddr refuses before any allowance (IPv4, then IPv6),
// for what enforces the same outbound policy outside the process (the dispatchers' egress
// NetworkPolicy). IPv4-mapped addresses are refused with their IPv4 address (and are not
// sent as IPv6 on the wire); the 6to4 and NAT64 forms of a refused IPv4 range are in
// EmbeddedForms.
func BlockedRanges() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(blocked4)+len(blocked6))
	for _, br := range blocked4 {
		out = append(out, br.prefix)
	}
	for _, br := range blocked6 {
		out = append(out, br.prefix)
	}
	return out
}

// EmbeddedForms are the IPv6 ranges whose addresses carry an address of the IPv4 range p: its
// 6to4 form (2002::/16) and its NAT64 form (64:ff9b::/96). Nil for an IPv6 p.
func EmbeddedForms(p netip.Prefix) []netip.Prefix {
	if !p.Addr().Is4() {
		return nil
	}
	p = p.Masked()
	v4 := p.Addr().As4()
	var sixToFour, nat64 [16]byte
	sixToFour[0], sixToFour[1] = 0x20, 0x02
	copy(sixToFour[2:6], v4[:])
	nat64 = prefixNAT64.Addr().As16()
	copy(nat64[12:16], v4[:])
	return []netip.Prefix{
		netip.PrefixFrom(netip.AddrFrom16(sixToFour), 16+p.Bits()),
		netip.PrefixFrom(netip.AddrFrom16(nat64), 96+p.Bits()),
	}
}
