package controllers

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

func TestReferencedSecrets(t *testing.T) {
	ep := &v1alpha1.WebhookEndpoint{}
	ep.Name = "crm"
	if got := refNames(referencedSecrets(ep)); !slices.Equal(got, []string{"crm-signing"}) {
		t.Errorf("without signing: %v", got)
	}
	ep.Spec.Signing = &v1alpha1.SigningSpec{
		SecretRef:         v1alpha1.SecretKeySelector{Name: "new", Key: "k"},
		PreviousSecretRef: &v1alpha1.SecretKeySelector{Name: "old", Key: "k"},
	}
	ep.Spec.HeadersFrom = []v1alpha1.HeaderFromSecret{
		{Name: "Authorization", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "token", Key: "t"}},
		{Name: "X-Api-Key", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "token", Key: "k"}},
	}
	ep.Spec.TLS = &v1alpha1.TLSSpec{
		ClientCertificateSecretRef: &v1alpha1.LocalObjectReference{Name: "mtls"},
		CABundleSecretRef:          &v1alpha1.SecretKeySelector{Name: "ca", Key: "ca.crt"},
	}
	refs := referencedSecrets(ep)
	if got := refNames(refs); !slices.Equal(got, []string{"new", "old", "token", "mtls", "ca"}) {
		t.Errorf("all references, each once: %v", got)
	}
	if refs[0].Kind != signingSecret || refs[1].Kind != signingSecret || refs[2].Kind != otherSecret {
		t.Errorf("kinds: %+v", refs)
	}
}

func refNames(refs []secretRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.Name
	}
	return out
}

// A Role never holds a secrets rule without resourceNames: that would grant every Secret.
func TestRoleNeverGrantsAllSecrets(t *testing.T) {
	for _, secrets := range [][]string{nil, {}, {"a-signing"}} {
		d := &dispatcher{Namespace: "ns", Name: names.SharedDispatcher, Secrets: secrets}
		for _, rule := range d.role().Rules {
			if slices.Contains(rule.Resources, "secrets") {
				if len(rule.ResourceNames) == 0 {
					t.Errorf("secrets %v: a rule grants every Secret", secrets)
				}
				if !slices.Equal(rule.Verbs, []string{"get"}) {
					t.Errorf("secrets may only be read: %v", rule.Verbs)
				}
			}
			if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") {
				t.Errorf("wildcard rule %+v", rule)
			}
		}
	}
}

// Without NATS credentials, a dispatcher gets no secret environment and no volume; with a
// creds file, the file is mounted and passed.
func TestDeploymentNATSCredentials(t *testing.T) {
	d := &dispatcher{Namespace: "ns", Name: names.SharedDispatcher, Image: "img", Replicas: 1}
	pod := d.deployment().Spec.Template.Spec
	if len(pod.Volumes) != 0 || len(pod.Containers[0].Env) != 3 {
		t.Errorf("no credentials: volumes %d, env %d", len(pod.Volumes), len(pod.Containers[0].Env))
	}
	d.NATS = newMirror(map[string][]byte{"creds": []byte("jwt")})
	dep := d.deployment()
	pod = dep.Spec.Template.Spec
	if len(pod.Volumes) != 1 || !slices.Contains(d.args(), "--nats-creds-file=/etc/webhook-operator/nats/creds") {
		t.Errorf("creds file: volumes %d, args %v", len(pod.Volumes), d.args())
	}
	if dep.Spec.Template.Annotations[names.AnnotationNATSChecksum] != d.NATS.Checksum {
		t.Error("the pod template carries the credentials' checksum")
	}
	if newMirror(map[string][]byte{"creds": []byte("other")}).Checksum == d.NATS.Checksum {
		t.Error("different credentials, same checksum")
	}
	if d.deployment().Spec.Template.Spec.Containers[0].Resources.Limits != nil {
		t.Error("no limits were asked for")
	}
}

