package dispatcher

import (
	"testing"
	"time"
)

// A periodic (full) resolve resolves an unchanged endpoint again, reading its Secrets again,
// only once its configuration is about secretsMaxAge old: the Secret cache keeps nothing for
// idle endpoints, so resolving them all every 5 minutes would read every Secret every 5 minutes.
// A change resolves it at once, full or not.
func TestAFullResolveReadsAgainOnlyWhatWasResolvedLongAgo(t *testing.T) {
	now := time.Now()
	last := resolvedFrom{endpoint: "10", policy: "3", secrets: "v1", due: now.Add(time.Minute).UnixNano()}
	from := resolvedFrom{endpoint: "10", policy: "3", secrets: "v1"}
	for _, tc := range []struct {
		name string
		from resolvedFrom
		full bool
		at   time.Time
		want bool
	}{
		{"unchanged", from, false, now, true},
		{"unchanged, in a full resolve before it is due", from, true, now, true},
		{"unchanged, in a full resolve once it is due", from, true, now.Add(2 * time.Minute), false},
		{"unchanged, long after it was due but not in a full resolve", from, false, now.Add(2 * time.Hour), true},
		{"the endpoint changed", resolvedFrom{endpoint: "11", policy: "3", secrets: "v1"}, false, now, false},
		{"its retry policy changed", resolvedFrom{endpoint: "10", policy: "4", secrets: "v1"}, false, now, false},
		{"a Secret of its changed", resolvedFrom{endpoint: "10", policy: "3", secrets: "v2"}, false, now, false},
	} {
		if got := last.same(tc.from, tc.full, tc.at); got != tc.want {
			t.Errorf("%s: same = %v, want %v", tc.name, got, tc.want)
		}
	}
}
