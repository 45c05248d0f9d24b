package plugin

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// escape makes text the plugin did not write itself (a receiver's response body or error, a
// producer's payload, headers and event types, a server's error) safe to print on a terminal:
// every C0 control character (tab and newline included), DEL, every C1 control character
// (U+0080 to U+009F, among them the one-byte CSI U+009B) and every byte that is not UTF-8
// becomes a visible escape (\n, \r, \t, \a, \x1b, \u009b, \x9b), so the text can neither
// move the cursor, recolour, retitle or clear the terminal, ring its bell, overwrite what was
// printed before it, nor break the table it is a cell of. Everything else is kept as it is.
//
// It is the one escaping of the plugin's text output: row, writeLine and writeBlock apply it
// to what they print; JSON and YAML output carry the text exactly (see jsonSafe).
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

// jsonSafe writes the C1 control characters of encoded JSON as \u escapes. JSON can hold them
// only inside strings, where the escape decodes to the same character, so the document means
// exactly what it did; the encoder already escapes C0 characters itself.
func jsonSafe(b []byte) []byte {
	if !bytes.Contains(b, []byte{0xc2}) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for i := 0; i < len(b); i++ {
		if b[i] == 0xc2 && i+1 < len(b) && b[i+1] >= 0x80 && b[i+1] <= 0x9f {
			out = fmt.Appendf(out, `\u%04x`, b[i+1])
			i++
			continue
		}
		out = append(out, b[i])
	}
	return out
}
