package controllers

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/webhook-operator/webhook-operator/internal/erasure"
)

// erasureJobs are the erasures in progress in this process, by object, each with its job (the
// ids of the events it matched): at most max in all and perNamespace in one namespace. An
// erasure keeps its place until it completes, stalls or is deleted.
type erasureJobs struct {
	mu                sync.Mutex
	max, perNamespace int
	jobs              map[types.NamespacedName]erasureJob
	inNamespace       map[string]int
}

type erasureJob struct {
	uid types.UID
	job *erasure.Job
}

// erasuresRunning is the erasures in progress, per namespace.
var (
	erasuresRunning = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "webhook_erasures_running",
		Help: "WebhookErasures in progress in the controller, by namespace (the others wait, Queued)."}, []string{"namespace"})
	erasuresRunningOnce sync.Once
)

func newErasureJobs(maxAll, perNamespace int) *erasureJobs {
	if maxAll < 1 {
		maxAll = DefaultMaxErasures
	}
	if perNamespace < 1 {
		perNamespace = DefaultMaxErasuresPerNamespace
	}
	erasuresRunningOnce.Do(func() { ctrlmetrics.Registry.MustRegister(erasuresRunning) })
	return &erasureJobs{max: maxAll, perNamespace: min(perNamespace, maxAll),
		jobs: map[types.NamespacedName]erasureJob{}, inNamespace: map[string]int{}}
}

// running is the job of the erasure key (of uid) in progress, or nil.
func (e *erasureJobs) running(key types.NamespacedName, uid types.UID) *erasure.Job {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j, ok := e.jobs[key]; ok && j.uid == uid {
		return j.job
	}
	return nil
}

// start makes the job of erasure key when there is room for it (an object of the same name
// that was replaced gives its place to the new one); otherwise nil, and why it waits.
func (e *erasureJobs) start(key types.NamespacedName, uid types.UID, newJob func() *erasure.Job) (*erasure.Job, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if j, ok := e.jobs[key]; ok {
		if j.uid == uid {
			return j.job, ""
		}
		e.removeLocked(key)
	}
	switch {
	case e.inNamespace[key.Namespace] >= e.perNamespace:
		return nil, fmt.Sprintf("queued: %d erasures of namespace %s are in progress, and a namespace runs at most %d at once; this one starts when one of them ends",
			e.inNamespace[key.Namespace], key.Namespace, e.perNamespace)
	case len(e.jobs) >= e.max:
		return nil, fmt.Sprintf("queued: %d erasures are in progress in the installation, which runs at most %d at once; this one starts when one of them ends", len(e.jobs), e.max)
	}
	j := newJob()
	e.jobs[key] = erasureJob{uid: uid, job: j}
	e.inNamespace[key.Namespace]++
	erasuresRunning.WithLabelValues(key.Namespace).Set(float64(e.inNamespace[key.Namespace]))
	return j, ""
}

// forget drops erasure key's job, and gives its place to the next.
func (e *erasureJobs) forget(key types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.removeLocked(key)
}

func (e *erasureJobs) removeLocked(key types.NamespacedName) {
	if _, ok := e.jobs[key]; !ok {
		return
	}
	delete(e.jobs, key)
	e.inNamespace[key.Namespace]--
	if e.inNamespace[key.Namespace] <= 0 {
		delete(e.inNamespace, key.Namespace)
		erasuresRunning.DeleteLabelValues(key.Namespace)
		return
	}
	erasuresRunning.WithLabelValues(key.Namespace).Set(float64(e.inNamespace[key.Namespace]))
}

// count is the erasures in progress, in all.
func (e *erasureJobs) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.jobs)
}
