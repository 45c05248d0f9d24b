package localstack

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/webhook-operator/webhook-operator/internal/satoken"
)

// probeInterval is how often a replica's readiness probe runs. It is shorter than the pod
// template's periodSeconds so that the local stack reacts within a second.
const probeInterval = 500 * time.Millisecond

// pod is one replica of a Deployment, run as a local process by a supervisor.
type pod struct {
	r        *PodRunner
	name     string
	ns       string
	key      string // the Deployment's namespace/name
	hash     string
	dir      string
	created  time.Time
	template *corev1.PodTemplateSpec

	ready     atomic.Bool
	sup       *supervisor
	cancel    context.CancelFunc
	probeDone chan struct{}

	mu       sync.Mutex
	id       *identity
	tokens   map[string]*satoken.File
	probeURL string
	// metricsURL is the /metrics of the container port named "metrics", if any.
	metricsURL string
	failures   int
	out        *os.File
}

// startPod runs a replica of the Deployment ns/deployment from template until stop.
func (r *PodRunner) startPod(ns, deployment, hash string, template *corev1.PodTemplateSpec) (*pod, error) {
	name := deployment + "-" + hash + "-" + randomSuffix()
	p := &pod{r: r, name: name, ns: ns, hash: hash, created: time.Now(), template: template.DeepCopy(),
		dir: filepath.Join(r.dir, "pods", ns, name), probeDone: make(chan struct{})}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	grace := r.grace
	if g := template.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	key := ns + "/" + deployment
	p.key = key
	p.sup = startSupervisor("pod "+ns+"/"+name, grace, r.logf, p.launch,
		func(pid int) { r.logf("pod %s/%s: started process %d", ns, name, pid) },
		func(error) {
			p.mu.Lock()
			p.probeURL, p.failures = "", 0
			if p.out != nil {
				_ = p.out.Close()
				p.out = nil
			}
			p.mu.Unlock()
			if p.ready.Swap(false) {
				r.changed(key)
			}
		})
	go p.probe(ctx, key)
	return p, nil
}

// launch prepares one run of the replica's first container.
func (p *pod) launch(ctx context.Context) (*exec.Cmd, error) {
	spec := &p.template.Spec
	if len(spec.Containers) == 0 {
		return nil, fmt.Errorf("the pod template has no container")
	}
	if len(spec.Containers) > 1 || len(spec.InitContainers) > 0 {
		p.r.logf("pod %s/%s: only the first container, %s, runs locally", p.ns, p.name, spec.Containers[0].Name)
	}
	c := &spec.Containers[0]
	sa := spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	p.mu.Lock()
	id := p.id
	p.mu.Unlock()
	if id == nil {
		var err error
		id, err = newIdentity(ctx, p.r.clientset, p.r.admin, p.ns, sa, filepath.Join(p.dir, "serviceaccount"), p.r.logf)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		p.id = id
		p.mu.Unlock()
	}
	meta := podMeta{Name: p.name, Namespace: p.ns, ServiceAccount: sa, Labels: p.template.Labels, Annotations: p.template.Annotations}
	lc, err := containerCommand(ctx, p.r.reader, p.r.binary, p.dir, meta, spec, c, func(ctx context.Context, audience string, seconds int64, path string) error {
		return p.projectToken(ctx, sa, audience, seconds, path)
	})
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(lc.Path, lc.Args...)
	cmd.Dir = p.dir
	// A container sees only its own environment: nothing of the stack's leaks in. KUBECONFIG
	// replaces the in-cluster service account mount.
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + p.dir,
		"KUBECONFIG=" + id.kubeconfig,
	}, lc.Env...)
	out, err := logFile(filepath.Join(p.r.logDir, p.ns+"."+p.name+".log"))
	if err != nil {
		return nil, err
	}
	w := outputTo(out, p.r.output, p.ns+"/"+p.name+" | ")
	cmd.Stdout, cmd.Stderr = w, w
	p.r.logf("pod %s/%s: %s; identity ServiceAccount %s/%s (token via TokenRequest); log %s",
		p.ns, p.name, strings.Join(lc.Rewrites, ", "), p.ns, sa, out.Name())
	metricsURL := ""
	for _, port := range c.Ports {
		if local, ok := lc.Ports[port.ContainerPort]; ok && port.Name == "metrics" {
			metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", local)
		}
	}
	p.mu.Lock()
	p.probeURL, p.failures, p.out, p.metricsURL = lc.Readiness, 0, out, metricsURL
	p.mu.Unlock()
	return cmd, nil
}

// projectToken keeps a token of the pod's ServiceAccount for audience in path, as the kubelet
// keeps a projected serviceAccountToken volume: one refresher per path for the pod's life,
// asked for a new token when a restart of the container wrote its volumes again.
func (p *pod) projectToken(ctx context.Context, sa, audience string, seconds int64, path string) error {
	p.mu.Lock()
	t := p.tokens[path]
	p.mu.Unlock()
	if t != nil {
		return t.Refresh(ctx)
	}
	var aud []string
	if audience != "" {
		aud = []string{audience}
	}
	t, err := satoken.Start(ctx, p.r.clientset, p.ns, sa, aud, time.Duration(seconds)*time.Second, path, p.r.logf)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.tokens == nil {
		p.tokens = map[string]*satoken.File{}
	}
	p.tokens[path] = t
	p.mu.Unlock()
	return nil
}

// probe runs the readiness probe until ctx ends and reports changes.
func (p *pod) probe(ctx context.Context, key string) {
	defer close(p.probeDone)
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // probes do not verify, as the kubelet's
		DisableKeepAlives: true,
	}}
	threshold := int32(3)
	if rp := p.template.Spec.Containers[0].ReadinessProbe; rp != nil && rp.FailureThreshold > 0 {
		threshold = rp.FailureThreshold
	}
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		url, out := p.probeURL, p.out
		p.mu.Unlock()
		if out == nil || p.sup.pid() == 0 {
			continue
		}
		// Without a readiness probe a running container is ready.
		ok := url == ""
		if url != "" {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if resp, err := hc.Do(req); err == nil {
				ok = resp.StatusCode >= 200 && resp.StatusCode < 400
				_ = resp.Body.Close()
			}
		}
		p.mu.Lock()
		if ok {
			p.failures = 0
		} else {
			p.failures++
		}
		unready := p.failures >= int(threshold)
		p.mu.Unlock()
		switch {
		case ok && !p.ready.Swap(true):
			p.r.logf("pod %s/%s: ready", p.ns, p.name)
			p.r.changed(key)
		case unready && p.ready.Swap(false):
			p.r.logf("pod %s/%s: not ready (%s failed %d times)", p.ns, p.name, url, threshold)
			p.r.changed(key)
		}
	}
}

// stop terminates the replica's process and waits for it.
func (p *pod) stop() {
	p.cancel()
	<-p.probeDone
	p.sup.stop()
	p.mu.Lock()
	id, tokens := p.id, p.tokens
	p.tokens = nil
	p.mu.Unlock()
	if id != nil {
		id.close()
	}
	for _, t := range tokens {
		t.Close()
	}
	p.r.logf("pod %s/%s: stopped", p.ns, p.name)
}
