package shared

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// The pool ConfigMap's list: sorted and without repeats as written; read back line by line,
// blank lines and spaces ignored, a line that is no namespace name refused with what it was (the
// valid ones still served), and no more than MaxNamespaces served.
func TestThePoolListIsReadBackBoundedAndSaysWhatItRefused(t *testing.T) {
	if got := FormatNamespaces([]string{"b", "a", "b"}); got != "a\nb\n" {
		t.Errorf("FormatNamespaces = %q, want a and b, one a line", got)
	}
	if got := FormatNamespaces(nil); got != "" {
		t.Errorf("FormatNamespaces(nil) = %q", got)
	}
	got, err := ParseNamespaces(" a \n\nb\n")
	if err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("ParseNamespaces = %v, %v", got, err)
	}
	got, err = ParseNamespaces("a\nNot_A_Namespace\n" + strings.Repeat("x", 64) + "\nb\n")
	if !slices.Equal(got, []string{"a", "b"}) || err == nil || !strings.Contains(err.Error(), `"Not_A_Namespace"`) {
		t.Errorf("ParseNamespaces with bad lines = %v, %v; want a and b, and an error naming the bad line", got, err)
	}
	var many strings.Builder
	for i := range MaxNamespaces + 5 {
		fmt.Fprintf(&many, "ns-%d\n", i)
	}
	got, err = ParseNamespaces(many.String())
	if len(got) != MaxNamespaces || err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("ParseNamespaces of %d names: %d served, %v; want %d and an error", MaxNamespaces+5, len(got), err, MaxNamespaces)
	}
}
