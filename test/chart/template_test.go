package chart

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// controllerName is the name of the controller's objects for release "webhook-operator".
const (
	controllerName = "webhook-operator-controller"
	calloutName    = "webhook-operator-callout"
)

// nonDefaultValues changes every value the chart has.
const nonDefaultValues = `
crds: {enabled: true, keep: false}
image:
  repository: registry.example.com/platform/webhook-operator
  tag: v9.9.9
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  pullPolicy: Always
imagePullSecrets: [{name: regcred}]
replicas: 2
leaderElection: {enabled: false}   # forced on: replicas > 1
nats:
  url: tls://nats-a.example.com:4222,tls://nats-b.example.com:4222
  # The static credentials: the other mode (its callout values are not used then).
  auth:
    mode: static
    callout: {existingSecret: callout-keys, encrypted: false, tokenAudience: nats.example.com, maxSession: 2h}
  credentials:
    creds: |
      -----BEGIN NATS USER JWT-----
      eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ
      ------END NATS USER JWT------
    token: s3cr3t-token
    caCrt: |
      -----BEGIN CERTIFICATE-----
      MIIB
      -----END CERTIFICATE-----
streams:
  names: {events: EV, deliveries: EV_DELIVERIES, attempts: EV_LOG, deadLetter: EV_DLQ, bucket: ev-state}
  eventsSubjectPrefix: events
  internalSubjectPrefix: evx
  replicas: 3
  placement: {cluster: east, tags: [ssd, "az:a"]}
  storage: memory
  eventsMaxAge: 24h
  attemptsMaxAge: 168h
  deadLetterMaxAge: 2160h
  maxConsumers: 20000
  duplicateWindow: 2m
  eventsMaxBytes: 1Gi
  deliveriesMaxBytes: 32Mi
  deliveriesMaxMsgs: 5000
  attemptsMaxBytes: 512Mi
  deadLetterMaxBytes: 0
  bucketMaxBytes: 1048576
  bucketMaxValueSize: 128Ki
  replayKeyTTL: 24h
dispatcher:
  image: registry.example.com/platform/webhook-operator:debug
  replicas: 3
  networkPolicy: {enabled: true}
  resources:
    requests: {cpu: 250m, memory: 128Mi}
    limits: {cpu: 1, memory: 1Gi}
  maxReplicas: 6
  maxResources: {cpu: 4, memory: 2Gi}
  autoscaling:
    enabled: true
    natsMonitoringEndpoint: nats-a.example.com:8222
    natsMonitoringHTTPS: true
    natsAccount: WEBHOOKS
    maxReplicas: 12
    lagThreshold: 250
    pollingInterval: 30s
tracing:
  enabled: true
  endpoint: http://otel-collector.observability:4318
  protocol: http/protobuf
  serviceName: webhooks-prod
  sampler: parentbased_traceidratio
  samplerArg: 0.25
  env: {OTEL_EXPORTER_OTLP_COMPRESSION: gzip}
  envSecret: otel-collector-auth
outbound:
  allowHTTP: true
  allowedCIDRs: [10.20.0.0/16, 192.168.1.10]
  blockedCIDRs: [10.20.99.0/24, "2600:1f18:abcd::/56"]
  allowCrossNamespaceSources: true
maxEventBytes: 262144
maxEndpointsPerNamespace: 0
excludedNamespaces: [kube-system, platform-system]
maxConcurrentReconciles: 24
replayTTL: 0
logLevel: debug
extraArgs: [--kube-api-qps=50]
extraEnv: [{name: GOMAXPROCS, value: "2"}]
serviceAccount:
  annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::111122223333:role/webhooks"}
metrics:
  port: 9090
  service: {port: 8443, annotations: {prometheus.io/scrape: "true"}}
  serviceMonitor: {enabled: true, interval: 15s, scrapeTimeout: 5s, labels: {release: prometheus}}
  dispatcherPodMonitor: {enabled: true, interval: 20s, labels: {release: prometheus}}
grafana:
  dashboards:
    enabled: true
    label: grafana_dashboard_webhooks
    labelValue: "yes"
    labels: {team: platform}
    annotations: {grafana_folder: Webhooks}
prometheusRule:
  enabled: true
  labels: {release: prometheus}
  alertLabels: {team: platform}
  runbookURL: https://runbooks.example.com/webhooks.md/
  alerts:
    endpointDisabled: {for: 1m, severity: page}
    circuitOpen: {for: 30m}
    deadLetters: {window: 1h, threshold: 10}
    pendingGrowing: {threshold: 5000, window: 2h, for: 20m}
    dispatcherUnavailable: {enabled: false}
healthProbe: {port: 9091}
networkPolicy:
  enabled: true
  metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
  dns: {to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}}]}
  apiServer: {cidrs: [172.20.0.1/32], ports: [443]}
  nats: {to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: nats}}}], ports: [4222, 7422]}
podDisruptionBudget: {enabled: true, minAvailable: 1, maxUnavailable: ""}
tenantRoles: {create: false}
resources:
  requests: {cpu: 200m, memory: 256Mi}
  limits: {cpu: "2", memory: 512Mi}
podSecurityContext:
  runAsNonRoot: true
  runAsUser: 10001
  fsGroup: 10001
  seccompProfile: {type: RuntimeDefault}
podAnnotations: {team: platform}
podLabels: {cost-center: cc-42}
priorityClassName: system-cluster-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: platform, effect: NoSchedule}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/component: controller}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/component: controller}}
ingress:
  enabled: true
  replicas: 3
  tokenAudiences: [ingress.example.com]
  rateLimit: 50
  rateBurst: 100
  maxBatchEvents: 100
  maxBatchBytes: 1Mi
  maxConcurrentRequests: 128
  publishTimeout: 3s
  authCacheTTL: 30s
  maxReviewsInFlight: 16
  maxBodyBytesInFlight: 32Mi
  maxBodyBytesPerNamespace: 4Mi
  maxConnections: 1000
  maxConnectionsPerClient: -1
  apiPriority: {enabled: true, matchingPrecedence: 2000, nominalConcurrencyShares: 10, queueLengthLimit: 64}
  tls: {existingSecret: ingress-cert}
  service: {type: ClusterIP, port: 8443, annotations: {team: platform}}
  port: 9443
  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 128Mi}}
`

// deployment returns the controller Deployment and its one container.
func deployment(t *testing.T, r rendered) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	return deploymentNamed(t, r, controllerName)
}

// calloutDeployment is the auth callout's Deployment and its container.
func calloutDeployment(t *testing.T, r rendered) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	return deploymentNamed(t, r, calloutName)
}

func deploymentNamed(t *testing.T, r rendered, name string) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	typed(t, r.must(t, "Deployment", name), &d)
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("want one container, have %d", n)
	}
	return &d, d.Spec.Template.Spec.Containers[0]
}

// env returns the container's variable name, or nil.
func env(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// stringData returns a rendered Secret's stringData.
func stringData(t *testing.T, r rendered, name string) map[string]string {
	t.Helper()
	var s corev1.Secret
	typed(t, r.must(t, "Secret", name), &s)
	if len(s.Data) > 0 {
		t.Errorf("Secret %s: want stringData only, have data %v", name, s.Data)
	}
	return s.StringData
}

// parseShared parses the arguments the controller shares with its dispatchers with opconfig's
// own flag definitions, ignoring the controller-only flags, so that the chart's values and
// the binary's flags cannot disagree on names, syntax or defaults.
func parseShared(t *testing.T, args []string) opconfig.Config {
	t.Helper()
	c := opconfig.Default()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	c.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("opconfig cannot parse the chart's arguments: %v\n%s", err, strings.Join(args, "\n"))
	}
	if err := c.Validate(); err != nil {
		t.Errorf("the chart's arguments are not a valid configuration: %v", err)
	}
	return c
}

