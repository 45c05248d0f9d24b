package localstack

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Process is a process seen in /proc: its id, start time (so a reused id is not mistaken for
// it) and command line.
type Process struct {
	PID     int
	Start   uint64
	Command string
}

// Alive reports whether the process still runs (a zombie does not count).
func (p Process) Alive() bool {
	st, err := readStat(p.PID)
	return err == nil && st.start == p.Start && st.state != "Z" && st.state != "X"
}

// String is the id and command line.
func (p Process) String() string { return fmt.Sprintf("%d (%s)", p.PID, p.Command) }

// WaitGone waits up to timeout for every process of procs to end, and returns those still
// running then.
func WaitGone(procs []Process, timeout time.Duration) []Process {
	deadline := time.Now().Add(timeout)
	for {
		var alive []Process
		for _, p := range procs {
			if p.Alive() {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Descendants lists every living process below pid (children, their children...), from /proc.
func Descendants(pid int) ([]Process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]Process{}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(n)
		if err != nil || st.state == "Z" {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		children[st.ppid] = append(children[st.ppid], Process{PID: n, Start: st.start,
			Command: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))})
	}
	var out []Process
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	return out, nil
}

// groupRuns reports whether a process of the process group pgid runs (is not a zombie).
func groupRuns(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(n); err == nil && st.pgrp == pgid && st.state != "Z" && st.state != "X" {
			return true
		}
	}
	return false
}

type procStat struct {
	state string
	ppid  int
	pgrp  int
	start uint64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// The command, in parentheses, may hold spaces: fields start after its closing one.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return procStat{state: f[0], ppid: ppid, pgrp: pgrp, start: start}, nil
}
