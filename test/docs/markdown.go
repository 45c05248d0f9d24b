// Package docs reads the project's Markdown as GitHub renders it, for the tests that keep the
// documentation true: the package table of docs/architecture.md against the module's
// packages, the README's length, and every relative link and anchor between the pages.
package docs

import (
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

var (
	fenceRE   = regexp.MustCompile("(?ms)^ {0,3}(```|~~~).*?^ {0,3}(```|~~~)[^\\n]*$")
	codeRE    = regexp.MustCompile("`[^`\\n]*`")
	headingRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#* *$`)
	linkRE    = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	levelRE   = regexp.MustCompile(`^(#{1,6}) +(.+?) *$`)
)

// Prose returns md without its fenced code blocks, so that a `#` comment in a shell example
// is not a heading and a `](x)` in a code sample is not a link.
func Prose(md string) string {
	return fenceRE.ReplaceAllString(md, "")
}

// Anchors returns the anchors GitHub gives md's headings: lower case, spaces to dashes,
// punctuation dropped (letters, digits, '-' and '_' kept), and "-1", "-2"... appended to a
// repeated one.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headingRE.FindAllStringSubmatch(Prose(md), -1) {
		var a strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		anchor := a.String()
		if n := seen[anchor]; n > 0 {
			out[anchor+"-"+strconv.Itoa(n)] = true
		} else {
			out[anchor] = true
		}
		seen[anchor]++
	}
	return out
}

// Links returns the targets of md's inline links and images (`[text](target)`), outside code.
func Links(md string) []string {
	var out []string
	for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(Prose(md), ""), -1) {
		out = append(out, m[1])
	}
	return out
}

// Section returns the prose of md under the heading whose text is title, up to the next
// heading of the same or a higher level ("" when there is no such heading).
func Section(md, title string) string {
	lines := strings.Split(Prose(md), "\n")
	level := 0
	var b strings.Builder
	for _, l := range lines {
		if m := levelRE.FindStringSubmatch(l); m != nil {
			if level > 0 && len(m[1]) <= level {
				break
			}
			if level == 0 && m[2] == title {
				level = len(m[1])
				continue
			}
		}
		if level > 0 {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TableColumn returns the cells of the first column of every table row in md (not the header
// row or the separator), trimmed.
func TableColumn(md string) []string {
	var out []string
	header := true
	for _, l := range strings.Split(md, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") {
			header = true
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if strings.Trim(cells[0], " -:") == "" {
			continue // the separator
		}
		if header {
			header = false
			continue
		}
		out = append(out, strings.TrimSpace(cells[0]))
	}
	return out
}

// CodeSpans returns the contents of the `code` spans of s.
func CodeSpans(s string) []string {
	var out []string
	for _, m := range codeRE.FindAllString(s, -1) {
		out = append(out, strings.Trim(m, "`"))
	}
	return out
}