func TestLint(t *testing.T) {
	for name, values := range map[string]string{"defaults": "", "non-default": nonDefaultValues} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir(), "--namespace", releaseNamespace}
			if values != "" {
				args = append(args, "--values", valuesFile(t, values))
			}
			out, err := helm(t, nil, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

func TestTemplateDefaults(t *testing.T) {
	r := render(t, "")

	wantKinds := map[string]int{
		"CustomResourceDefinition": 5, "ServiceAccount": 3, "ClusterRole": 9,
		"Secret":             3, // with the scraper CA and client certificate of secure metrics
		"ClusterRoleBinding": 4, "Role": 1, "RoleBinding": 2, "Service": 2, "Deployment": 3,
		"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1,
		"PodDisruptionBudget": 1, // the callout's
		"Pod":                 1, // the chart's test (helm test)
		"APIService":          1, // the data API's (and its Deployment, Service, Secret, roles)
	}
	if got := r.kinds(); !reflect.DeepEqual(got, wantKinds) {
		t.Errorf("kinds: got %v, want %v (no ServiceMonitor or NetworkPolicy by default, a PDB for the callout only)", got, wantKinds)
	}
	for _, o := range r {
		switch o.GetKind() {
		case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "APIService":
			if o.GetNamespace() != "" {
				t.Errorf("%s %s: cluster-scoped but has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
			}
		case "RoleBinding":
			// The data API server reads the front proxy's CA in kube-system; the rest is the release's.
			want := releaseNamespace
			if o.GetName() == apiserverName+":extension-apiserver-authentication-reader" {
				want = "kube-system"
			}
			if o.GetNamespace() != want {
				t.Errorf("%s %s: namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), want)
			}
		default:
			if o.GetNamespace() != releaseNamespace {
				t.Errorf("%s %s: namespace %q, want the release's %q", o.GetKind(), o.GetName(), o.GetNamespace(), releaseNamespace)
			}
		}
		if o.GetKind() != "CustomResourceDefinition" && o.GetLabels()["app.kubernetes.io/instance"] != "webhook-operator" {
			t.Errorf("%s %s: no app.kubernetes.io/instance label: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
	}
	for _, crd := range r.ofKind("CustomResourceDefinition") {
		if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s: crds.keep defaults to true but has no helm.sh/resource-policy: keep", crd.GetName())
		}
	}

	// The plugin's Secret holds no credential: users connect as themselves, over TLS, with
	// tokens of the callout's audience.
	if got, want := stringData(t, r, "webhook-operator-nats"), map[string]string{"url": "nats://nats.nats.svc:4222", "auth": "kubernetes",
		"tlsSecret": "webhook-operator-nats-tls", "tokenAudience": "nats.webhook-operator.io"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Secret webhook-operator-nats: got %v, want %v", got, want)
	}

	d, c := deployment(t, r)
	wantArgs := []string{
		"controller",
		"--nats-url=nats://nats.nats.svc:4222",
		"--nats-credentials-secret=" + releaseNamespace + "/webhook-operator-nats-tls",
		"--nats-auth-callout",
		"--nats-token-audience=nats.webhook-operator.io",
		"--nats-token-expiration-seconds=3600",
		// TLS by default: every connection carries a Kubernetes token.
		"--nats-ca-file=/etc/webhook-operator/nats-tls/ca.crt",
		"--nats-cert-file=/etc/webhook-operator/nats-tls/tls.crt",
		"--nats-key-file=/etc/webhook-operator/nats-tls/tls.key",
		"--events-stream=WEBHOOKS",
		"--events-subject-prefix=webhooks",
		"--deliveries-stream=WEBHOOKS_DELIVERIES",
		"--attempts-stream=WEBHOOKS_ATTEMPTS",
		"--dead-letter-stream=WEBHOOKS_DLQ",
		"--kv-bucket=webhook-operator",
		"--internal-subject-prefix=whk",
		"--stream-replicas=1",
		"--stream-storage=file",
		"--events-max-age=72h",
		"--attempts-max-age=720h",
		"--dead-letter-max-age=0",
		"--max-consumers=100000",
		"--duplicate-window=10m",
		"--events-max-bytes=128Mi",
		"--deliveries-max-bytes=64Mi",
		"--deliveries-max-msgs=100000",
		"--attempts-max-bytes=128Mi",
		"--dead-letter-max-bytes=64Mi",
		"--kv-max-bytes=32Mi",
		"--kv-max-value-size=64Ki",
		"--replay-key-ttl=720h",
		"--allow-http=false",
		"--allow-cross-namespace-sources=false",
		"--max-event-bytes=1048576",
		"--max-endpoints-per-namespace=1000",
		"--excluded-namespaces=kube-system,kube-public,kube-node-lease",
		"--dispatcher-replicas=1",
		"--dispatcher-cpu-request=100m",
		"--dispatcher-memory-request=64Mi",
		"--dispatcher-cpu-limit=1",
		"--dispatcher-memory-limit=256Mi",
		"--dispatcher-max-replicas=10",
		"--dispatcher-max-cpu=2",
		"--dispatcher-max-memory=1Gi",
		"--leader-elect=true",
		"--leader-election-namespace=" + releaseNamespace,
		"--dispatcher-metrics-ca-secret=webhook-operator-metrics-scraper-tls",
		"--dispatcher-metrics-client-name=webhook-operator-metrics-scraper",
		"--metrics-secure=true",
		"--metrics-bind-address=:8080",
		"--health-probe-bind-address=:8081",
		"--max-concurrent-reconciles=16",
		"--replay-ttl=24h",
		"--max-erasures=4",
		"--max-erasures-per-namespace=1",
		"--zap-log-level=info",
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args:\n got %q\nwant %q", c.Args, wantArgs)
	}
	// The chart's defaults are the binary's defaults (only the NATS URL differs: in a cluster
	// NATS is a Service, not localhost; and the chart mounts the TLS files, which the binary
	// cannot default).
	want := opconfig.Default()
	want.NATS.URL = "nats://nats.nats.svc:4222"
	want.NATS.CredentialsSecret = releaseNamespace + "/webhook-operator-nats-tls"
	want.NATS.CAFile, want.NATS.CertFile, want.NATS.KeyFile = "/etc/webhook-operator/nats-tls/ca.crt", "/etc/webhook-operator/nats-tls/tls.crt", "/etc/webhook-operator/nats-tls/tls.key"
	if got := parseShared(t, c.Args[1:]); !reflect.DeepEqual(got, want) {
		t.Errorf("the chart's default shared configuration differs from opconfig.Default():\n got %+v\nwant %+v", got, want)
	}

	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	readYAML(t, "charts/webhook-operator/Chart.yaml", &chart)
	image := "ghcr.io/webhook-operator/webhook-operator:" + chart.AppVersion
	if c.Image != image {
		t.Errorf("image %q, want %q", c.Image, image)
	}
	if e := env(c, "OPERATOR_IMAGE"); e == nil || e.Value != image {
		t.Errorf("OPERATOR_IMAGE = %+v, want %q: dispatchers must run the controller's image", e, image)
	}
	if e := env(c, "POD_NAMESPACE"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("POD_NAMESPACE = %+v", e)
	}
	// The controller keeps its heap under its container's memory limit (cmd's memoryLimit).
	if e := env(c, "CONTAINER_MEMORY_LIMIT"); e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
		t.Errorf("CONTAINER_MEMORY_LIMIT = %+v, want the container's limits.memory", e)
	}
	// The JetStream admin's login comes from the callout's Secret; no token, and not the
	// callout's login (its own Deployment's).
	for n, key := range map[string]string{"NATS_USER": "admin-user", "NATS_PASSWORD": "admin-password"} {
		if e := env(c, n); e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != "webhook-operator-nats-callout" || e.ValueFrom.SecretKeyRef.Key != key {
			t.Errorf("%s = %+v, want key %s of Secret webhook-operator-nats-callout", n, e, key)
		}
	}
	for _, n := range []string{"NATS_CALLOUT_USER", "NATS_CALLOUT_PASSWORD"} {
		if env(c, n) != nil {
			t.Errorf("the controller has the callout's login %s", n)
		}
	}
	if env(c, "NATS_TOKEN") != nil {
		t.Error("NATS_TOKEN set in callout mode")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1", d.Spec.Replicas)
	}
	if got := d.Spec.Template.Spec.ServiceAccountName; got != controllerName {
		t.Errorf("serviceAccountName %q", got)
	}
	if got := d.Spec.Template.Annotations["checksum/nats"]; len(got) != 64 {
		t.Errorf("checksum/nats annotation %q: the controller would not roll on a NATS change", got)
	}

	// Restricted Pod Security Standard.
	psc := d.Spec.Template.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and RuntimeDefault seccomp", psc)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v: want no privilege escalation, read-only root, all capabilities dropped", sc)
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if !reflect.DeepEqual(ports, map[string]int32{"metrics": 8080, "probes": 8081}) {
		t.Errorf("ports %v", ports)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != intstr.FromString("probes") {
		t.Errorf("livenessProbe %+v", p)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port != intstr.FromString("probes") {
		t.Errorf("readinessProbe %+v", p)
	}
	if c.Resources.Requests.Cpu().String() != "100m" || c.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("resources %+v", c.Resources)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		// The TLS files only: the callout's keys are mounted into its own pods, never here.
		if v.Name != "nats-tls" || v.Secret.SecretName != "webhook-operator-nats-tls" || len(v.Secret.Items) != 3 {
			t.Errorf("the controller's volume %s mounts Secret %s: %+v", v.Name, v.Secret.SecretName, v.Secret.Items)
		}
	}
	// Tenants' roles, aggregated into view, edit and admin.
	for name, aggregate := range map[string]string{"webhook-operator-viewer": "view", "webhook-operator-editor": "edit", "webhook-operator-producer": ""} {
		cr := r.must(t, "ClusterRole", name)
		if aggregate != "" && cr.GetLabels()["rbac.authorization.k8s.io/aggregate-to-"+aggregate] != "true" {
			t.Errorf("ClusterRole %s is not aggregated to %s: %v", name, aggregate, cr.GetLabels())
		}
	}

	var svc corev1.Service
	typed(t, r.must(t, "Service", controllerName+"-metrics"), &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].TargetPort != intstr.FromString("metrics") {
		t.Errorf("metrics Service ports %+v", svc.Spec.Ports)
	}
	if !reflect.DeepEqual(svc.Spec.Selector, d.Spec.Selector.MatchLabels) {
		t.Errorf("Service selector %v, Deployment selector %v", svc.Spec.Selector, d.Spec.Selector.MatchLabels)
	}

	var crb rbacv1.ClusterRoleBinding
	typed(t, r.must(t, "ClusterRoleBinding", controllerName), &crb)
	if crb.RoleRef.Name != controllerName || len(crb.Subjects) != 1 || crb.Subjects[0].Name != controllerName || crb.Subjects[0].Namespace != releaseNamespace {
		t.Errorf("ClusterRoleBinding %+v", crb)
	}
	var role rbacv1.Role
	typed(t, r.must(t, "Role", controllerName+"-leader-election"), &role)
	if !slices.Contains(role.Rules[0].Resources, "leases") {
		t.Errorf("leader-election Role %+v grants no leases", role.Rules)
	}
}

func TestTemplateNonDefault(t *testing.T) {
	r := render(t, nonDefaultValues)

	for _, crd := range r.ofKind("CustomResourceDefinition") {
		if _, ok := crd.GetAnnotations()["helm.sh/resource-policy"]; ok {
			t.Errorf("CRD %s: crds.keep=false but the keep policy is set", crd.GetName())
		}
	}

	// The Secret holds the URL and the inline credentials, and names itself as the
	// credentials Secret for the plugin.
	sd := stringData(t, r, "webhook-operator-nats")
	for _, k := range []string{"url", "credentialsSecret", "creds", "token", "ca.crt"} {
		if sd[k] == "" {
			t.Errorf("Secret webhook-operator-nats has no %s: %v", k, keys(sd))
		}
	}
	for _, k := range []string{"user", "password"} {
		if _, ok := sd[k]; ok {
			t.Errorf("Secret webhook-operator-nats has %s, which was not given", k)
		}
	}
	if sd["url"] != "tls://nats-a.example.com:4222,tls://nats-b.example.com:4222" || sd["credentialsSecret"] != "webhook-operator-nats" {
		t.Errorf("Secret webhook-operator-nats: url %q, credentialsSecret %q", sd["url"], sd["credentialsSecret"])
	}
	if !strings.HasPrefix(sd["creds"], "-----BEGIN NATS USER JWT-----\n") {
		t.Errorf("creds not kept verbatim: %q", sd["creds"])
	}

	d, c := deployment(t, r)
	image := "registry.example.com/platform/webhook-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if c.Image != image || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %q %s, want the digest %q, Always", c.Image, c.ImagePullPolicy, image)
	}
	if e := env(c, "OPERATOR_IMAGE"); e == nil || e.Value != image {
		t.Errorf("OPERATOR_IMAGE %+v, want %q", e, image)
	}
	for _, want := range []string{
		"--nats-url=tls://nats-a.example.com:4222,tls://nats-b.example.com:4222",
		"--nats-credentials-secret=" + releaseNamespace + "/webhook-operator-nats",
		"--nats-creds-file=/etc/webhook-operator/nats/creds",
		"--nats-ca-file=/etc/webhook-operator/nats/ca.crt",
		"--events-stream=EV", "--events-subject-prefix=events", "--deliveries-stream=EV_DELIVERIES",
		"--attempts-stream=EV_LOG", "--dead-letter-stream=EV_DLQ", "--kv-bucket=ev-state",
		"--internal-subject-prefix=evx", "--stream-replicas=3", "--stream-storage=memory",
		"--events-max-age=24h", "--attempts-max-age=168h", "--dead-letter-max-age=2160h",
		"--max-consumers=20000", "--duplicate-window=2m",
		"--events-max-bytes=1Gi", "--attempts-max-bytes=512Mi", "--dead-letter-max-bytes=0",
		"--kv-max-bytes=1048576", "--kv-max-value-size=128Ki", "--replay-key-ttl=24h",
		"--stream-placement-cluster=east", "--stream-placement-tags=ssd,az:a",
		"--allow-http=true", "--allowed-cidrs=10.20.0.0/16,192.168.1.10", "--blocked-cidrs=10.20.99.0/24,2600:1f18:abcd::/56", "--allow-cross-namespace-sources=true",
		"--max-event-bytes=262144", "--max-endpoints-per-namespace=0",
		"--excluded-namespaces=kube-system,platform-system",
		"--dispatcher-image=registry.example.com/platform/webhook-operator:debug",
		"--dispatcher-replicas=3",
		"--dispatcher-cpu-request=250m", "--dispatcher-memory-request=128Mi",
		"--dispatcher-cpu-limit=1", "--dispatcher-memory-limit=1Gi",
		"--dispatcher-max-replicas=6", "--dispatcher-max-cpu=4", "--dispatcher-max-memory=2Gi",
		"--autoscaling=true", "--autoscaling-nats-monitoring-endpoint=nats-a.example.com:8222",
		"--autoscaling-nats-monitoring-https=true", "--autoscaling-nats-account=WEBHOOKS",
		"--autoscaling-max-replicas=12", "--autoscaling-lag-threshold=250",
		"--autoscaling-polling-interval=30s",
		"--dispatcher-otel-env=OTEL_EXPORTER_OTLP_COMPRESSION=gzip", "--dispatcher-otel-env=OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector.observability:4318",
		"--dispatcher-otel-env=OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "--dispatcher-otel-env=OTEL_SERVICE_NAME=webhooks-prod",
		"--dispatcher-otel-env=OTEL_TRACES_EXPORTER=otlp", "--dispatcher-otel-env=OTEL_TRACES_SAMPLER=parentbased_traceidratio",
		"--dispatcher-otel-env=OTEL_TRACES_SAMPLER_ARG=0.25", "--dispatcher-otel-env-secret=otel-collector-auth",
		"--leader-elect=true", "--leader-election-namespace=" + releaseNamespace,
		"--metrics-bind-address=:9090", "--health-probe-bind-address=:9091",
		"--dispatcher-egress-policy=true", "--dispatcher-egress-api-server-cidrs=172.20.0.1/32", "--dispatcher-egress-api-server-ports=443",
		"--max-concurrent-reconciles=24", "--replay-ttl=0", "--zap-log-level=debug", "--kube-api-qps=50",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args lack %s:\n%s", want, strings.Join(c.Args, "\n"))
		}
	}
	for _, a := range c.Args {
		if strings.Contains(a, "s3cr3t") || strings.Contains(a, "JWT") {
			t.Errorf("a credential in the arguments: %s", a)
		}
	}
	got := parseShared(t, c.Args[1:])
	if got.NATS.CredentialsSecret != releaseNamespace+"/webhook-operator-nats" ||
		got.Streams.Names.EventsStream != "EV" || got.Streams.Names.Bucket != "ev-state" ||
		got.Streams.Replicas != 3 || got.Streams.Storage != jetstream.MemoryStorage ||
		!reflect.DeepEqual(got.Streams.Placement, &jetstream.Placement{Cluster: "east", Tags: []string{"ssd", "az:a"}}) ||
		got.Streams.EventsMaxAge != 24*time.Hour || got.Streams.AttemptsMaxAge != 168*time.Hour ||
		got.Streams.DeadLetterMaxAge != 2160*time.Hour || got.Streams.MaxConsumers != 20000 ||
		got.Streams.DuplicateWindow != 2*time.Minute || !got.AllowHTTP || !got.AllowCrossNamespaceSources ||
		got.MaxEventBytes != 262144 ||
		got.Streams.EventsMaxBytes != 1<<30 || got.Streams.AttemptsMaxBytes != 512<<20 || got.Streams.DeadLetterMaxBytes != 0 ||
		got.Streams.DeliveriesMaxBytes != 32<<20 || got.Streams.DeliveriesMaxMsgs != 5000 ||
		got.Streams.BucketMaxBytes != 1<<20 || got.Streams.BucketMaxValueSize != 128<<10 || got.Streams.ReplayKeyTTL != 24*time.Hour ||
		!slices.Equal(got.AllowedCIDRs, []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("192.168.1.10/32")}) {
		t.Errorf("opconfig parsed the chart's arguments as %+v", got)
	}

	// Credentials: the token by environment from the Secret, the files mounted.
	if e := env(c, "NATS_TOKEN"); e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
		e.ValueFrom.SecretKeyRef.Name != "webhook-operator-nats" || e.ValueFrom.SecretKeyRef.Key != "token" {
		t.Errorf("NATS_TOKEN %+v", e)
	}
	if e := env(c, "GOMAXPROCS"); e == nil || e.Value != "2" {
		t.Errorf("extraEnv GOMAXPROCS %+v", e)
	}
	var vol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "nats-credentials" {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "webhook-operator-nats" ||
		!reflect.DeepEqual(vol.Secret.Items, []corev1.KeyToPath{{Key: "creds", Path: "creds"}, {Key: "ca.crt", Path: "ca.crt"}}) {
		t.Errorf("nats-credentials volume %+v", vol)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.Name == "nats-credentials" && m.MountPath == "/etc/webhook-operator/nats" && m.ReadOnly)
	}
	if !mounted {
		t.Errorf("nats-credentials not mounted read-only at /etc/webhook-operator/nats: %+v", c.VolumeMounts)
	}

	// Scheduling and pod metadata.
	ps := d.Spec.Template.Spec
	if *d.Spec.Replicas != 2 || ps.PriorityClassName != "system-cluster-critical" ||
		ps.NodeSelector["kubernetes.io/os"] != "linux" || len(ps.Tolerations) != 1 || ps.Affinity == nil ||
		len(ps.TopologySpreadConstraints) != 1 || len(ps.ImagePullSecrets) != 1 ||
		ps.SecurityContext.FSGroup == nil || *ps.SecurityContext.FSGroup != 10001 {
		t.Errorf("pod spec does not carry the scheduling values: %+v", ps)
	}
	if d.Spec.Template.Annotations["team"] != "platform" || d.Spec.Template.Labels["cost-center"] != "cc-42" {
		t.Errorf("pod metadata %+v", d.Spec.Template.ObjectMeta)
	}
	if c.Resources.Limits.Cpu().String() != "2" || c.Resources.Requests.Memory().String() != "256Mi" {
		t.Errorf("resources %+v", c.Resources)
	}
	// replicas > 1 forces leader election on, with its Role.
	r.must(t, "Role", controllerName+"-leader-election")
	r.must(t, "RoleBinding", controllerName+"-leader-election")

	var sa corev1.ServiceAccount
	typed(t, r.must(t, "ServiceAccount", controllerName), &sa)
	if sa.Annotations["eks.amazonaws.com/role-arn"] == "" {
		t.Errorf("ServiceAccount annotations %v", sa.Annotations)
	}
	var svc corev1.Service
	typed(t, r.must(t, "Service", controllerName+"-metrics"), &svc)
	if svc.Spec.Ports[0].Port != 8443 || svc.Annotations["prometheus.io/scrape"] != "true" {
		t.Errorf("metrics Service %+v", svc)
	}

	sm := r.must(t, "ServiceMonitor", controllerName)
	if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetLabels()["release"] != "prometheus" {
		t.Errorf("ServiceMonitor %s labels %v", sm.GetAPIVersion(), sm.GetLabels())
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" || eps[0].(map[string]any)["interval"] != "15s" {
		t.Errorf("ServiceMonitor endpoints %v", eps)
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !reflect.DeepEqual(sel, svc.Labels) && !subset(sel, svc.Labels) {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service %v", sel, svc.Labels)
	}

	// The dispatchers' PodMonitor selects the pods the controller creates, in every namespace.
	pm := r.must(t, "PodMonitor", "webhook-operator-dispatchers")
	if pm.GetLabels()["release"] != "prometheus" {
		t.Errorf("PodMonitor labels %v", pm.GetLabels())
	}
	pmSel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if want := map[string]string{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue}; !reflect.DeepEqual(pmSel, want) {
		t.Errorf("PodMonitor selector %v, dispatcher pods carry %v", pmSel, want)
	}
	if any, _, _ := unstructured.NestedBool(pm.Object, "spec", "namespaceSelector", "any"); !any {
		t.Errorf("PodMonitor must select dispatchers in every namespace")
	}
	pmEps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(pmEps) != 1 || pmEps[0].(map[string]any)["port"] != "metrics" || pmEps[0].(map[string]any)["interval"] != "20s" {
		t.Errorf("PodMonitor endpoints %v", pmEps)
	}
	// The Prometheus Operator labels every target with endpoint=<port name>: only honorLabels
	// keeps the metrics' own endpoint label (the webhook endpoint) that the dashboard reads.
	if len(pmEps) == 1 && pmEps[0].(map[string]any)["honorLabels"] != true {
		t.Errorf("PodMonitor endpoint %v without honorLabels: the endpoint label would be the port's name", pmEps[0])
	}

	var np networkingv1.NetworkPolicy
	typed(t, r.must(t, "NetworkPolicy", controllerName), &np)
	if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("NetworkPolicy selects %v, the controller is %v", np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels)
	}
	var inPorts []string
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			inPorts = append(inPorts, p.Port.String())
		}
	}
	if !slices.Equal(inPorts, []string{"metrics", "probes"}) || len(np.Spec.Ingress[0].From) != 1 {
		t.Errorf("NetworkPolicy ingress %+v: want only the metrics (from monitoring) and probe ports", np.Spec.Ingress)
	}
	var outPorts []string
	for _, rule := range np.Spec.Egress {
		for _, p := range rule.Ports {
			outPorts = append(outPorts, string(*p.Protocol)+"/"+p.Port.String())
		}
		if len(rule.To) == 0 {
			t.Errorf("egress rule %+v allows any destination though peers were given", rule)
		}
	}
	if want := []string{"UDP/53", "TCP/53", "TCP/443", "TCP/4222", "TCP/7422"}; !slices.Equal(outPorts, want) {
		t.Errorf("NetworkPolicy egress ports %v, want %v (DNS, the API server, NATS)", outPorts, want)
	}
	if np.Spec.Egress[1].To[0].IPBlock == nil || np.Spec.Egress[1].To[0].IPBlock.CIDR != "172.20.0.1/32" {
		t.Errorf("API server egress %+v", np.Spec.Egress[1])
	}

	var pdb policyv1.PodDisruptionBudget
	typed(t, r.must(t, "PodDisruptionBudget", controllerName), &pdb)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PDB %+v", pdb.Spec)
	}
}

