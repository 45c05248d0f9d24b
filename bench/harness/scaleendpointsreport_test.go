package harness

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// A run stopped after every endpoint was Ready but before the quiet window judges the goal
// it measured (Ready in time) and leaves the others not measured: zero figures of the stages
// it never reached (no status write seen, no memory read) are not goals met.
func TestAStoppedScaleRunLeavesTheGoalsItDidNotMeasureUnjudged(t *testing.T) {
	o, err := ParseFlags([]string{"-run", "scale-endpoints"})
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{o: o, rep: newReport(o)}
	res := &seResult{
		c:     seConfig{Endpoints: 1000, Namespaces: 10, Replicas: 3, Reference: true},
		total: 1001, readyCount: 1001, ready: 90 * time.Second,
		servers:       []serverFigures{{name: "n1", idleCores: math.NaN()}},
		dispatcherRSS: map[string]int64{},
		reached:       seAllReady,
		stopped:       errors.New("interrupted"),
	}
	s := &section{title: "Scale"}
	b.seReport(s, []*seResult{res})
	goals := strings.Join(b.rep.goals, "\n")
	for _, want := range []string{
		"every endpoint Ready within 10 minutes of applying them: met",
		"no status write while nothing changes at 1,000 endpoints in 10 namespaces: **not measured** (the run stopped first: interrupted)",
		"consumers independent of endpoints, at most one per namespace and stream (22 here) at 1,000 endpoints in 10 namespaces: **not measured**",
		"the dispatchers' memory per idle endpoint under 4 KiB at 1,000 endpoints in 10 namespaces: **not measured**",
	} {
		if !strings.Contains(goals, want) {
			t.Errorf("the goals lack %q:\n%s", want, goals)
		}
	}
	if n := strings.Count(goals, ": met"); n != 1 {
		t.Errorf("%d goals met, want only the one measured:\n%s", n, goals)
	}

	// The same run carried on to the end judges them all.
	res.reached, res.stopped = seTrafficDone, nil
	b.rep = newReport(o)
	b.seReport(&section{title: "Scale"}, []*seResult{res})
	if goals := strings.Join(b.rep.goals, "\n"); strings.Contains(goals, "not measured") {
		t.Errorf("a whole run has goals not measured:\n%s", goals)
	}
}
