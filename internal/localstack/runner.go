package localstack

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// RunnerFieldManager writes the Deployments' status.
const RunnerFieldManager = "localstack-pod-runner"

// RunnerOptions configure a PodRunner.
type RunnerOptions struct {
	// Binary runs in place of every container's image: the locally built webhook-operator.
	Binary string
	// Dir holds each replica's working directory (pods/<namespace>/<pod>) and logs/.
	Dir string
	// Selector picks the Deployments to run; default: app.kubernetes.io/managed-by=webhook-operator.
	Selector labels.Selector
	// Grace is the longest a replica may take to stop after SIGTERM before it is killed
	// (default 10s; a shorter terminationGracePeriodSeconds in the template wins).
	Grace time.Duration
	// Logf logs what the runner does (default: standard error).
	Logf func(format string, args ...any)
	// Output, when set, receives every replica's output, each line prefixed with its pod.
	Output io.Writer
}

// PodRunner stands in for the kubelet and the deployment controller of a cluster that has
// neither: it watches Deployments (those webhook-operator manages) and runs each replica's
// container as a local process, exactly from the pod template (see containerCommand for what
// is rewritten to run locally), with a token of the template's ServiceAccount. It starts and
// stops replicas to match spec.replicas, replaces them when the template changes (new ones
// first, the old ones once the new are ready, as a rolling update with surge), restarts a
// replica whose process exits, probes readiness, and writes the Deployment's status (replicas,
// updated, ready and available replicas, the Available and Progressing conditions).
type PodRunner struct {
	binary    string
	dir       string
	logDir    string
	grace     time.Duration
	logf      func(string, ...any)
	output    io.Writer
	admin     *rest.Config
	clientset kubernetes.Interface
	reader    client.Reader
	client    client.Client
	mgr       ctrl.Manager
	events    chan event.GenericEvent

	ctx     context.Context
	cancel  context.CancelFunc
	done    chan error
	drained chan struct{}

	mu      sync.Mutex
	sets    map[string][]*pod // by namespace/deployment
	stopped bool
	stops   sync.WaitGroup
}

// NewPodRunner creates a runner acting with admin's credentials (as the kubelet and the
// controller manager do); Start runs it.
func NewPodRunner(admin *rest.Config, o RunnerOptions) (*PodRunner, error) {
	if o.Binary == "" || o.Dir == "" {
		return nil, fmt.Errorf("a binary and a directory are required")
	}
	if o.Selector == nil {
		o.Selector = labels.SelectorFromSet(labels.Set{names.LabelManagedBy: names.LabelManagedByValue})
	}
	if o.Grace <= 0 {
		o.Grace = 10 * time.Second
	}
	if o.Logf == nil {
		o.Logf = stderrLogf
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(admin, ctrl.Options{
		Scheme:                 scheme.New(),
		Logger:                 log.Log.WithName("pod-runner"),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}: {Label: o.Selector},
		}},
	})
	if err != nil {
		return nil, err
	}
	r := &PodRunner{
		binary: o.Binary, dir: o.Dir, logDir: filepath.Join(o.Dir, "logs"), grace: o.Grace, logf: o.Logf, output: o.Output,
		admin: admin, clientset: cs, reader: mgr.GetAPIReader(), client: mgr.GetClient(), mgr: mgr,
		events: make(chan event.GenericEvent, 1024), sets: map[string][]*pod{},
	}
	if err := os.MkdirAll(r.logDir, 0o755); err != nil {
		return nil, err
	}
	// Several stacks may run in one process (the fault suite's cluster scenarios), each with a
	// runner of this name: the name only labels its logs.
	skipNameValidation := true
	err = ctrl.NewControllerManagedBy(mgr).
		Named("localstack-pod-runner").
		WithOptions(controller.Options{SkipNameValidation: &skipNameValidation}).
		For(&appsv1.Deployment{}).
		WatchesRawSource(source.Channel(r.events, &handler.EnqueueRequestForObject{})).
		Complete(r)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Start runs the runner until Stop (or ctx's end, which also stops every replica).
func (r *PodRunner) Start(ctx context.Context) {
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan error, 1)
	r.drained = make(chan struct{})
	go func() { r.done <- r.mgr.Start(r.ctx) }()
	go func() {
		defer close(r.drained)
		<-r.ctx.Done()
		<-r.done
		r.stopAll()
		r.stops.Wait()
	}()
}

// Stop stops watching and terminates every replica, waiting until all are gone.
func (r *PodRunner) Stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.drained
}

func (r *PodRunner) stopAll() {
	r.mu.Lock()
	r.stopped = true
	var all []*pod
	for k, pods := range r.sets {
		all = append(all, pods...)
		delete(r.sets, k)
	}
	r.mu.Unlock()
	r.stopPods(all)
}

// stopPods stops pods in the background; Stop waits for them.
func (r *PodRunner) stopPods(pods []*pod) {
	for _, p := range pods {
		r.stops.Add(1)
		go func() { defer r.stops.Done(); p.stop() }()
	}
}

// Pods lists the running replicas' names and process ids of the Deployment namespace/name.
func (r *PodRunner) Pods(namespace, name string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, p := range r.sets[namespace+"/"+name] {
		out[p.name] = p.sup.pid()
	}
	return out
}

// MetricsURLs lists the /metrics URLs of the running replicas of the Deployment
// namespace/name: the loopback port that stands for each one's container port "metrics".
func (r *PodRunner) MetricsURLs(namespace, name string) []string {
	r.mu.Lock()
	pods := slices.Clone(r.sets[namespace+"/"+name])
	r.mu.Unlock()
	var out []string
	for _, p := range pods {
		p.mu.Lock()
		if p.metricsURL != "" {
			out = append(out, p.metricsURL)
		}
		p.mu.Unlock()
	}
	return out
}