// TestTemplateVariants covers the values that change which objects and arguments exist.
func TestTemplateVariants(t *testing.T) {
	t.Run("crds disabled", func(t *testing.T) {
		r := render(t, "crds: {enabled: false}")
		if n := len(r.ofKind("CustomResourceDefinition")); n != 0 {
			t.Errorf("%d CRDs rendered with crds.enabled=false", n)
		}
	})

	t.Run("existing secret", func(t *testing.T) {
		r := render(t, "nats: {url: 'nats://nats:4222', auth: {mode: static}, existingSecret: nats-auth, existingSecretKeys: [creds]}")
		sd := stringData(t, r, "webhook-operator-nats")
		if want := map[string]string{"url": "nats://nats:4222", "credentialsSecret": "nats-auth"}; !reflect.DeepEqual(sd, want) {
			t.Errorf("Secret webhook-operator-nats %v, want %v", sd, want)
		}
		d, c := deployment(t, r)
		if !slices.Contains(c.Args, "--nats-credentials-secret="+releaseNamespace+"/nats-auth") ||
			!slices.Contains(c.Args, "--nats-creds-file=/etc/webhook-operator/nats/creds") {
			t.Errorf("args %q", c.Args)
		}
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--nats-ca-file") {
				t.Errorf("%s though existingSecretKeys has no ca.crt", a)
			}
		}
		for _, n := range []string{"NATS_USER", "NATS_PASSWORD", "NATS_TOKEN"} {
			e := env(c, n)
			if e == nil || e.ValueFrom.SecretKeyRef.Name != "nats-auth" || e.ValueFrom.SecretKeyRef.Optional == nil || !*e.ValueFrom.SecretKeyRef.Optional {
				t.Errorf("%s %+v: want an optional reference to nats-auth", n, e)
			}
		}
		var found bool
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				found = v.Secret.SecretName == "nats-auth" && reflect.DeepEqual(v.Secret.Items, []corev1.KeyToPath{{Key: "creds", Path: "creds"}})
			}
		}
		if !found {
			t.Errorf("volumes %+v: want nats-auth's creds", d.Spec.Template.Spec.Volumes)
		}
	})

	t.Run("user and password only", func(t *testing.T) {
		r := render(t, "nats: {auth: {mode: static}, credentials: {user: app, password: pw}}")
		d, c := deployment(t, r)
		if !slices.Contains(c.Args, "--nats-credentials-secret="+releaseNamespace+"/webhook-operator-nats") {
			t.Errorf("args %q", c.Args)
		}
		if e := env(c, "NATS_USER"); e == nil || e.ValueFrom.SecretKeyRef.Key != "user" {
			t.Errorf("NATS_USER %+v", e)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				t.Errorf("Secret volume %s without credential files: every key would be projected", v.Name)
			}
		}
	})

	t.Run("callout with TLS", func(t *testing.T) {
		r := render(t, "nats: {auth: {callout: {existingSecret: keys, encrypted: false, tokenAudience: nats.example.com, maxSession: 30m}}, tls: {enabled: true, existingSecret: nats-tls}}")
		if sd, want := stringData(t, r, "webhook-operator-nats"), map[string]string{"url": "nats://nats.nats.svc:4222", "auth": "kubernetes", "tlsSecret": "nats-tls",
			"tokenAudience": "nats.example.com"}; !reflect.DeepEqual(sd, want) {
			t.Errorf("Secret webhook-operator-nats %v, want %v", sd, want)
		}
		d, c := deployment(t, r)
		for _, want := range []string{
			"--nats-auth-callout", "--nats-token-audience=nats.example.com",
			// The TLS Secret is mounted and mirrored (its TLS keys only) to dispatchers.
			"--nats-credentials-secret=" + releaseNamespace + "/nats-tls",
			"--nats-ca-file=/etc/webhook-operator/nats-tls/ca.crt",
			"--nats-cert-file=/etc/webhook-operator/nats-tls/tls.crt", "--nats-key-file=/etc/webhook-operator/nats-tls/tls.key",
		} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args lack %s:\n%s", want, strings.Join(c.Args, "\n"))
			}
		}
		if e := env(c, "NATS_PASSWORD"); e == nil || e.ValueFrom.SecretKeyRef.Name != "keys" {
			t.Errorf("NATS_PASSWORD %+v", e)
		}
		vols := map[string]*corev1.SecretVolumeSource{}
		for _, v := range d.Spec.Template.Spec.Volumes {
			vols[v.Name] = v.Secret
		}
		if v := vols["nats-tls"]; v == nil || v.SecretName != "nats-tls" || len(v.Items) != 3 {
			t.Errorf("nats-tls volume %+v", v)
		}
		// The callout's own Deployment has the keys (no xkey when not encrypted).
		cd, cc := calloutDeployment(t, r)
		for _, want := range []string{"--nats-callout-issuer-seed-file=/etc/webhook-operator/callout/issuer.seed",
			"--nats-token-audience=nats.example.com", "--nats-max-session=30m", "--nats-ca-file=/etc/webhook-operator/nats-tls/ca.crt"} {
			if !slices.Contains(cc.Args, want) {
				t.Errorf("callout args lack %s:\n%s", want, strings.Join(cc.Args, "\n"))
			}
		}
		if slices.ContainsFunc(cc.Args, func(a string) bool { return strings.HasPrefix(a, "--nats-callout-xkey-seed-file") }) {
			t.Error("an xkey seed with encrypted=false")
		}
		cvols := map[string]*corev1.SecretVolumeSource{}
		for _, v := range cd.Spec.Template.Spec.Volumes {
			cvols[v.Name] = v.Secret
		}
		if v := cvols["nats-callout"]; v == nil || v.SecretName != "keys" || len(v.Items) != 1 {
			t.Errorf("the callout's nats-callout volume %+v", v)
		}
		// The flags the chart gives are the controller's.
		got := parseShared(t, c.Args[1:])
		if got.NATS.CAFile == "" || got.NATS.CertFile == "" || got.NATS.KeyFile == "" {
			t.Errorf("opconfig parsed %+v", got.NATS)
		}
	})

	t.Run("tokens without TLS or of the API audience when opted in", func(t *testing.T) {
		for values, want := range map[string][]string{
			"nats: {tls: {enabled: false}, allowPlaintextTokens: true}":       {"--nats-allow-plaintext-tokens"},
			"nats: {url: 'tls://a:4222,tls://b:4222', tls: {enabled: false}}": nil,
			"nats: {auth: {callout: {allowAPIAudienceTokens: true}}}":         {"--nats-allow-api-audience-tokens"},
		} {
			_, c := deployment(t, render(t, values))
			for _, flag := range []string{"--nats-allow-plaintext-tokens", "--nats-allow-api-audience-tokens"} {
				if slices.Contains(c.Args, flag) != slices.Contains(want, flag) {
					t.Errorf("%s: args %q; want %s only if in %q", values, c.Args, flag, want)
				}
			}
		}
	})

	t.Run("leader election off", func(t *testing.T) {
		r := render(t, "leaderElection: {enabled: false}")
		_, c := deployment(t, r)
		if !slices.Contains(c.Args, "--leader-elect=false") {
			t.Errorf("args %q", c.Args)
		}
		if r.find("Role", controllerName+"-leader-election") != nil {
			t.Error("leader-election Role rendered with leader election off")
		}
	})

	t.Run("dispatcher network policy", func(t *testing.T) {
		_, c := deployment(t, render(t, ""))
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--dispatcher-egress") }) {
			t.Errorf("egress flags by default: %q", c.Args)
		}
		_, c = deployment(t, render(t, `
dispatcher: {networkPolicy: {enabled: true}}
networkPolicy:
  dns: {to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]}
  nats: {to: [{ipBlock: {cidr: 10.1.0.0/16}}]}
  apiServer: {cidrs: [10.96.0.1/32, 192.168.0.10/32], ports: [6443]}
`))
		got := map[string]string{}
		for _, a := range c.Args {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--dispatcher-egress") {
				got[k] = v
			}
		}
		if got["--dispatcher-egress-policy"] != "true" || got["--dispatcher-egress-api-server-cidrs"] != "10.96.0.1/32,192.168.0.10/32" ||
			got["--dispatcher-egress-api-server-ports"] != "6443" {
			t.Errorf("egress flags %v", got)
		}
		for _, f := range []string{"--dispatcher-egress-dns-to", "--dispatcher-egress-nats-to"} {
			var peers []networkingv1.NetworkPolicyPeer
			dec := json.NewDecoder(strings.NewReader(got[f]))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&peers); err != nil || len(peers) != 1 {
				t.Errorf("%s=%s: %v", f, got[f], err)
			}
		}
	})

	t.Run("admission policy", func(t *testing.T) {
		for _, c := range []struct {
			values string
			extra  []string
			want   bool
		}{
			{"admissionPolicy: {enabled: false}", nil, false},
			{"admissionPolicy: {enabled: false}", []string{"--kube-version", "1.29.5"}, false},
			{"", []string{"--kube-version", "1.30.0"}, true},
			{"", []string{"--kube-version", "1.29.5", "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}, true},
		} {
			r := render(t, c.values, c.extra...)
			for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
				if got := r.find(kind, controllerName) != nil; got != c.want {
					t.Errorf("%q %q: %s rendered %v, want %v", c.values, c.extra, kind, got, c.want)
				}
			}
		}
		// Kubernetes 1.29 serves admissionregistration.k8s.io/v1 (webhooks) but not the policy
		// kind: the chart refuses to install without it rather than leave the controller unheld
		// without a word, and says how to go on.
		_, err := template(t, "", "--kube-version", "1.29.5")
		if err == nil || !strings.Contains(err.Error(), "does not serve ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "admissionPolicy.enabled=false") {
			t.Errorf("Kubernetes 1.29 with the policy enabled: %v, want a refusal naming admissionPolicy.enabled=false", err)
		}
		// Dispatchers run the controller's image unless dispatcher.image says otherwise; the
		// policy pins that one.
		for values, want := range map[string]string{
			"image: {tag: v1.2.3}": "'ghcr.io/webhook-operator/webhook-operator:v1.2.3'",
			"image: {digest: 'sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'}": "'ghcr.io/webhook-operator/webhook-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'",
			"dispatcher: {image: registry.example/dispatcher:2}":                                         "'registry.example/dispatcher:2'",
		} {
			p := render(t, values).must(t, "ValidatingAdmissionPolicy", controllerName)
			vars, _, _ := unstructured.NestedSlice(p.Object, "spec", "variables")
			if !slices.ContainsFunc(vars, func(v any) bool {
				m := v.(map[string]any)
				return m["name"] == "image" && m["expression"] == want
			}) {
				t.Errorf("%s: the policy's image is not %s: %v", values, want, vars)
			}
		}
		p := render(t, "excludedNamespaces: [kube-system, platform-system]").must(t, "ValidatingAdmissionPolicy", controllerName)
		validations, _, _ := unstructured.NestedSlice(p.Object, "spec", "validations")
		if !strings.Contains(fmt.Sprint(validations), "!(request.namespace in ['kube-system', 'platform-system', '"+releaseNamespace+"'])") {
			t.Errorf("the policy does not refuse the excluded namespaces and the release's: %v", validations)
		}
		r := render(t, "serviceAccount: {create: false, name: platform-sa}")
		p = r.must(t, "ValidatingAdmissionPolicy", controllerName)
		conds, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConditions")
		if len(conds) != 1 || !strings.Contains(fmt.Sprint(conds[0]), "'system:serviceaccount:"+releaseNamespace+":platform-sa'") {
			t.Errorf("the policy does not match the release's ServiceAccount: %v", conds)
		}
	})

	t.Run("existing service account", func(t *testing.T) {
		r := render(t, "serviceAccount: {create: false, name: platform-sa}")
		// The controller's is not rendered; the callout's and the data API server's own always are.
		if sas := r.ofKind("ServiceAccount"); len(sas) != 2 || sas[0].GetName() != apiserverName || sas[1].GetName() != calloutName {
			t.Errorf("ServiceAccounts rendered with serviceAccount.create=false: %v", sas)
		}
		d, _ := deployment(t, r)
		var crb rbacv1.ClusterRoleBinding
		typed(t, r.must(t, "ClusterRoleBinding", controllerName), &crb)
		if d.Spec.Template.Spec.ServiceAccountName != "platform-sa" || crb.Subjects[0].Name != "platform-sa" {
			t.Errorf("serviceAccountName %q, binding subject %q", d.Spec.Template.Spec.ServiceAccountName, crb.Subjects[0].Name)
		}
	})

	t.Run("image tag", func(t *testing.T) {
		_, c := deployment(t, render(t, "image: {tag: v1.2.3}"))
		if c.Image != "ghcr.io/webhook-operator/webhook-operator:v1.2.3" {
			t.Errorf("image %q", c.Image)
		}
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--dispatcher-image") }) {
			t.Error("--dispatcher-image without dispatcher.image: dispatchers must default to OPERATOR_IMAGE")
		}
	})

	t.Run("pdb max unavailable", func(t *testing.T) {
		var pdb policyv1.PodDisruptionBudget
		typed(t, render(t, "podDisruptionBudget: {enabled: true}").must(t, "PodDisruptionBudget", controllerName), &pdb)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
			t.Errorf("PDB %+v", pdb.Spec)
		}
	})

	t.Run("network policy without peers", func(t *testing.T) {
		var np networkingv1.NetworkPolicy
		typed(t, render(t, "networkPolicy: {enabled: true}").must(t, "NetworkPolicy", controllerName), &np)
		if len(np.Spec.Egress) != 3 || len(np.Spec.Ingress) != 2 {
			t.Errorf("NetworkPolicy %+v", np.Spec)
		}
	})

	for name, tc := range map[string]struct{ values, want string }{
		"existing secret and inline credentials": {
			"nats: {auth: {mode: static}, existingSecret: nats-auth, credentials: {token: t}}",
			"nats.existingSecret and nats.credentials are exclusive",
		},
		"existing secret named like the chart's": {
			"nats: {auth: {mode: static}, existingSecret: webhook-operator-nats}",
			"nats.existingSecret cannot be webhook-operator-nats",
		},
		"static credentials in callout mode": {
			"nats: {credentials: {user: app, password: pw}}",
			"nats.existingSecret and nats.credentials are for nats.auth.mode=static",
		},
		"TLS without its Secret": {
			"nats: {tls: {enabled: true, existingSecret: ''}}",
			"nats.tls.enabled needs nats.tls.existingSecret",
		},
		"tokens in clear": {
			"nats: {tls: {enabled: false}}",
			"would send every Kubernetes token to NATS in clear",
		},
		"no service account": {
			"serviceAccount: {create: false}",
			"serviceAccount.name is required when serviceAccount.create is false",
		},
		"tracing without an endpoint": {
			"tracing: {enabled: true}",
			"tracing.endpoint is required when tracing.enabled",
		},
		"tracing headers in the pod templates": {
			"tracing: {enabled: true, endpoint: 'http://c:4317', env: {OTEL_EXPORTER_OTLP_HEADERS: 'authorization=Bearer x'}}",
			"tracing.env.OTEL_EXPORTER_OTLP_HEADERS would show in every dispatcher's pod template: put it in the Secret tracing.envSecret names",
		},
		"a tracing key file in the pod templates": {
			"tracing: {enabled: true, endpoint: 'http://c:4317', env: {OTEL_EXPORTER_OTLP_CLIENT_KEY: /etc/key.pem}}",
			"tracing.env.OTEL_EXPORTER_OTLP_CLIENT_KEY would show in every dispatcher's pod template",
		},
		"autoscaling without the monitoring endpoint": {
			"dispatcher: {autoscaling: {enabled: true}}",
			"dispatcher.autoscaling.natsMonitoringEndpoint is required when dispatcher.autoscaling.enabled",
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := template(t, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestSchemaRejects checks that values.schema.json refuses wrong types with an error that
// names the value and what was expected.
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{`dispatcher: {replicas: "two"}`, "at '/dispatcher/replicas': got string, want integer"},
		{`outbound: {allowedCIDRs: "10.0.0.0/8"}`, "at '/outbound/allowedCIDRs': got string, want array"},
		{`natsUrl: nats://nats:4222`, "additional properties 'natsUrl' not allowed"},
		{`streams: {storage: disk}`, "at '/streams/storage'"},
		{`streams: {eventsMaxAge: 3 days}`, "at '/streams/eventsMaxAge'"},
		{`streams: {replicas: 7}`, "at '/streams/replicas'"},
		{`streams: {deadLetterMaxBytes: 1.5Gi}`, "at '/streams/deadLetterMaxBytes'"},
		{`streams: {names: {events: WEBHOOKS.A}}`, "at '/streams/names/events'"},
		{`outbound: {allowHTTP: "yes"}`, "at '/outbound/allowHTTP': got string, want boolean"},
		{`outbound: {allowedCIDRs: [intranet]}`, "at '/outbound/allowedCIDRs/0'"},
		{`outbound: {blockedCIDRs: [pods]}`, "at '/outbound/blockedCIDRs/0'"},
		{`nats: {existingSecretKeys: [password]}`, "at '/nats/existingSecretKeys/0'"},
		{`nats: {url: 4222}`, "at '/nats/url': got number, want string"},
		{`nats: {url: 'nats://app:s3cret@nats:4222'}`, "at '/nats/url'"},
		{`nats: {auth: {mode: open}}`, "at '/nats/auth/mode'"},
		{`nats: {auth: {callout: {maxSession: forever}}}`, "at '/nats/auth/callout/maxSession'"},
		{`nats: {tls: {enabled: "yes"}}`, "at '/nats/tls/enabled': got string, want boolean"},
		{`maxEventBytes: 10`, "at '/maxEventBytes'"},
		{`excludedNamespaces: [Kube_System]`, "at '/excludedNamespaces/0'"},
		{`dispatcher: {maxReplicas: 21}`, "at '/dispatcher/maxReplicas'"},
		{`dispatcher: {maxResources: {gpu: 1}}`, "additional properties 'gpu' not allowed"},
		{`image: {digest: latest}`, "at '/image/digest'"},
		{`logLevel: verbose`, "at '/logLevel'"},
		{`metrics: {serviceMonitor: {enabled: "true"}}`, "at '/metrics/serviceMonitor/enabled': got string, want boolean"},
		{`dispatcher: {resources: {limits: {memory: lots}}}`, "at '/dispatcher/resources/limits/memory'"},
		{`grafana: {dashboards: {enabled: "yes"}}`, "at '/grafana/dashboards/enabled': got string, want boolean"},
		{`prometheusRule: {alerts: {circuitOpen: {for: 15 minutes}}}`, "at '/prometheusRule/alerts/circuitOpen/for'"},
		{`prometheusRule: {alerts: {pendingGrowing: {threshold: lots}}}`, "at '/prometheusRule/alerts/pendingGrowing/threshold'"},
		{`prometheusRule: {alerts: {nodeDown: {enabled: true}}}`, "additional properties 'nodeDown' not allowed"},
		{`networkPolicy: {nats: {ports: ["4222"]}}`, "at '/networkPolicy/nats/ports/0'"},
		{`dispatcher: {autoscaling: {natsMonitoringEndpoint: "http://nats:8222"}}`, "at '/dispatcher/autoscaling/natsMonitoringEndpoint'"},
		{`dispatcher: {autoscaling: {maxReplicas: 0}}`, "at '/dispatcher/autoscaling/maxReplicas'"},
		{`tracing: {env: {NATS_TOKEN: x}}`, "'NATS_TOKEN' does not match pattern '^OTEL_[A-Z0-9_]+$'"},
		{`tracing: {protocol: http/json}`, "at '/tracing/protocol'"},
		{`streams: {placement: {tags: "ssd"}}`, "at '/streams/placement/tags': got string, want array"},
	} {
		t.Run(tc.values, func(t *testing.T) {
			_, err := template(t, tc.values)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not say %q:\n%v", tc.want, err)
			}
		})
	}
	// And accepts what users write: a number quantity, a numeric 0 duration, --set strings.
	if _, err := template(t, "dispatcher: {resources: {limits: {cpu: 2}}}\nstreams: {deadLetterMaxAge: 0}\nnetworkPolicy: {apiServer: {cidrs: ['2001:db8::/64']}}"); err != nil {
		t.Error(err)
	}
}

