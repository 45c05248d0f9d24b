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
	kindNonGlobal6  = "a reserved IPv6 address (outside global unicast 2000::/3)"
	kindCompat      = "a deprecated IPv4-compatible IPv6 address"
)

// Forms of IPv6 addresses that embed an IPv4 address.
const (
	formMapped = "an IPv4-mapped IPv6 form"
	formCompat = "an IPv4-compatible IPv6 form"
	formNAT64  = "a NAT64 form"
	form6to4   = "a 6to4 form"
)

type blockedRange struct {
	prefix netip.Prefix
	kind   string
}

func r(prefix, kind string) blockedRange {
	return blockedRange{netip.MustParsePrefix(prefix), kind}
}

// blocked4 and blocked6 are searched in order; the first match names the range, so specific
// entries (metadata, broadcast) come before the ranges that contain them.
var blocked4 = []blockedRange{
	r("169.254.169.254/32", kindMetadata), // AWS, GCP, Azure, DigitalOcean, OpenStack...
	r("169.254.170.2/32", kindMetadata),   // AWS ECS task metadata
	r("100.100.100.200/32", kindMetadata), // Alibaba Cloud
	r("192.0.0.192/32", kindMetadata),     // Oracle Cloud
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

var blocked6 = []blockedRange{
	r("fd00:ec2::254/128", kindMetadata), // AWS instance metadata over IPv6
	r("::/128", kindUnspecified),
	r("::1/128", kindLoopback),
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
}

var (
	prefixCompat  = netip.MustParsePrefix("::/96")
	prefixNAT64   = netip.MustParsePrefix("64:ff9b::/96")
	prefix6to4    = netip.MustParsePrefix("2002::/16")
	prefixGlobal6 = netip.MustParsePrefix("2000::/3")
)

// class is what classify says about an address.
type class struct {
	// kind is why the address is blocked; "" when it is globally reachable.
	kind string
	// form, embedded and embeddedKind describe an IPv6 address that embeds an IPv4 address:
	// it is blocked when the embedded address is (always, for the deprecated compatible form).
	form         string
	embedded     netip.Addr
	embeddedKind string
}

func lookup(ranges []blockedRange, a netip.Addr) string {
	for _, br := range ranges {
		if br.prefix.Contains(a) {
			return br.kind
		}
	}
	return ""
}

// classify says whether a (without zone) is in a blocked range, and which.
func classify(a netip.Addr) class {
	if a.Is4() {
		return class{kind: lookup(blocked4, a)}
	}
	if k := lookup(blocked6, a); k != "" {
		return class{kind: k}
	}
	b := a.As16()
	var form string
	var v4 netip.Addr
	switch {
	case a.Is4In6():
		form, v4 = formMapped, a.Unmap()
	case prefixCompat.Contains(a):
		form, v4 = formCompat, netip.AddrFrom4([4]byte(b[12:16]))
	case prefixNAT64.Contains(a):
		form, v4 = formNAT64, netip.AddrFrom4([4]byte(b[12:16]))
	case prefix6to4.Contains(a):
		form, v4 = form6to4, netip.AddrFrom4([4]byte(b[2:6]))
	case !prefixGlobal6.Contains(a):
		return class{kind: kindNonGlobal6}
	default:
		return class{}
	}
	c := class{form: form, embedded: v4, embeddedKind: lookup(blocked4, v4)}
	switch {
	case form == formCompat && c.embeddedKind == "":
		c.kind = kindCompat
	case c.embeddedKind != "":
		c.kind = form + " of " + v4.String() + ", which is " + c.embeddedKind
	}
	return c
}
