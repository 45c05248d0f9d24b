package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := escape(tc.in); got != tc.want {
				t.Errorf("escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestPrintedTextIsEscapedAndJSONStaysExact(t *testing.T) {
	hostile := "\x1b[2J\x1b]0;owned\x07\rok\u009b31m"
	var b strings.Builder
	row(&b, "Reason:", hostile)
	writeLine(&b, "Error: %s (%v)", hostile, errors.New(hostile))
	writeBlock(&b, "  ", hostile+"\nsecond\tline\x1b[0m\n")
	want := "Reason:\t\\x1b[2J\\x1b]0;owned\\a\\rok\\u009b31m\n" +
		"Error: \\x1b[2J\\x1b]0;owned\\a\\rok\\u009b31m (\\x1b[2J\\x1b]0;owned\\a\\rok\\u009b31m)\n" +
		"  \\x1b[2J\\x1b]0;owned\\a\\rok\\u009b31m\n" +
		"  second\\tline\\x1b[0m\n"
	if b.String() != want {
		t.Errorf("printed\n%q\nwant\n%q", b.String(), want)
	}

	var errOut bytes.Buffer
	if code := Run(context.Background(), []string{"status", "--kubeconfig", "/nonexistent/" + hostile}, genericiooptions.IOStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: &errOut}, nil); code != ExitError {
		t.Errorf("exit %d", code)
	}
	if !strings.Contains(errOut.String(), `\x1b[2J\x1b]0;owned\a\rok\u009b31m`) || strings.ContainsAny(errOut.String(), "\x1b\r\a") {
		t.Errorf("an error is printed as %q", errOut.String())
	}

	var out bytes.Buffer
	o := &Options{Output: OutputJSON}
	o.IO.Out = &out
	v := map[string]string{"body": hostile}
	if err := o.print(v, nil); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(out.String(), 0x9b) || strings.ContainsRune(out.String(), 0x1b) {
		t.Errorf("JSON output holds raw control characters: %q", out.String())
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
	if strings.ContainsRune(out.String(), 0x9b) || strings.ContainsRune(out.String(), 0x1b) || strings.ContainsRune(out.String(), '\r') {
		t.Errorf("YAML output holds raw control characters: %q", out.String())
	}
	if err := yaml.Unmarshal(out.Bytes(), &back); err != nil || back["body"] != hostile {
		t.Errorf("YAML output decodes to %q (%v), want %q", back["body"], err, hostile)
	}
}