// TestGeneratedFromConfig checks that the chart's CRDs and ClusterRole rules are those of
// config/ (make manifests syncs them; this catches a chart edited by hand).
func TestGeneratedFromConfig(t *testing.T) {
	r := render(t, "crds: {keep: false}")
	for _, f := range []string{"webhook-operator.io_webhookendpoints.yaml", "webhook-operator.io_retrypolicies.yaml", "webhook-operator.io_webhookreplays.yaml"} {
		want := decodeFile(t, "config/crd/bases/"+f)[0]
		got := r.must(t, "CustomResourceDefinition", want.GetName())
		if !reflect.DeepEqual(got.Object, want.Object) {
			t.Errorf("chart CRD %s differs from config/crd/bases/%s: run `make manifests`", want.GetName(), f)
		}
	}

	var want, got rbacv1.ClusterRole
	for _, o := range decodeFile(t, "config/rbac/role.yaml") {
		if o.GetKind() == "ClusterRole" {
			typed(t, o, &want)
		}
	}
	typed(t, r.must(t, "ClusterRole", controllerName), &got)
	if len(want.Rules) == 0 || !reflect.DeepEqual(got.Rules, want.Rules) {
		t.Errorf("chart ClusterRole rules differ from config/rbac/role.yaml: run `make manifests`\n got %+v\nwant %+v", got.Rules, want.Rules)
	}

	// The Role in the controller's namespace (leases only) is the markers' namespaced Role.
	var wantRole, gotRole rbacv1.Role
	for _, o := range decodeFile(t, "config/rbac/role.yaml") {
		if o.GetKind() == "Role" {
			typed(t, o, &wantRole)
		}
	}
	typed(t, r.must(t, "Role", controllerName+"-leader-election"), &gotRole)
	if len(wantRole.Rules) == 0 || !reflect.DeepEqual(gotRole.Rules, wantRole.Rules) {
		t.Errorf("chart leader-election Role rules differ from config/rbac/role.yaml's Role: run `make manifests`\n got %+v\nwant %+v", gotRole.Rules, wantRole.Rules)
	}
	for _, rule := range got.Rules {
		if slices.Contains(rule.Resources, "leases") {
			t.Errorf("the ClusterRole grants leases cluster-wide: %+v", rule)
		}
	}

	// The tenants' ClusterRoles are config/rbac/tenant_roles.yaml's.
	for _, o := range decodeFile(t, "config/rbac/tenant_roles.yaml") {
		var want, got rbacv1.ClusterRole
		typed(t, o, &want)
		typed(t, r.must(t, "ClusterRole", want.Name), &got)
		if len(want.Rules) == 0 || !reflect.DeepEqual(got.Rules, want.Rules) {
			t.Errorf("chart ClusterRole %s differs from config/rbac/tenant_roles.yaml\n got %+v\nwant %+v", want.Name, got.Rules, want.Rules)
		}
	}

	// The admission policy is config/admission's, for the release's ServiceAccount and an image
	// of config/manager's tag.
	latest := render(t, "crds: {keep: false}\nimage: {tag: latest}")
	for _, want := range decodeFile(t, "config/admission/policy.yaml") {
		got := latest.must(t, want.GetKind(), want.GetName())
		if !reflect.DeepEqual(got.Object["spec"], want.Object["spec"]) {
			t.Errorf("chart %s differs from config/admission/policy.yaml\n got %v\nwant %v", want.GetKind(), got.Object["spec"], want.Object["spec"])
		}
	}
}

