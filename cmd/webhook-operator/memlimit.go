package main

import (
	"runtime/debug"
	"strconv"
	"strings"
)

// containerMemoryLimitEnv is the container's memory limit in bytes, as the chart passes it to
// the controller (a resourceFieldRef of limits.memory).
const containerMemoryLimitEnv = "CONTAINER_MEMORY_LIMIT"

// memoryLimit is the Go runtime's soft memory limit for a container whose environment getenv
// reads: 90% of CONTAINER_MEMORY_LIMIT (the rest for what the runtime does not count), unless
// GOMEMLIMIT is set (the runtime reads it) or there is no limit to read; false then.
func memoryLimit(getenv func(string) string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(getenv(containerMemoryLimitEnv)), 10, 64)
	if err != nil || v <= 0 {
		return 0, false
	}
	return v / 10 * 9, true
}

// setMemoryLimit sets the soft memory limit memoryLimit says: as the heap nears the
// container's limit it is collected harder, instead of the container being killed.
func setMemoryLimit(getenv func(string) string) {
	if limit, ok := memoryLimit(getenv); ok {
		debug.SetMemoryLimit(limit)
	}
}
