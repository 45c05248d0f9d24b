package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// Page is one page of a cursor-paginated list (seed 002's `{data, hasMore}`), with the cursor
// that continues it.
type Page[T any] struct {
	Data    []T  `json:"data"`
	HasMore bool `json:"hasMore"`
	// NextCursor continues the list with --after; set when HasMore.
	NextCursor string `json:"nextCursor,omitempty"`
}

// print writes v as JSON or YAML, or calls table with a tab writer.
func (o *Options) print(v any, table func(w io.Writer)) error {
	switch o.Output {
	case OutputJSON:
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return err
		}
		_, err := o.IO.Out.Write(jsonSafe(b.Bytes()))
		return err
	case OutputYAML:
		// YAML is made from the JSON (as sigs.k8s.io/yaml does), with its C1 characters
		// escaped: the YAML parser refuses them raw, and its emitter writes every control
		// character as an escape in a double-quoted string. Its emitter writes invisible
		// characters (bidirectional controls, zero-width spaces) raw, though: a document
		// holding one is written in YAML's flow style, which is its JSON, with them escaped.
		j, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if hasInvisible(j) {
			var b bytes.Buffer
			if err := json.Indent(&b, j, "", "  "); err != nil {
				return err
			}
			b.WriteByte('\n')
			_, err = o.IO.Out.Write(yamlSafe(b.Bytes()))
			return err
		}
		b, err := yaml.JSONToYAML(jsonSafe(j))
		if err != nil {
			return err
		}
		_, err = o.IO.Out.Write(b)
		return err
	default:
		tw := tabwriter.NewWriter(o.IO.Out, 0, 8, 3, ' ', 0)
		table(tw)
		return tw.Flush()
	}
}

// row writes one tab-separated table row, each cell escaped.
func row(w io.Writer, cells ...string) {
	esc := make([]string, len(cells))
	for i, c := range cells {
		esc[i] = escape(c)
	}
	_, _ = fmt.Fprintln(w, strings.Join(esc, "\t"))
}

// writeLine writes one line: format is the plugin's own, the text among its arguments is
// escaped.
func writeLine(w io.Writer, format string, a ...any) {
	_, _ = fmt.Fprintf(w, format+"\n", escapeArgs(a)...)
}

// writeBlock writes text of several lines (a body, a payload), each after indent and escaped.
func writeBlock(w io.Writer, indent, text string) {
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		_, _ = fmt.Fprintf(w, "%s%s\n", indent, escape(l))
	}
}

// ago is a kubectl-style age ("5m"), or "-" for a zero time.
func ago(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

// ts is a time in RFC 3339 UTC with seconds, or "-".
func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func tsp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t)
}

// orDash is s or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short cuts s to n runes on one line.
func short(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// latency prints an attempt's latency with a useful precision: from microseconds when the
// record has them (0.04ms, 0.4ms, 3.2ms, 12ms), else the whole milliseconds of older records.
func latency(ms, us int64) string {
	switch {
	case us <= 0:
		return fmt.Sprintf("%dms", ms)
	case us < 100:
		return fmt.Sprintf("%.2fms", float64(us)/1000)
	case us < 10000:
		return fmt.Sprintf("%.1fms", float64(us)/1000)
	default:
		return fmt.Sprintf("%dms", us/1000)
	}
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