// changed asks for the Deployment namespace/name to be reconciled (a replica's readiness or
// process changed).
func (r *PodRunner) changed(key string) {
	ns, name, _ := strings.Cut(key, "/")
	ev := event.GenericEvent{Object: &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}}
	go func() {
		select {
		case r.events <- ev:
		case <-r.ctx.Done():
		}
	}()
}

// Reconcile makes the replicas of a Deployment match its spec and reports them in its status.
func (r *PodRunner) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.String()
	dep := &appsv1.Deployment{}
	err := r.client.Get(ctx, req.NamespacedName, dep)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if apierrors.IsNotFound(err) || !dep.DeletionTimestamp.IsZero() {
		r.mu.Lock()
		pods := r.sets[key]
		delete(r.sets, key)
		r.mu.Unlock()
		if len(pods) > 0 {
			r.logf("deployment %s is gone: stopping its %d replicas", key, len(pods))
		}
		r.stopPods(pods)
		return reconcile.Result{}, nil
	}

	desired := int32(1)
	if dep.Spec.Replicas != nil {
		desired = *dep.Spec.Replicas
	}
	hash := templateHash(&dep.Spec.Template)

	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return reconcile.Result{}, nil
	}
	var current, old []*pod
	for _, p := range r.sets[key] {
		if p.hash == hash {
			current = append(current, p)
		} else {
			old = append(old, p)
		}
	}
	var toStop []*pod
	for int32(len(current)) < desired {
		p, err := r.startPod(req.Namespace, req.Name, hash, &dep.Spec.Template)
		if err != nil {
			r.mu.Unlock()
			return reconcile.Result{}, err
		}
		r.logf("deployment %s: started replica %s (template %s, %d of %d)", key, p.name, hash, len(current)+1, desired)
		current = append(current, p)
	}
	if int32(len(current)) > desired {
		// Scale down the newest, unready first.
		sort.SliceStable(current, func(i, j int) bool {
			if current[i].ready.Load() != current[j].ready.Load() {
				return current[i].ready.Load()
			}
			return current[i].created.Before(current[j].created)
		})
		toStop = append(toStop, current[desired:]...)
		current = current[:desired]
		r.logf("deployment %s: scaling down to %d replicas", key, desired)
	}
	readyCurrent := int32(0)
	for _, p := range current {
		if p.ready.Load() {
			readyCurrent++
		}
	}
	if len(old) > 0 && readyCurrent >= desired {
		r.logf("deployment %s: the template changed and %d new replicas are ready: stopping %d old ones", key, readyCurrent, len(old))
		toStop = append(toStop, old...)
		old = nil
	}
	all := append(append([]*pod{}, current...), old...)
	r.sets[key] = all
	r.mu.Unlock()
	r.stopPods(toStop)

	ready := int32(0)
	for _, p := range all {
		if p.ready.Load() {
			ready++
		}
	}
	return reconcile.Result{}, r.writeStatus(ctx, dep, desired, int32(len(all)), int32(len(current)), readyCurrent, ready)
}

// writeStatus reports the replicas as the deployment controller would.
func (r *PodRunner) writeStatus(ctx context.Context, dep *appsv1.Deployment, desired, total, updated, updatedReady, ready int32) error {
	st := appsv1.DeploymentStatus{
		ObservedGeneration:  dep.Generation,
		Replicas:            total,
		UpdatedReplicas:     updated,
		ReadyReplicas:       ready,
		AvailableReplicas:   ready,
		UnavailableReplicas: max(desired-ready, 0),
	}
	now := metav1.Now()
	cond := func(t appsv1.DeploymentConditionType, ok bool, reason, msg string) appsv1.DeploymentCondition {
		status := corev1.ConditionFalse
		if ok {
			status = corev1.ConditionTrue
		}
		c := appsv1.DeploymentCondition{Type: t, Status: status, Reason: reason, Message: msg, LastUpdateTime: now, LastTransitionTime: now}
		for _, prev := range dep.Status.Conditions {
			if prev.Type == t && prev.Status == status {
				c.LastTransitionTime = prev.LastTransitionTime
				if prev.Reason == reason && prev.Message == msg {
					c.LastUpdateTime = prev.LastUpdateTime
				}
			}
		}
		return c
	}
	if ready >= desired {
		st.Conditions = append(st.Conditions, cond(appsv1.DeploymentAvailable, true, "MinimumReplicasAvailable", "Deployment has minimum availability."))
	} else {
		st.Conditions = append(st.Conditions, cond(appsv1.DeploymentAvailable, false, "MinimumReplicasUnavailable", "Deployment does not have minimum availability."))
	}
	if updated == desired && updatedReady >= desired && total == desired {
		st.Conditions = append(st.Conditions, cond(appsv1.DeploymentProgressing, true, "NewReplicaSetAvailable",
			fmt.Sprintf("%d local replicas of the current template are running and ready.", desired)))
	} else {
		st.Conditions = append(st.Conditions, cond(appsv1.DeploymentProgressing, true, "ReplicaSetUpdated",
			fmt.Sprintf("%d of %d local replicas of the current template are ready.", updatedReady, desired)))
	}
	if equality.Semantic.DeepEqual(dep.Status, st) {
		return nil
	}
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Status = st
	err := r.client.Status().Patch(ctx, dep, patch, client.FieldOwner(RunnerFieldManager))
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// templateHash names a pod template, as a ReplicaSet's pod-template-hash does.
func templateHash(t *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

const suffixAlphabet = "bcdfghjklmnpqrstvwxz2456789"

func randomSuffix() string {
	b := make([]byte, 5)
	for i := range b {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(suffixAlphabet))))
		b[i] = suffixAlphabet[n.Int64()]
	}
	return string(b)
}

func stderrLogf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}
