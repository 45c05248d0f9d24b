package localstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const fakeNS = "apps"

// fakeDeployment is a Deployment as the controller writes them, running the fake pod.
func fakeDeployment(name string, replicas int32, extraEnv ...corev1.EnvVar) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/managed-by": "webhook-operator", "app": name}
	field := func(n, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: n, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("probes")}},
		PeriodSeconds: 10, FailureThreshold: 1}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fakeNS, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            "fake",
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					Containers: []corev1.Container{{
						Name:  "fake",
						Image: "example.com/ignored:latest",
						Args: []string{"fakepod", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081",
							"--secret-file=/etc/fake/allowed/token", "--token-file=/var/run/secrets/fake.example/token", "--name=$(POD_NAME)"},
						Env: append([]corev1.EnvVar{
							field("POD_NAME", "metadata.name"),
							field("POD_NAMESPACE", "metadata.namespace"),
							{Name: "SECRET_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
								LocalObjectReference: corev1.LocalObjectReference{Name: "allowed"}, Key: "token"}}},
							{Name: "PLAIN", Value: "plain-$(POD_NAMESPACE)"},
						}, extraEnv...),
						Ports: []corev1.ContainerPort{
							{Name: "metrics", ContainerPort: 8080},
							{Name: "probes", ContainerPort: 8081},
						},
						ReadinessProbe: probe,
						VolumeMounts: []corev1.VolumeMount{{Name: "allowed", MountPath: "/etc/fake/allowed", ReadOnly: true},
							{Name: "token", MountPath: "/var/run/secrets/fake.example", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{
						{Name: "allowed", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "allowed"}}},
						{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
							ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "fake.example", ExpirationSeconds: ptr.To[int64](600), Path: "token"}}}}}},
					},
				},
			},
		},
	}
}

// TestPodRunner drives the runner against a real API server with the test binary as the
// container: environment and identity, readiness, scaling, template changes, crashes,
// deletion, and a stop that leaves no process behind.
func TestPodRunner(t *testing.T) {
	t.Setenv("LOCALSTACK_LEAK_CHECK", "must-not-reach-pods")
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	c := cp.Client
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fakeNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "fake", Namespace: fakeNS}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "allowed", Namespace: fakeNS}, StringData: map[string]string{"token": "s3cret"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: fakeNS}, StringData: map[string]string{"token": "hidden"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "fake", Namespace: fakeNS}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{"allowed"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "fake", Namespace: fakeNS},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "fake"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "fake", Namespace: fakeNS}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r, err := NewPodRunner(cp.Config, RunnerOptions{Binary: exe, Dir: dir, Grace: 5 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx)
	t.Cleanup(r.Stop)

	dep := fakeDeployment("fake", 1)
	if err := c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, c, "fake", 1)
	pods := waitPods(t, r, "fake", 1)
	name, pid := only(pods)

	t.Run("the container runs from the template with its own identity", func(t *testing.T) {
		rep := readReport(t, dir, fakeNS, name, pid)
		env := map[string]string{}
		for _, kv := range rep.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		for k, want := range map[string]string{"POD_NAME": name, "POD_NAMESPACE": fakeNS, "SECRET_TOKEN": "s3cret", "PLAIN": "plain-apps"} {
			if env[k] != want {
				t.Errorf("%s = %q, want %q", k, env[k], want)
			}
		}
		if _, leaked := env["LOCALSTACK_LEAK_CHECK"]; leaked {
			t.Error("the runner's own environment reached the container")
		}
		if rep.User != "system:serviceaccount:apps:fake" || rep.UserErr != "" {
			t.Errorf("the container is %q (%s), want the ServiceAccount apps/fake", rep.User, rep.UserErr)
		}
		if rep.AllowedErr != "" || rep.OtherErr != "forbidden=true" {
			t.Errorf("RBAC: reading Secret allowed: %q, other: %q; want allowed and forbidden", rep.AllowedErr, rep.OtherErr)
		}
		if rep.SecretFile != "s3cret" {
			t.Errorf("the Secret volume reads %q", rep.SecretFile)
		}
		// The projected token is the pod's ServiceAccount's, for the volume's audience only.
		cs := kubernetes.NewForConfigOrDie(cp.Config)
		for _, tc := range []struct {
			audiences []string
			want      bool
		}{{[]string{"fake.example"}, true}, {nil, false}} {
			tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
				Spec: authenticationv1.TokenReviewSpec{Token: rep.TokenFile, Audiences: tc.audiences}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tr.Status.Authenticated != tc.want || tc.want && tr.Status.User.Username != "system:serviceaccount:apps:fake" {
				t.Errorf("the projected token reviewed for audiences %v: authenticated %v as %q, want %v", tc.audiences, tr.Status.Authenticated, tr.Status.User.Username, tc.want)
			}
		}
		if !slices.Contains(rep.Args, "--name="+name) {
			t.Errorf("$(POD_NAME) not expanded in %v", rep.Args)
		}
		for _, a := range rep.Args {
			if strings.HasSuffix(a, ":8080") || strings.HasSuffix(a, ":8081") {
				t.Errorf("argument %q still binds the container port", a)
			}
		}
	})

	t.Run("readiness is probed and reported in the Deployment's status", func(t *testing.T) {
		unready := filepath.Join(dir, "pods", fakeNS, name, "unready")
		if err := os.WriteFile(unready, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		waitAvailable(t, c, "fake", 0)
		if err := os.Remove(unready); err != nil {
			t.Fatal(err)
		}
		waitAvailable(t, c, "fake", 1)
	})

	t.Run("a crashed process is restarted", func(t *testing.T) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			if p := r.Pods(fakeNS, "fake")[name]; p == 0 || p == pid {
				return fmt.Errorf("pod %s runs process %d", name, p)
			}
			return nil
		}, "")
		waitAvailable(t, c, "fake", 1)
	})

	t.Run("replicas follow spec.replicas", func(t *testing.T) {
		patchDeployment(t, c, "fake", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](2) })
		waitAvailable(t, c, "fake", 2)
		pods := waitPods(t, r, "fake", 2)
		if _, ok := pods[name]; !ok {
			t.Errorf("scaling up replaced the running replica: %v", pods)
		}
	})

	t.Run("a template change replaces every replica", func(t *testing.T) {
		before := r.Pods(fakeNS, "fake")
		var oldProcs []Process
		for _, p := range descendantsOf(t) {
			for _, pid := range before {
				if p.PID == pid {
					oldProcs = append(oldProcs, p)
				}
			}
		}
		patchDeployment(t, c, "fake", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Env = append(d.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "ROLLED", Value: "1"})
		})
		testenv.Eventually(t, 60*time.Second, func() error {
			now := r.Pods(fakeNS, "fake")
			for n := range now {
				if _, old := before[n]; old {
					return fmt.Errorf("old replica %s still runs", n)
				}
			}
			if len(now) != 2 {
				return fmt.Errorf("%d replicas", len(now))
			}
			return nil
		}, "")
		waitAvailable(t, c, "fake", 2)
		testenv.Eventually(t, 30*time.Second, func() error { return allGone(oldProcs) }, "")
	})

	t.Run("deleting the Deployment stops its replicas", func(t *testing.T) {
		procs := descendantsOf(t)
		if err := c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "fake", Namespace: fakeNS}}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := len(r.Pods(fakeNS, "fake")); n > 0 {
				return fmt.Errorf("%d replicas", n)
			}
			return allGone(procs)
		}, "")
	})

	t.Run("stopping leaves no process behind, even one ignoring SIGTERM with a child", func(t *testing.T) {
		d := fakeDeployment("stubborn", 2, corev1.EnvVar{Name: "FAKE_IGNORE_TERM", Value: "1"}, corev1.EnvVar{Name: "FAKE_GRANDCHILD", Value: "1"})
		if err := c.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
		waitAvailable(t, c, "stubborn", 2)
		for n, p := range waitPods(t, r, "stubborn", 2) {
			if rep := readReport(t, dir, fakeNS, n, p); rep.ChildPID == 0 {
				t.Fatalf("pod %s started no child", n)
			}
		}
		procs := descendantsOf(t)
		if len(procs) < 4 {
			t.Fatalf("expected 2 pods with a child each, found %v", procs)
		}
		began := time.Now()
		r.Stop()
		if err := allGone(procs); err != nil {
			t.Fatal(err)
		}
		t.Logf("stopped in %s", time.Since(began).Round(time.Millisecond))
	})
}