// decodeFile decodes the YAML documents of a repository file.
func decodeFile(t *testing.T, path string) rendered {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.Root(), path))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(string(b))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// subset reports whether every label of a is in b.
func subset(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestKubeVersion checks the chart's Kubernetes floor: the CRDs' CEL rules need 1.29, so an
// older cluster gets helm's clear refusal instead of CRDs the API server rejects.
func TestKubeVersion(t *testing.T) {
	_, err := template(t, "", "--kube-version", "1.28.9")
	if err == nil || !strings.Contains(err.Error(), "chart requires kubeVersion: >=1.29.0-0") {
		t.Errorf("rendered for Kubernetes 1.28: %v", err)
	}
	// 1.29 without the admission policy, which it does not serve (TestTemplateVariants).
	for _, v := range []string{"1.29.0", "1.37.2", "1.31.4-eks-1234"} {
		if _, err := template(t, "admissionPolicy: {enabled: false}", "--kube-version", v); err != nil {
			t.Errorf("refused Kubernetes %s: %v", v, err)
		}
	}
}

// TestTemplateCallout checks the auth callout's own Deployment: two replicas of `webhook-operator
// callout` as its own ServiceAccount, whose ClusterRole is config/rbac/callout.yaml's (reviews,
// and reads of what it decides on: no Secret, nothing written), the only pods that mount the
// issuer seed and hold the callout's login, a PodDisruptionBudget that keeps one serving, and a
// NetworkPolicy beside the controller's when those are on. Static mode has no callout.
func TestTemplateCallout(t *testing.T) {
	r := render(t, "networkPolicy: {enabled: true}")
	d, c := calloutDeployment(t, r)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || d.Spec.Template.Spec.ServiceAccountName != calloutName || c.Args[0] != "callout" {
		t.Errorf("callout Deployment: replicas %v, ServiceAccount %q, args %q", d.Spec.Replicas, d.Spec.Template.Spec.ServiceAccountName, c.Args)
	}
	if d.Spec.Template.Labels["app.kubernetes.io/component"] != "callout" {
		t.Errorf("callout pod labels %v", d.Spec.Template.Labels)
	}
	var want, got rbacv1.ClusterRole
	for _, o := range decodeFile(t, "config/rbac/callout.yaml") {
		if o.GetKind() == "ClusterRole" {
			typed(t, o, &want)
		}
	}
	typed(t, r.must(t, "ClusterRole", calloutName), &got)
	if len(want.Rules) == 0 || !reflect.DeepEqual(got.Rules, want.Rules) {
		t.Errorf("the callout's ClusterRole differs from config/rbac/callout.yaml\n got %+v\nwant %+v", got.Rules, want.Rules)
	}
	for _, rule := range got.Rules {
		if slices.Contains(rule.Resources, "secrets") || slices.ContainsFunc(rule.Verbs, func(v string) bool { return v != "get" && v != "list" && v != "watch" && v != "create" }) ||
			slices.Contains(rule.Verbs, "create") && !slices.Contains(rule.Resources, "tokenreviews") && !slices.Contains(rule.Resources, "subjectaccessreviews") {
			t.Errorf("the callout may do more than it needs: %+v", rule)
		}
	}
	var crb rbacv1.ClusterRoleBinding
	typed(t, r.must(t, "ClusterRoleBinding", calloutName), &crb)
	if crb.RoleRef.Name != calloutName || len(crb.Subjects) != 1 || crb.Subjects[0].Name != calloutName || crb.Subjects[0].Namespace != releaseNamespace {
		t.Errorf("callout ClusterRoleBinding %+v", crb)
	}
	vols := map[string]*corev1.SecretVolumeSource{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = v.Secret
	}
	if v := vols["nats-callout"]; v == nil || v.SecretName != "webhook-operator-nats-callout" ||
		!reflect.DeepEqual(v.Items, []corev1.KeyToPath{{Key: "issuer.seed", Path: "issuer.seed"}, {Key: "xkey.seed", Path: "xkey.seed"}}) {
		t.Errorf("the callout's keys volume %+v", v)
	}
	for n, key := range map[string]string{"NATS_CALLOUT_USER": "callout-user", "NATS_CALLOUT_PASSWORD": "callout-password"} {
		if e := env(c, n); e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != key {
			t.Errorf("%s = %+v, want key %s of the callout's Secret", n, e, key)
		}
	}
	for _, n := range []string{"NATS_USER", "NATS_PASSWORD"} {
		if env(c, n) != nil {
			t.Errorf("the callout has the JetStream admin's login %s", n)
		}
	}
	var pdb policyv1.PodDisruptionBudget
	typed(t, r.must(t, "PodDisruptionBudget", calloutName), &pdb)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("callout PodDisruptionBudget %+v", pdb.Spec)
	}
	var np networkingv1.NetworkPolicy
	typed(t, r.must(t, "NetworkPolicy", calloutName), &np)
	if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels) || len(np.Spec.Egress) != 3 {
		t.Errorf("callout NetworkPolicy %+v", np.Spec)
	}
	var cnp networkingv1.NetworkPolicy
	typed(t, r.must(t, "NetworkPolicy", controllerName), &cnp)
	if cnp.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] != "controller" {
		t.Errorf("controller NetworkPolicy selects %v", cnp.Spec.PodSelector.MatchLabels)
	}

	static := render(t, "nats: {auth: {mode: static}}")
	for _, kind := range []string{"Deployment", "ServiceAccount", "ClusterRole", "PodDisruptionBudget"} {
		for _, o := range static.ofKind(kind) {
			if o.GetName() == calloutName {
				t.Errorf("static mode renders the callout's %s", kind)
			}
		}
	}
}
