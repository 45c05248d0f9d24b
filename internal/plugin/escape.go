package plugin

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// escape makes text the plugin did not write itself (a receiver's response body or error, a
// producer's payload, headers and event types, a server's error) safe to print on a terminal:
// every C0 control character (tab and newline included), DEL, every C1 control character
// (U+0080 to U+009F, among them the one-byte CSI U+009B) and every byte that is not UTF-8
// becomes a visible escape (\n, \r, \t, \a, \x1b, \u009b, \x9b), so the text can neither
// move the cursor, recolour, retitle or clear the terminal, ring its bell, overwrite what was
// printed before it, nor break the table it is a cell of. So does every invisible character
// (see invisible: the bidirectional controls that reorder what a reader sees, as in
// "Trojan Source", zero-width spaces and joiners, the byte order mark), so that two texts that
// differ never look the same. Everything else is kept as it is.
//
// It is the one escaping of the plugin's text output: row, writeLine and writeBlock apply it
// to what they print; JSON and YAML output carry the text exactly (see jsonSafe, yamlSafe).
func escape(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x20 || r == 0x7f:
			switch r {
			case '\a':
				b.WriteString(`\a`)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			case '\v':
				b.WriteString(`\v`)
			default:
				fmt.Fprintf(&b, `\x%02x`, r)
			}
		case r >= 0x80 && r <= 0x9f:
			fmt.Fprintf(&b, `\u%04x`, r)
		case invisible(r) && r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r)
		case invisible(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// escapeArgs escapes the text among a format's arguments: strings, errors and Stringers.
// Numbers and the like are left to the format.
func escapeArgs(a []any) []any {
	out := make([]any, len(a))
	for i, v := range a {
		switch x := v.(type) {
		case string:
			out[i] = escape(x)
		case error:
			out[i] = escape(x.Error())
		case fmt.Stringer:
			out[i] = escape(x.String())
		default:
			out[i] = v
		}
	}
	return out
}

// invisible says whether r, beyond ASCII, shows as nothing or changes how what follows is
// shown: Unicode's format characters (Cf: the bidirectional embeddings, overrides, isolates
// and marks U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C; the zero-width space,
// non-joiner and joiner U+200B-U+200D; the word joiner U+2060; the byte order mark U+FEFF; the
// soft hyphen; tag characters) and the line and paragraph separators U+2028 and U+2029.
func invisible(r rune) bool {
	return r >= 0x80 && unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// jsonSafe writes the C1 control characters and the invisible characters of encoded JSON as
// \u escapes (a surrogate pair beyond U+FFFF). JSON can hold them only inside strings, where
// the escape decodes to the same character, so the document means exactly what it did; the
// encoder already escapes C0 characters itself.
func jsonSafe(b []byte) []byte { return escapeEncoded(b, false) }

// yamlSafe is jsonSafe for a JSON document printed as YAML (whose double-quoted strings take
// JSON's escapes): a character beyond U+FFFF is one \U escape, which YAML reads and a
// surrogate pair it would not.
func yamlSafe(b []byte) []byte { return escapeEncoded(b, true) }

// needsEscape says whether r is escaped in JSON and YAML output.
func needsEscape(r rune) bool { return r >= 0x80 && r <= 0x9f || invisible(r) }

func escapeEncoded(b []byte, yaml bool) []byte {
	i := 0
	for i < len(b) && b[i] < 0x80 {
		i++
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	out = append(out, b[:i]...)
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case !needsEscape(r):
			out = append(out, b[i:i+size]...)
		case r > 0xffff && yaml:
			out = fmt.Appendf(out, `\U%08x`, r)
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

// hasInvisible says whether encoded JSON holds an invisible character.
func hasInvisible(b []byte) bool {
	for i := 0; i < len(b); {
		if b[i] < 0x80 {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if invisible(r) {
			return true
		}
		i += size
	}
	return false
}
