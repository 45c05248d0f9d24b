package plugin

import "testing"

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