func descendantsOf(t *testing.T) []Process {
	t.Helper()
	procs, err := Descendants(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The control plane's processes are not the runner's.
	var out []Process
	for _, p := range procs {
		if !strings.Contains(p.Command, "kube-apiserver") && !strings.Contains(p.Command, "etcd") {
			out = append(out, p)
		}
	}
	return out
}

func allGone(procs []Process) error {
	for _, p := range procs {
		if p.Alive() {
			return fmt.Errorf("process %s still runs", p)
		}
	}
	return nil
}

func only(m map[string]int) (string, int) {
	for k, v := range m {
		return k, v
	}
	return "", 0
}

func waitPods(t *testing.T, r *PodRunner, name string, n int) map[string]int {
	t.Helper()
	var pods map[string]int
	testenv.Eventually(t, 30*time.Second, func() error {
		pods = r.Pods(fakeNS, name)
		running := 0
		for _, p := range pods {
			if p != 0 {
				running++
			}
		}
		if len(pods) != n || running != n {
			return fmt.Errorf("%d replicas, %d running; want %d", len(pods), running, n)
		}
		return nil
	}, "")
	return pods
}

// waitAvailable waits until the Deployment's status reports n available replicas of its
// current generation, with the matching Available condition.
func waitAvailable(t *testing.T, c client.Client, name string, n int32) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: fakeNS, Name: name}, d); err != nil {
			return err
		}
		st := d.Status
		want := corev1.ConditionFalse
		if n >= *d.Spec.Replicas {
			want = corev1.ConditionTrue
		}
		var avail corev1.ConditionStatus
		for _, cond := range st.Conditions {
			if cond.Type == appsv1.DeploymentAvailable {
				avail = cond.Status
			}
		}
		if st.ObservedGeneration != d.Generation || st.AvailableReplicas != n || st.ReadyReplicas != n || avail != want {
			return fmt.Errorf("status %+v, want %d available of generation %d", st, n, d.Generation)
		}
		return nil
	}, "")
}

func patchDeployment(t *testing.T, c client.Client, name string, f func(*appsv1.Deployment)) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: fakeNS, Name: name}, d); err != nil {
		t.Fatal(err)
	}
	orig := d.DeepCopy()
	f(d)
	if err := c.Patch(context.Background(), d, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}
