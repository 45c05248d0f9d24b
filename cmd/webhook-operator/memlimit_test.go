package main

import "testing"

// The controller keeps its heap under 90% of its container's memory limit, unless GOMEMLIMIT
// says otherwise or there is no limit to read.
func TestMemoryLimitFollowsTheContainers(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want int64
		ok   bool
	}{
		{"the chart's 256Mi", map[string]string{"CONTAINER_MEMORY_LIMIT": "268435456"}, 241591905, true},
		{"GOMEMLIMIT wins", map[string]string{"CONTAINER_MEMORY_LIMIT": "268435456", "GOMEMLIMIT": "100MiB"}, 0, false},
		{"no limit", map[string]string{}, 0, false},
		{"not a number", map[string]string{"CONTAINER_MEMORY_LIMIT": "256Mi"}, 0, false},
		{"zero", map[string]string{"CONTAINER_MEMORY_LIMIT": "0"}, 0, false},
	} {
		got, ok := memoryLimit(func(k string) string { return c.env[k] })
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %d, %v; want %d, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
