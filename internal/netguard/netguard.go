// Package netguard is the outbound guard that keeps deliveries away from addresses a webhook
// must not reach (SSRF protection): loopback, private, link-local, CGNAT, cloud metadata and
// other special-purpose ranges (the NAT64 prefix among them), unless the installer's allow list
// names them; and the installer's own blocked ranges (its cluster's IPv6 pod and Service
// ranges), whatever the allow list says.
//
// Two checks work together:
//   - CheckURL refuses a URL early (when an endpoint is reconciled or a delivery starts): bad
//     scheme, user-info, or a host that is a literal IP address in a blocked range, including
//     the odd IPv4 spellings ("2130706433", "0177.0.0.1", "127.1") some resolvers accept.
//     Hostnames are not resolved there.
//   - Control (used by DialContext) checks the address a socket is actually connecting to,
//     after DNS resolution, so a hostname that resolves, or is later rebound, to a blocked
//     address is refused at connect time.
//
// An http.Transport using DialContext must not use a proxy (Proxy: nil): through a proxy the
// guard would check the proxy's address, not the endpoint's.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// ErrBlocked is wrapped by every refusal (errors.Is(err, netguard.ErrBlocked)). Its text is
// the delivery failure reason.
var ErrBlocked = errors.New("blocked_address")

// Flag names an installer uses to open or close what the guard refuses; error messages name
// them.
const (
	AllowCIDRsFlag = "--allowed-cidrs"
	BlockCIDRsFlag = "--blocked-cidrs"
	AllowHTTPFlag  = "--allow-http"
)

// Policy is the installer's outbound policy. The zero value is the strictest: https only, and
// every special-purpose range blocked.
type Policy struct {
	// AllowHTTP allows http:// URLs; https is required otherwise.
	AllowHTTP bool
	// Allowed are ranges reachable even though they are blocked by default. Each opens only
	// what lies in the blocked range it names (see CheckAddr): 10.20.0.0/16 opens part of the
	// private 10.0.0.0/8, ::/0 opens nothing blocked. An IPv6 address that embeds an IPv4
	// address (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) is refused whenever the
	// embedded IPv4 address is, and allowed when it is (Teredo, IPv4-compatible and local-use
	// NAT64 addresses also need their own range opened).
	Allowed []netip.Prefix
	// Blocked are ranges refused besides the built-in ones, whatever Allowed says: the
	// installer's (a cluster's IPv6 pod and Service ranges, its NAT64 prefixes, a provider's
	// special addresses). An IPv4 range is refused in its IPv6 forms too (IPv4-mapped,
	// IPv4-compatible, NAT64, 6to4, Teredo).
	Blocked []netip.Prefix
}

// BlockedError is the refusal of a URL or address. It wraps ErrBlocked.
type BlockedError struct {
	// Addr is the refused address; invalid when the refusal is about the URL itself.
	Addr netip.Addr
	// Reason says what is wrong, without the "blocked_address: " prefix.
	Reason string
}

// Error returns "blocked_address: <reason>".
func (e *BlockedError) Error() string { return ErrBlocked.Error() + ": " + e.Reason }

// Unwrap returns ErrBlocked.
func (e *BlockedError) Unwrap() error { return ErrBlocked }

func blockedf(a netip.Addr, format string, args ...any) error {
	return &BlockedError{Addr: a, Reason: fmt.Sprintf(format, args...)}
}

// CheckURL checks an endpoint URL: the scheme is https (or http when AllowHTTP), a host is
// present, there is no user-info, and a host that is a literal IP address (IPv4 in any form a
// resolver may accept, IPv6 bracketed, with or without a zone) is not blocked. Hostnames are
// not resolved; Control checks them at connect time. Errors name the scheme and host but never
// the path or query, which may carry tokens.
func (p Policy) CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return blockedf(netip.Addr{}, "the URL cannot be parsed")
	}
	scheme := strings.ToLower(u.Scheme)
	switch scheme {
	case "https":
	case "http":
		if !p.AllowHTTP {
			return blockedf(netip.Addr{}, "http:// URLs are refused, https is required; allow http with %s", AllowHTTPFlag)
		}
	case "":
		return blockedf(netip.Addr{}, "the URL is not absolute (no https:// scheme)")
	default:
		return blockedf(netip.Addr{}, "the URL scheme %q is not https", scheme)
	}
	if u.Opaque != "" {
		return blockedf(netip.Addr{}, "the %s URL has no //host", scheme)
	}
	if u.User != nil {
		return blockedf(netip.Addr{}, "the URL carries user-info (user:password@), which is refused")
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return blockedf(netip.Addr{}, "the URL port %q is not 1-65535", port)
		}
	}
	host := u.Hostname()
	if host == "" {
		return blockedf(netip.Addr{}, "the URL has no host")
	}
	a, ok, err := ParseHostIP(host)
	if err != nil {
		return err
	}
	if !ok {
		return nil // a hostname: checked at connect time
	}
	return p.CheckAddr(a)
}

