package shared

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// The pool ConfigMap's list: sorted and without repeats as written, each namespace with its
// digest and whether it stays awake; read back line by line, blank lines and spaces ignored, a
// line with a namespace only (an earlier controller's) kept awake, a line that is not a
// namespace and its digest refused with what it was (the valid ones still served), and no more
// than MaxNamespaces served; the longest line fits the bound.
func TestThePoolListIsReadBackBoundedAndSaysWhatItRefused(t *testing.T) {
	a, b := Entry{Namespace: "a", Digest: "0f"}, Entry{Namespace: "b", Digest: "1e", Awake: true}
	if got := FormatEntries([]Entry{b, a, b}); got != "a 0f\nb 1e awake\n" {
		t.Errorf("FormatEntries = %q, want a and b, one a line", got)
	}
	if got := FormatEntries(nil); got != "" {
		t.Errorf("FormatEntries(nil) = %q", got)
	}
	got, err := ParseEntries(" a  0f \n\nb 1e awake\nc\n")
	if want := []Entry{a, b, {Namespace: "c", Awake: true}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("ParseEntries = %v, %v; want %v", got, err, want)
	}
	got, err = ParseEntries("a 0f\nNot_A_Namespace 0f\n" + strings.Repeat("x", 64) + "\nd zz\ne 0f sleepy\nb 1e awake\n")
	if !slices.Equal(got, []Entry{a, b}) || err == nil || !strings.Contains(err.Error(), `"Not_A_Namespace 0f"`) || !strings.Contains(err.Error(), `"d zz"`) {
		t.Errorf("ParseEntries with bad lines = %v, %v; want a and b, and an error naming the bad lines", got, err)
	}
	var many strings.Builder
	for i := range MaxNamespaces + 5 {
		fmt.Fprintf(&many, "ns-%d 00\n", i)
	}
	got, err = ParseEntries(many.String())
	if len(got) != MaxNamespaces || err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("ParseEntries of %d names: %d served, %v; want %d and an error", MaxNamespaces+5, len(got), err, MaxNamespaces)
	}
	longest := FormatEntries([]Entry{{Namespace: strings.Repeat("x", 63), Digest: strings.Repeat("f", 16), Awake: true}})
	if MaxNamespaces*len(longest) > 1<<20 {
		t.Errorf("%d lines of %d bytes do not fit in a ConfigMap", MaxNamespaces, len(longest))
	}
}
