package cluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// podInfo is what these checks read of a pod.
type podInfo struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		Containers []struct {
			Resources struct {
				Limits map[string]string `json:"limits"`
			} `json:"resources"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		ContainerStatuses []struct {
			ContainerID string `json:"containerID"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

func dispatcherPod(t *testing.T, ns string) podInfo {
	t.Helper()
	var list struct {
		Items []podInfo `json:"items"`
	}
	kubectlJSON(t, &list, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/managed-by=webhook-operator", "--field-selector=status.phase=Running", "-o", "json")
	if len(list.Items) == 0 {
		t.Fatalf("no running dispatcher pod in %s", ns)
	}
	return list.Items[0]
}

// containerCgroup finds a container's cgroup in a v1 hierarchy (the cgroupfs driver:
// kubepods/<qos>/pod<uid>/<container id>).
func containerCgroup(t *testing.T, hierarchy string, p podInfo) string {
	t.Helper()
	id := p.Status.ContainerStatuses[0].ContainerID
	id = id[strings.Index(id, "://")+3:]
	var found string
	_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup", hierarchy, "kubepods"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == id && strings.Contains(path, "pod"+p.Metadata.UID) {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no %s cgroup of container %s", hierarchy, id)
	}
	return found
}

// jwtClaims decodes a JWT's payload (no verification: the API server issued it).
func jwtClaims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %.40q", token)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// kubeletProofs checks on the shop namespace's dispatcher what only a kubelet does: the
// projected NATS token it mounts (and renews), probes that gate readiness, the image's user
// and a read-only root file system under the restricted securityContext, and the memory
// limit applied to the process.
func (s *install) kubeletProofs(t *testing.T) {
	p := dispatcherPod(t, shop)

	t.Run("the auth callout runs apart from the controller", func(t *testing.T) {
		var d struct {
			Spec struct {
				Template struct {
					Spec struct {
						ServiceAccountName string `json:"serviceAccountName"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
			Status struct {
				ReadyReplicas int `json:"readyReplicas"`
			} `json:"status"`
		}
		kubectlJSON(t, &d, "-n", operatorNS, "get", "deployment", release+"-callout", "-o", "json")
		if d.Status.ReadyReplicas != 2 || d.Spec.Template.Spec.ServiceAccountName != release+"-callout" {
			t.Errorf("callout Deployment: %d ready replicas, ServiceAccount %q; want 2 as %s-callout", d.Status.ReadyReplicas, d.Spec.Template.Spec.ServiceAccountName, release)
		}
		// What the kubelet mounted: the issuer seed in the callout's containers, never in the
		// controller's (which runs tenants' erasure expressions).
		for component, wantKeys := range map[string]bool{"callout": true, "controller": false} {
			var list struct {
				Items []podInfo `json:"items"`
			}
			kubectlJSON(t, &list, "-n", operatorNS, "get", "pods", "-l", "app.kubernetes.io/component="+component, "--field-selector=status.phase=Running", "-o", "json")
			if len(list.Items) == 0 {
				t.Fatalf("no running %s pod", component)
			}
			for _, pod := range list.Items {
				procs := strings.Fields(readFile(t, filepath.Join(containerCgroup(t, "pids", pod), "cgroup.procs")))
				if len(procs) == 0 {
					t.Fatalf("no process in %s's cgroup", pod.Metadata.Name)
				}
				mounted := strings.Contains(readFile(t, filepath.Join("/proc", procs[0], "mountinfo")), " /etc/webhook-operator/callout ")
				if mounted != wantKeys {
					t.Errorf("%s pod %s: the callout's keys mounted: %v, want %v", component, pod.Metadata.Name, mounted, wantKeys)
				}
			}
		}
		logf(t, "the callout: 2 ready replicas as ServiceAccount %s-callout, the only pods with its keys", release)
	})

	t.Run("projected NATS token", func(t *testing.T) {
		file := tokenFile(p)
		c := jwtClaims(t, clusterExec(t, "cat", file))
		aud, _ := json.Marshal(c["aud"])
		iat, exp := c["iat"].(float64), c["exp"].(float64)
		if !strings.Contains(string(aud), `"nats.webhook-operator.io"`) || c["sub"] != "system:serviceaccount:"+shop+":webhook-dispatcher" {
			t.Errorf("token claims aud %s sub %v", aud, c["sub"])
		}
		// Bound to the pod: a deleted pod's token is refused by TokenReview.
		kube, _ := c["kubernetes.io"].(map[string]any)
		pod, _ := kube["pod"].(map[string]any)
		if pod["name"] != p.Metadata.Name {
			t.Errorf("the token is not bound to pod %s: %v", p.Metadata.Name, kube)
		}
		logf(t, "kubelet mounted %s: aud %s, sub %v, bound to pod %v, lifetime %.0fs (the kubelet renews it after 80%%, %.0fs)",
			file, aud, c["sub"], pod["name"], exp-iat, 0.8*(exp-iat))
	})

	t.Run("image user and read-only root under the restricted securityContext", func(t *testing.T) {
		procs := strings.Fields(readFile(t, filepath.Join(containerCgroup(t, "pids", p), "cgroup.procs")))
		if len(procs) == 0 {
			t.Fatal("no process in the dispatcher's cgroup")
		}
		status := readFile(t, filepath.Join("/proc", procs[0], "status"))
		var uid string
		for _, l := range strings.Split(status, "\n") {
			if strings.HasPrefix(l, "Uid:") {
				uid = strings.Fields(l)[1]
			}
		}
		if uid != "65532" {
			t.Errorf("the dispatcher runs as uid %s, want the image's 65532", uid)
		}
		mounts := readFile(t, filepath.Join("/proc", procs[0], "mountinfo"))
		var rootRO bool
		for _, l := range strings.Split(mounts, "\n") {
			f := strings.Fields(l)
			if len(f) > 5 && f[4] == "/" {
				rootRO = strings.HasPrefix(f[5], "ro")
			}
		}
		if !rootRO {
			t.Errorf("the dispatcher's root file system is not read-only")
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", procs[0], "cmdline"))
		logf(t, "dispatcher pid %s (%s): uid %s, root file system read-only", procs[0], strings.ReplaceAll(string(cmdline[:min(60, len(cmdline))]), "\x00", " "), uid)
	})

	t.Run("memory limit on the process", func(t *testing.T) {
		want := p.Spec.Containers[0].Resources.Limits["memory"]
		limit := strings.TrimSpace(readFile(t, filepath.Join(containerCgroup(t, "memory", p), "memory.limit_in_bytes")))
		if want != "256Mi" || limit != fmt.Sprint(256<<20) {
			t.Errorf("the pod's memory limit %q, the container cgroup's %s bytes", want, limit)
		}
		logf(t, "memory limit %s: the kernel holds the dispatcher's cgroup to %s bytes", want, limit)
	})

	t.Run("probes gate readiness", func(t *testing.T) {
		// Without NATS the dispatcher's /readyz fails: the kubelet takes the pod out of the
		// Ready ones, and puts it back when NATS returns.
		kubectl(t, "-n", natsNS, "scale", "statefulset/nats", "--replicas=0")
		defer func() {
			kubectl(t, "-n", natsNS, "scale", "statefulset/nats", "--replicas=3")
			kubectl(t, "-n", natsNS, "rollout", "status", "statefulset/nats", "--timeout=5m")
		}()
		kubectl(t, "-n", shop, "wait", "--for=condition=Ready=false", "pod/"+p.Metadata.Name, "--timeout=3m")
		logf(t, "NATS down: dispatcher pod %s not Ready (its readiness probe fails)", p.Metadata.Name)
		kubectl(t, "-n", natsNS, "scale", "statefulset/nats", "--replicas=3")
		kubectl(t, "-n", shop, "wait", "--for=condition=Ready", "pod/"+p.Metadata.Name, "--timeout=5m")
		logf(t, "NATS back: the pod is Ready again")
	})
}

// tokenWatch is a dispatcher pod whose projected token is followed across the kubelet's
// renewal.
type tokenWatch struct {
	pod        podInfo
	file       string
	iat, exp   float64
	receiverNS string
}

// tokenFile is where the kubelet mounts a dispatcher pod's NATS token (inside the node's
// mount namespace).
func tokenFile(p podInfo) string {
	return filepath.Join(filepath.Dir(world.kubeconfig), "kubelet", "root", "pods", p.Metadata.UID,
		"volumes", "kubernetes.io~projected", "nats-token", "token")
}

// watchToken starts a tenant whose dispatcher no fault touches and notes its token.
func (s *install) watchToken(t *testing.T) {
	const ns = "ledger"
	s.tenant(t, ns)
	endpoint(t, ns, "books", receiver(t, ns, "books"), `"entry.*"`, "")
	kubectl(t, "-n", ns, "rollout", "status", "deployment/webhook-dispatcher", "--timeout=3m")
	p := dispatcherPod(t, ns)
	c := jwtClaims(t, clusterExec(t, "cat", tokenFile(p)))
	s.token = &tokenWatch{pod: p, file: tokenFile(p), iat: c["iat"].(float64), exp: c["exp"].(float64), receiverNS: ns}
	logf(t, "following dispatcher %s/%s's token: issued %s, expires %s (%.0fs)", ns, p.Metadata.Name,
		time.Unix(int64(s.token.iat), 0).Format("15:04:05"), time.Unix(int64(s.token.exp), 0).Format("15:04:05"), s.token.exp-s.token.iat)
}

// tokenRenewed: the kubelet wrote a new token into the same pod's volume before the first
// expired, and after the first expired (and with it the NATS authorization the callout gave
// for it) the dispatcher still delivers: it reconnected with the renewed file.
func (s *install) tokenRenewed(t *testing.T) {
	w := s.token
	if w == nil {
		t.Fatal("no token followed")
	}
	var iat float64
	renewAt := time.Unix(int64(w.iat+0.8*(w.exp-w.iat)), 0)
	eventually(t, time.Until(renewAt)+3*time.Minute, "the kubelet to renew the token (due "+renewAt.Format("15:04:05")+")", func() error {
		c := jwtClaims(t, clusterExec(t, "cat", w.file))
		if iat = c["iat"].(float64); iat == w.iat {
			return fmt.Errorf("still the token issued at %s", time.Unix(int64(iat), 0).Format("15:04:05"))
		}
		return nil
	})
	logf(t, "the kubelet renewed %s's token: issued %s (the first at %s)", w.pod.Metadata.Name,
		time.Unix(int64(iat), 0).Format("15:04:05"), time.Unix(int64(w.iat), 0).Format("15:04:05"))
	expired := time.Unix(int64(w.exp), 0).Add(15 * time.Second)
	if d := time.Until(expired); d > 0 {
		logf(t, "waiting %s for the first token to expire", d.Round(time.Second))
		time.Sleep(d) // a deadline of the API server's clock, not a synchronisation
	}
	prefix := runID + "renewed"
	produce(t, w.receiverNS, "producer-renewed", "entry.created", prefix, 5, 5)
	waitReceived(t, w.receiverNS, "books", ids(prefix, 5), 3*time.Minute)
	if p := dispatcherPod(t, w.receiverNS); p.Metadata.UID != w.pod.Metadata.UID {
		t.Errorf("the dispatcher pod was replaced (%s): the renewal was not what kept it connected", p.Metadata.Name)
	}
	logf(t, "after the first token expired, dispatcher %s (the same pod) delivered again with the renewed one", w.pod.Metadata.Name)
}