// ParseHostIP reports whether host (a URL's hostname, without brackets) is an IP address
// literal, and which. Besides the standard forms it accepts what inet_aton(3), and so libc
// resolvers, accept: one to four parts, each decimal, octal (leading 0) or hex (0x), the last
// filling the remaining bytes ("2130706433", "0x7f.1", "0177.0.0.1", "127.1"), with an
// optional trailing dot. A host that is neither an IP address nor a valid hostname (see
// validHostname) is an error wrapping ErrBlocked.
func ParseHostIP(host string) (netip.Addr, bool, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, true, nil
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		if a, err := netip.ParseAddr(host[1 : len(host)-1]); err == nil {
			return a, true, nil
		}
	}
	if strings.ContainsAny(host, ":[]") {
		return netip.Addr{}, false, blockedf(netip.Addr{}, "the URL host is neither a hostname nor a valid IP address")
	}
	if a, ok := parseInetAton(strings.TrimSuffix(host, ".")); ok {
		return a, true, nil
	}
	if !validHostname(host) {
		return netip.Addr{}, false, blockedf(netip.Addr{}, "the URL host %q is not a valid hostname", host)
	}
	return netip.Addr{}, false, nil
}

// validHostname allows what DNS names (and internationalised ones, which HTTP clients convert
// to punycode) are made of: letters, digits, '-', '_', non-ASCII, and non-empty dot-separated
// labels with an optional final dot. Anything else ('%', '+', ',' and the other characters
// url.Parse lets into a host) could only be read in surprising ways by some resolver.
func validHostname(host string) bool {
	host = strings.TrimSuffix(host, ".")
	if host == "" || len(host) > 253*4 {
		return false
	}
	label := 0
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c >= 0x80:
		default:
			return false
		}
		label++
	}
	return label > 0
}