// The tracing credentials' files are mounted and named for the OTLP exporter; their OTEL_*
// keys are set by reference, and a plain --dispatcher-otel-env value of the same name yields to
// the Secret's.
func TestDeploymentOTELCredentials(t *testing.T) {
	d := &dispatcher{Namespace: "ns", Name: names.SharedDispatcher, Image: "img", Replicas: 1,
		OTELEnv: []corev1.EnvVar{{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "https://plain:4317"}, {Name: "OTEL_SERVICE_NAME", Value: "d"}},
		OTEL:    newMirror(map[string][]byte{"OTEL_EXPORTER_OTLP_ENDPOINT": []byte("https://secret:4317"), "ca.crt": []byte("ca"), "tls.crt": []byte("c"), "tls.key": []byte("k")})}
	dep := d.deployment()
	pod := dep.Spec.Template.Spec
	env := map[string]string{}
	for _, e := range pod.Containers[0].Env {
		var v string
		switch {
		case e.Value != nil:
			v = *e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			v = "secret:" + *e.ValueFrom.SecretKeyRef.Name + "/" + *e.ValueFrom.SecretKeyRef.Key
		}
		if _, twice := env[*e.Name]; twice {
			t.Errorf("%s set twice", *e.Name)
		}
		env[*e.Name] = v
	}
	for name, want := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":           "secret:" + names.OTELSecret + "/OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_SERVICE_NAME":                     "d",
		"OTEL_EXPORTER_OTLP_CERTIFICATE":        "/etc/webhook-operator/otel/ca.crt",
		"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/etc/webhook-operator/otel/tls.crt",
		"OTEL_EXPORTER_OTLP_CLIENT_KEY":         "/etc/webhook-operator/otel/tls.key",
	} {
		if env[name] != want {
			t.Errorf("%s = %q, want %q", name, env[name], want)
		}
	}
	if len(pod.Volumes) != 1 || *pod.Volumes[0].Secret.SecretName != names.OTELSecret || len(pod.Volumes[0].Secret.Items) != 3 ||
		*pod.Containers[0].VolumeMounts[0].MountPath != "/etc/webhook-operator/otel" {
		t.Errorf("volumes %+v", pod.Volumes)
	}
	if dep.Spec.Template.Annotations[names.AnnotationOTELChecksum] != d.OTEL.Checksum {
		t.Error("the pod template carries the tracing credentials' checksum")
	}
}

func TestBackoffIsBoundedAndJittered(t *testing.T) {
	b := newBackoff(time.Second, time.Minute)
	seen := map[time.Duration]bool{}
	limit := time.Second
	for i := range 40 {
		d := b.next("k")
		if i > 0 {
			limit = min(2*limit, time.Minute)
		}
		if d < limit/2 || d > limit {
			t.Fatalf("failure %d: waited %v, want within [%v, %v]", i+1, d, limit/2, limit)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("waits barely vary: %v", seen)
	}
	b.forget("k")
	if d := b.next("k"); d > time.Second {
		t.Errorf("after a success the wait starts over, got %v", d)
	}
}

// The installation's egress proxy credentials are mounted as files (renewed by the kubelet,
// read by the dispatcher at every new tunnel) and named in its arguments; without them, nothing.
func TestDeploymentEgressProxyCredentials(t *testing.T) {
	d := &dispatcher{Namespace: "ns", Name: "d", Image: "img", Replicas: 1,
		EgressProxy: newMirror(map[string][]byte{corev1.BasicAuthUsernameKey: []byte("u"), corev1.BasicAuthPasswordKey: []byte("p")})}
	pod := d.deployment().Spec.Template.Spec
	if !slices.Contains(pod.Containers[0].Args, "--egress-proxy-credentials-dir=/etc/webhook-operator/egress-proxy") {
		t.Errorf("args %v", pod.Containers[0].Args)
	}
	if len(pod.Volumes) != 1 || *pod.Volumes[0].Secret.SecretName != names.EgressProxySecret || len(pod.Volumes[0].Secret.Items) != 2 ||
		*pod.Containers[0].VolumeMounts[0].MountPath != "/etc/webhook-operator/egress-proxy" {
		t.Errorf("volumes %+v", pod.Volumes)
	}
	for _, e := range pod.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && *e.ValueFrom.SecretKeyRef.Name == names.EgressProxySecret {
			t.Errorf("the credentials are a variable %s", *e.Name)
		}
	}
	d.EgressProxy = nil
	pod = d.deployment().Spec.Template.Spec
	if len(pod.Volumes) != 0 || slices.ContainsFunc(pod.Containers[0].Args, func(a string) bool { return a == "--egress-proxy-credentials-dir=/etc/webhook-operator/egress-proxy" }) {
		t.Errorf("without credentials: volumes %+v args %v", pod.Volumes, pod.Containers[0].Args)
	}
}

func TestReferencedSecretsOfAuthURLFromAndProxy(t *testing.T) {
	ep := &v1alpha1.WebhookEndpoint{}
	ep.Name = "crm"
	ep.Spec.URLFrom = &v1alpha1.URLFromSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "hook", Key: "url"}}
	ep.Spec.Auth = &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{
		ClientIDRef:     v1alpha1.SecretKeySelector{Name: "oauth", Key: "id"},
		ClientAssertion: &v1alpha1.SignedJWT{KeyRef: v1alpha1.SecretKeySelector{Name: "jwt", Key: "key.pem"}}}}
	ep.Spec.Proxy = &v1alpha1.ProxySpec{URL: "http://p:3128", CredentialsSecretRef: &v1alpha1.LocalObjectReference{Name: "proxy"}}
	if got := refNames(referencedSecrets(ep)); !slices.Equal(got, []string{"crm-signing", "hook", "oauth", "jwt", "proxy"}) {
		t.Errorf("references %v", got)
	}
}
