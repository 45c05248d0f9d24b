package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"
)

func TestLatencyPrecision(t *testing.T) {
	for _, tc := range []struct {
		ms, us int64
		want   string
	}{
		{0, 0, "0ms"}, {12, 0, "12ms"}, // records without microseconds
		{0, 40, "0.04ms"}, {0, 437, "0.4ms"}, {3, 3260, "3.3ms"}, {9, 9940, "9.9ms"}, {12, 12600, "12ms"}, {1500, 1500000, "1500ms"},
	} {
		if got := latency(tc.ms, tc.us); got != tc.want {
			t.Errorf("latency(%d, %d) = %q, want %q", tc.ms, tc.us, got, tc.want)
		}
	}
}

func TestEscapeMakesControlCharactersVisible(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain text is kept", "HTTP 503: down for maintenance", "HTTP 503: down for maintenance"},
		{"non-ASCII text is kept", "café ✓ 日本", "café ✓ 日本"},
		{"an empty string", "", ""},
		{"a CSI sequence", "\x1b[2J\x1b[31mred", `\x1b[2J\x1b[31mred`},
		{"an OSC title with BEL", "\x1b]0;owned\x07", `\x1b]0;owned\a`},
		{"a carriage return overwriting the line", "exhausted\rsucceeded", `exhausted\rsucceeded`},
		{"newline and tab", "a\nb\tc", `a\nb\tc`},
		{"other C0 and DEL", "\x00\x08\x0b\x0c\x7f", `\x00\b\v\f\x7f`},
		{"C1 CSI as a character", "\u009b31m", `\u009b31m`},
		{"C1 NEL and OSC", "\u0085\u009d", `\u0085\u009d`},
		{"a lone 0x9b byte", "\x9b31m", `\x9b31m`},
		{"a truncated UTF-8 sequence", "ok\xe2\x82", `ok\xe2\x82`},
		{"U+00A0 is not a control", "a\u00a0b", "a\u00a0b"},
		{"a bidi override (Trojan Source)", "access\u202e\u2066denied\u2069\u2066", `access\u202e\u2066denied\u2069\u2066`},
		{"bidi marks and embeddings", "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u2067\u2068", `\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u2067\u2068`},
		{"zero-width characters", "ad\u200bmin\u200c\u200d\u2060\ufeff", `ad\u200bmin\u200c\u200d\u2060\ufeff`},
		{"line and paragraph separators", "a\u2028b\u2029c", `a\u2028b\u2029c`},
		{"a tag character beyond U+FFFF", "x\U000e0041", `x\U000e0041`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := escape(tc.in); got != tc.want {
				t.Errorf("escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestPrintedTextIsEscapedAndJSONStaysExact(t *testing.T) {
	t.Run("control characters", func(t *testing.T) { printedTextIsEscaped(t, "\x1b[2J\x1b]0;owned\x07\rok\u009b31m") })
	t.Run("invisible characters", func(t *testing.T) {
		printedTextIsEscaped(t, "ok\u202e\u2066 gnp.exe\u2069\u200b\ufeff\U000e0041\u2028")
	})
}

// invisibleRunes lists the invisible characters (bidirectional controls, zero-width
// characters...) that s holds raw.
func invisibleRunes(s string) []rune {
	var found []rune
	for _, r := range s {
		if r >= 0x80 && unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			found = append(found, r)
		}
	}
	return found
}

func printedTextIsEscaped(t *testing.T, hostile string) {
	want := escape(hostile)
	if strings.ContainsAny(want, "\x1b\r\a") || len(invisibleRunes(want)) > 0 || strings.ContainsRune(want, 0x9b) {
		t.Fatalf("escape(%q) = %q holds raw characters", hostile, want)
	}
	var b strings.Builder
	row(&b, "Reason:", hostile)
	writeLine(&b, "Error: %s (%v)", hostile, errors.New(hostile))
	writeBlock(&b, "  ", hostile+"\nsecond\tline\x1b[0m\n")
	printed := "Reason:\t" + want + "\n" +
		"Error: " + want + " (" + want + ")\n" +
		"  " + want + "\n" +
		"  second\\tline\\x1b[0m\n"
	if b.String() != printed {
		t.Errorf("printed\n%q\nwant\n%q", b.String(), printed)
	}

	var errOut bytes.Buffer
	if code := Run(context.Background(), []string{"status", "--kubeconfig", "/nonexistent/" + hostile}, genericiooptions.IOStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: &errOut}, nil); code != ExitError {
		t.Errorf("exit %d", code)
	}
	if !strings.Contains(errOut.String(), want) || strings.ContainsAny(errOut.String(), "\x1b\r\a") || len(invisibleRunes(errOut.String())) > 0 {
		t.Errorf("an error is printed as %q", errOut.String())
	}

	var out bytes.Buffer
	o := &Options{Output: OutputJSON}
	o.IO.Out = &out
	v := map[string]string{"body": hostile}
	if err := o.print(v, nil); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(out.String(), 0x9b) || strings.ContainsRune(out.String(), 0x1b) || len(invisibleRunes(out.String())) > 0 {
		t.Errorf("JSON output holds raw control or invisible characters: %q", out.String())
	}
	var back map[string]string
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back["body"] != hostile {
		t.Errorf("JSON output decodes to %q (%v), want %q", back["body"], err, hostile)
	}
	out.Reset()
	o.Output = OutputYAML
	if err := o.print(v, nil); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(out.String(), 0x9b) || strings.ContainsRune(out.String(), 0x1b) || strings.ContainsRune(out.String(), '\r') || len(invisibleRunes(out.String())) > 0 {
		t.Errorf("YAML output holds raw control or invisible characters: %q", out.String())
	}
	if err := yaml.Unmarshal(out.Bytes(), &back); err != nil || back["body"] != hostile {
		t.Errorf("YAML output decodes to %q (%v), want %q", back["body"], err, hostile)
	}
}