// parseInetAton parses the IPv4 forms inet_aton(3) accepts.
func parseInetAton(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	var parts [4]uint64
	n := 0
	for {
		if n == 4 {
			return netip.Addr{}, false
		}
		tok, rest, more := strings.Cut(s, ".")
		v, ok := parseAtonPart(tok)
		if !ok {
			return netip.Addr{}, false
		}
		parts[n] = v
		n++
		if !more {
			break
		}
		s = rest
	}
	var v uint64
	for i := 0; i < n-1; i++ {
		if parts[i] > 0xff {
			return netip.Addr{}, false
		}
		v |= parts[i] << (8 * (3 - i))
	}
	last := parts[n-1]
	if last > (uint64(1)<<(8*(5-n)))-1 {
		return netip.Addr{}, false
	}
	v |= last
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// parseAtonPart parses one part: 0x/0X hex (bare "0x" is 0, as glibc reads it), leading-0
// octal, or decimal. Values above 32 bits fail.
func parseAtonPart(s string) (uint64, bool) {
	base := 10
	switch {
	case len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'):
		base, s = 16, s[2:]
		if s == "" {
			return 0, true
		}
	case len(s) >= 2 && s[0] == '0':
		base, s = 8, s[1:]
	}
	if s == "" {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		var d uint64
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= uint64(base) {
			return 0, false
		}
		v = v*uint64(base) + d
		if v > 0xffffffff {
			return 0, false
		}
	}
	return v, true
}

// CheckAddr refuses an address in a blocked range unless the allow list opens it. The error
// says what the address is and how to allow it.
//
// An IPv6 address that carries an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4,
// Teredo) is judged by that IPv4 address first, and only IPv4 allowances can open it: allowing
// ::/0 never lets ::ffff:127.0.0.1, 64:ff9b::7f00:1 or 2002:7f00:1:: through. Then the address
// itself: an allowance opens a blocked address only when it lies inside the range the refusal
// names (127.0.0.0/8 or 127.0.0.1/32 open 127.0.0.1; 0.0.0.0/0 and ::/0 open nothing blocked;
// only ::1/128 opens ::1; 169.254.0.0/16 opens link-local addresses but not 169.254.169.254,
// a metadata address that must be named itself).
func (p Policy) CheckAddr(a netip.Addr) error {
	if !a.IsValid() {
		return blockedf(a, "no valid IP address")
	}
	a = a.WithZone("")
	allowed := normalized(p.Allowed)
	extra := normalized(p.Blocked)
	if a.Is4() || a.Is4In6() {
		v4 := a.Unmap()
		if b, ok := within(extra, v4); ok {
			if a.Is4In6() {
				return blockedf(a, "%s is %s %s, which is in %s, a range the installation blocks (%s)", a, formMapped, v4, b, BlockCIDRsFlag)
			}
			return blockedf(a, "%s is in %s, a range the installation blocks (%s)", a, b, BlockCIDRsFlag)
		}
		br, blocked := lookup(blocked4, v4)
		if !blocked || opens(allowed, v4, br.prefix) {
			return nil
		}
		if a.Is4In6() {
			return blockedf(a, "%s is %s %s, which is %s; allow it with %s", a, formMapped, v4, br.kind, AllowCIDRsFlag)
		}
		return blockedf(a, "%s is %s; allow it with %s", a, br.kind, AllowCIDRsFlag)
	}
	if b, ok := within(extra, a); ok {
		return blockedf(a, "%s is in %s, a range the installation blocks (%s)", a, b, BlockCIDRsFlag)
	}
	emb, err := embeddedIPv4(a, allowed)
	if err != nil {
		return err
	}
	for _, e := range emb {
		if b, ok := within(extra, e.addr); ok {
			return blockedf(a, "%s is %s %s, which is in %s, a range the installation blocks (%s)", a, e.form, e.addr, b, BlockCIDRsFlag)
		}
		if br, blocked := lookup(blocked4, e.addr); blocked && !opens(allowed, e.addr, br.prefix) {
			return blockedf(a, "%s is %s %s, which is %s; allow it with %s", a, e.form, e.addr, br.kind, AllowCIDRsFlag)
		}
	}
	br, blocked := lookup(blocked6, a)
	if !blocked || opens(allowed, a, br.prefix) {
		return nil
	}
	return blockedf(a, "%s is %s; allow it with %s", a, br.kind, AllowCIDRsFlag)
}

// normalized is an allow or block list with IPv4-mapped prefixes (::ffff:10.0.0.0/104) read
// as the IPv4 prefixes they map (10.0.0.0/8): a dual-stack socket connects to the IPv4
// address. Every prefix is masked.
func normalized(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, pr := range ps {
		out = append(out, Normalize(pr))
	}
	return out
}

// Normalize is pr masked, an IPv4-mapped prefix (::ffff:10.0.0.0/104) read as the IPv4 prefix
// it maps (10.0.0.0/8), as the guard reads the installer's lists.
func Normalize(pr netip.Prefix) netip.Prefix {
	if pa := pr.Addr(); pa.Is4In6() && pr.Bits() >= 96 {
		pr = netip.PrefixFrom(pa.Unmap(), pr.Bits()-96)
	}
	return pr.Masked()
}

// within is the first prefix of ps that contains a.
func within(ps []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// opens reports whether an allowed prefix that lies inside rng (the blocked range a falls in)
// contains a. A prefix wider than the range opens nothing in it.
func opens(allowed []netip.Prefix, a netip.Addr, rng netip.Prefix) bool {
	return opener(allowed, a, rng).IsValid()
}

// opener is the longest allowed prefix inside rng that contains a, or the zero Prefix.
func opener(allowed []netip.Prefix, a netip.Addr, rng netip.Prefix) netip.Prefix {
	var best netip.Prefix
	for _, pr := range allowed {
		if pr.Contains(a) && pr.Bits() >= rng.Bits() && rng.Contains(pr.Addr()) && (!best.IsValid() || pr.Bits() > best.Bits()) {
			best = pr
		}
	}
	return best
}

// Control checks the address a socket is about to connect to (the resolved IP, so DNS
// rebinding cannot get around it). Use it as net.Dialer.Control.
func (p Policy) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return blockedf(netip.Addr{}, "cannot check the %s address %q being connected to", network, address)
	}
	return p.CheckAddr(ap.Addr())
}

// DialContext returns d's DialContext with Control checking every address connected to. Any
// Control or ControlContext already set on d still runs, after the check. d is not modified;
// a nil d is a zero net.Dialer.
func (p Policy) DialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dd := net.Dialer{}
	if d != nil {
		dd = *d
	}
	switch {
	case dd.ControlContext != nil:
		next := dd.ControlContext
		dd.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
			if err := p.Control(network, address, c); err != nil {
				return err
			}
			return next(ctx, network, address, c)
		}
	case dd.Control != nil:
		next := dd.Control
		dd.Control = func(network, address string, c syscall.RawConn) error {
			if err := p.Control(network, address, c); err != nil {
				return err
			}
			return next(network, address, c)
		}
	default:
		dd.Control = p.Control
	}
	return dd.DialContext
}
