package chart

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// testPodName is the chart's test pod (helm test) for release "webhook-operator".
const testPodName = "webhook-operator-test-nats"

// testPod returns the rendered test pod and its one container.
func testPod(t *testing.T, r rendered) (*corev1.Pod, corev1.Container) {
	t.Helper()
	var p corev1.Pod
	typed(t, r.must(t, "Pod", testPodName), &p)
	if len(p.Spec.Containers) != 1 {
		t.Fatalf("test pod containers: %+v", p.Spec.Containers)
	}
	return &p, p.Spec.Containers[0]
}

// natsArgs are the --nats-url and TLS file flags among args.
func natsArgs(args []string) []string {
	var out []string
	for _, a := range args {
		for _, f := range []string{"--nats-url=", "--nats-ca-file=", "--nats-cert-file=", "--nats-key-file="} {
			if strings.HasPrefix(a, f) {
				out = append(out, a)
			}
		}
	}
	return out
}

// The chart's test is a helm test hook: a pod of the controller's image, under its
// securityContext, checking NATS with exactly the controller's URL and TLS files, and
// mounting no credential but those files.
func TestHelmTestPod(t *testing.T) {
	for name, values := range map[string]string{
		"defaults": "",
		"tls URLs": "nats: {url: 'tls://nats-0.example.com:4222,tls://nats-1.example.com:4222', tls: {existingSecret: my-tls}}",
		"static with a CA": `
nats:
  auth: {mode: static}
  tls: {enabled: false}
  credentials: {user: app, password: s3cr3t, caCrt: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}
`,
	} {
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			p, c := testPod(t, r)
			if p.Annotations["helm.sh/hook"] != "test" || !strings.Contains(p.Annotations["helm.sh/hook-delete-policy"], "before-hook-creation") ||
				p.Annotations["helm.sh/hook-output-log-policy"] != "hook-succeeded,hook-failed" {
				t.Errorf("annotations %v: want a helm test hook replaced on each run whose log helm prints", p.Annotations)
			}
			if p.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy %q: a failed check must fail the test, not retry", p.Spec.RestartPolicy)
			}
			if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
				t.Error("the test pod mounts a ServiceAccount token it does not need")
			}
			d, ctrl := deployment(t, r)
			if p.Labels["app.kubernetes.io/instance"] != "webhook-operator" || p.Labels["app.kubernetes.io/component"] != "test" {
				t.Errorf("labels %v", p.Labels)
			}
			var svc corev1.Service
			typed(t, r.must(t, "Service", controllerName+"-metrics"), &svc)
			for _, sel := range []map[string]string{d.Spec.Selector.MatchLabels, svc.Spec.Selector} {
				if labels.SelectorFromSet(sel).Matches(labels.Set(p.Labels)) {
					t.Errorf("the test pod's labels %v match the controller's selector %v", p.Labels, sel)
				}
			}
			if c.Image != ctrl.Image {
				t.Errorf("test image %q, controller image %q", c.Image, ctrl.Image)
			}
			if want := append([]string{"check", "nats"}, natsArgs(ctrl.Args)...); !slices.Equal(c.Args, want) {
				t.Errorf("test args %q, want the controller's NATS URL and TLS files %q", c.Args, want)
			}
			psc := p.Spec.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod securityContext %+v: want runAsNonRoot and RuntimeDefault seccomp", psc)
			}
			if !reflect.DeepEqual(c.SecurityContext, ctrl.SecurityContext) || c.SecurityContext == nil ||
				c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
				t.Errorf("container securityContext %+v: want the controller's (read-only root, no privilege escalation, no capability)", c.SecurityContext)
			}
			// Only the TLS files (or the CA) of the Secret are mounted: never creds, user,
			// password or token.
			for _, v := range p.Spec.Volumes {
				if v.Secret == nil {
					t.Errorf("volume %+v", v)
					continue
				}
				for _, it := range v.Secret.Items {
					if !slices.Contains([]string{"ca.crt", "tls.crt", "tls.key"}, it.Key) {
						t.Errorf("the test pod mounts key %s of Secret %s", it.Key, v.Secret.SecretName)
					}
				}
				if len(v.Secret.Items) == 0 {
					t.Errorf("the test pod mounts every key of Secret %s", v.Secret.SecretName)
				}
			}
			for _, a := range natsArgs(c.Args)[1:] {
				_, file, _ := strings.Cut(a, "=")
				mounted := false
				for _, m := range c.VolumeMounts {
					mounted = mounted || strings.HasPrefix(file, m.MountPath+"/")
				}
				if !mounted {
					t.Errorf("%s: not under a volume mount %+v", a, c.VolumeMounts)
				}
			}
		})
	}
	if r := render(t, "tests: {enabled: false}"); r.find("Pod", testPodName) != nil {
		t.Error("tests.enabled=false still renders the test pod")
	}
}
