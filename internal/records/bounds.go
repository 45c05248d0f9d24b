package records

import (
	"net/url"
	"strings"
	"unicode/utf8"
)

// Bounds of what is stored. Everything a receiver or a producer supplies is cut to one of
// these before it is written to JetStream or to a status.
const (
	// MaxErrorText bounds an error text (a receiver's Location header included).
	MaxErrorText = 1024
	// MaxHeaderValue bounds one request header value kept in the delivery log.
	MaxHeaderValue = 1024
	// MaxMessageText bounds the explanation of a dead letter.
	MaxMessageText = 2048
)

// truncatedMark ends a string that was cut.
const truncatedMark = "…"

// Bound returns s cut to at most n bytes (the mark included), without splitting a UTF-8
// sequence; a cut string ends with "…".
func Bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(truncatedMark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncatedMark
}

// StoredError is an error text as it may be stored: URLs redacted, then bounded.
func StoredError(s string) string {
	return Bound(RedactURLs(s), MaxErrorText)
}

// RedactURLs removes what may hold a credential from every http(s) URL in s: its user-info,
// query and fragment. A URL that does not parse is cut after its host.
func RedactURLs(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	var b strings.Builder
	rest := s
	for {
		i := indexURL(rest)
		if i < 0 {
			if b.Len() == 0 {
				return s
			}
			b.WriteString(rest)
			return b.String()
		}
		end := i
		for end < len(rest) && !urlEnds(rest[end]) {
			end++
		}
		b.WriteString(rest[:i])
		b.WriteString(redactURL(rest[i:end]))
		rest = rest[end:]
	}
}

// indexURL finds the next "http://" or "https://", in any case.
func indexURL(s string) int {
	for i := 0; i+7 <= len(s); i++ {
		if s[i] != 'h' && s[i] != 'H' {
			continue
		}
		l := strings.ToLower(s[i:min(len(s), i+8)])
		if strings.HasPrefix(l, "http://") || strings.HasPrefix(l, "https://") {
			return i
		}
	}
	return -1
}

func urlEnds(c byte) bool {
	return c <= ' ' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' || c == 0x7f
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		// Keep the scheme and what looks like the host only.
		scheme, rest, _ := strings.Cut(raw, "://")
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			rest = rest[at+1:]
		}
		if j := strings.IndexAny(rest, "/?#"); j >= 0 {
			rest = rest[:j]
		}
		return scheme + "://" + rest + "/[redacted]"
	}
	redacted := u.RawQuery != "" || u.Fragment != "" || u.User != nil
	u.User, u.RawQuery, u.Fragment, u.RawFragment, u.ForceQuery = nil, "", "", "", false
	if redacted {
		return u.String() + "?[redacted]"
	}
	return u.String()
}

// Bounded returns r with every receiver-supplied string bounded and URLs in its error
// redacted.
func (r Response) Bounded() Response {
	if len(r.Body) > MaxResponseBody {
		r.Body, _ = CutBody([]byte(r.Body))
		r.Truncated = true
	}
	r.Error = StoredError(r.Error)
	return r
}
