package controllers

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/webhook-operator/webhook-operator/internal/erasure"
)

// Erasures in progress are bounded per namespace and in all; the excess waits and says why;
// a deleted or replaced erasure gives its place back.
func TestErasureJobsAreBounded(t *testing.T) {
	jobs := newErasureJobs(3, 2)
	newJob := func() *erasure.Job { return erasure.NewJob(erasure.Selection{}, erasure.Progress{}) }
	key := func(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	start := func(ns, name string, uid types.UID) (*erasure.Job, string) {
		return jobs.start(key(ns, name), uid, newJob)
	}

	a1, _ := start("a", "one", "u1")
	a2, _ := start("a", "two", "u2")
	if a1 == nil || a2 == nil {
		t.Fatal("the first two erasures of a namespace did not start")
	}
	if j, why := start("a", "three", "u3"); j != nil || !strings.Contains(why, "2 erasures of namespace a are in progress, and a namespace runs at most 2") {
		t.Errorf("a third erasure of namespace a: %v, %q; want queued by the namespace's bound", j, why)
	}
	if j, _ := start("b", "one", "u4"); j == nil {
		t.Fatal("namespace b's first erasure did not start")
	}
	if j, why := start("c", "one", "u5"); j != nil || !strings.Contains(why, "runs at most 3 at once") {
		t.Errorf("a fourth erasure: %v, %q; want queued by the installation's bound", j, why)
	}
	if j := jobs.running(key("a", "one"), "u1"); j != a1 {
		t.Error("a running erasure's job is not kept")
	}
	if j, _ := start("a", "one", "u1"); j != a1 {
		t.Error("starting a running erasure again gave another job")
	}

	// Deleted mid-run: its job goes, its place is free.
	jobs.forget(key("a", "one"))
	if jobs.running(key("a", "one"), "u1") != nil || jobs.count() != 2 {
		t.Fatalf("a forgotten erasure is still running (%d in progress)", jobs.count())
	}
	if j, _ := start("c", "one", "u5"); j == nil {
		t.Error("the queued erasure did not start once a place was free")
	}
	// An object replaced under the same name takes its predecessor's place, with a new job.
	if j, _ := start("a", "two", "u2-new"); j == nil || j == a2 || jobs.count() != 3 {
		t.Errorf("a replaced erasure: %v (the old job %v), %d in progress; want a new job in the same place", j, a2, jobs.count())
	}
	for _, k := range []types.NamespacedName{key("a", "two"), key("b", "one"), key("c", "one"), key("a", "missing")} {
		jobs.forget(k)
	}
	if jobs.count() != 0 || len(jobs.inNamespace) != 0 {
		t.Errorf("after forgetting every erasure: %d in progress, %v", jobs.count(), jobs.inNamespace)
	}
}
