package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/shared"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
)

// Ports, paths and files inside a dispatcher Pod.
const (
	metricsPort   = 8080
	probesPort    = 8081
	natsMountPath = "/etc/webhook-operator/nats"
	// EnvReplicas tells a dispatcher how many replicas share its endpoints; it divides rate
	// limits by it.
	EnvReplicas = "WEBHOOK_DISPATCHER_REPLICAS"
)

// mirror describes a Secret of the controller's namespace copied into each dispatcher
// namespace (the NATS credentials, the tracing credentials): its keys (never shown) and a
// checksum of its contents that rolls dispatchers when it changes.
type mirror struct {
	Data     map[string][]byte
	Checksum string
	// SourceVersion is the resourceVersion of the Secret it was read from.
	SourceVersion string
}

func newMirror(data map[string][]byte) *mirror {
	h := sha256.New()
	for _, k := range sortedKeys(data) {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write(data[k])
		h.Write([]byte{0})
	}
	return &mirror{Data: data, Checksum: hex.EncodeToString(h.Sum(nil))[:16]}
}

func (n *mirror) has(key string) bool {
	if n == nil {
		return false
	}
	_, ok := n.Data[key]
	return ok
}

// dispatcher is everything one dispatcher's objects are built from.
type dispatcher struct {
	Namespace string
	Name      string
	// Endpoint is the dedicated endpoint, nil for the shared dispatcher.
	Endpoint *v1alpha1.WebhookEndpoint
	// Pool is the installation's shared dispatcher (names.SharedPool, in the controller's
	// namespace): it serves the namespaces its ConfigMap lists, each with that namespace's
	// tokens, and may itself only read that ConfigMap.
	Pool bool
	// IdleAfter is the shared dispatcher's --idle-after.
	IdleAfter time.Duration
	Image     string
	Args      []string // cfg.DispatcherArgs()
	Replicas  int32
	Resources corev1.ResourceRequirements
	// Secrets are the names of the Secrets its endpoints reference and may use (they consent),
	// sorted: the only Secrets its Role lets it read.
	Secrets []string
	// NATS is the mirrored credentials, nil without --nats-credentials-secret.
	NATS *mirror
	// OTEL is the mirrored tracing credentials (OTEL_* variables and TLS files), nil without
	// --dispatcher-otel-env-secret.
	OTEL *mirror
	// EgressProxy is the mirrored username and password of the installation's egress proxy,
	// nil without --egress-proxy-credentials-secret.
	EgressProxy *mirror
	// MetricsCA is the mirrored scraper CA certificate (ca.crt) of secure metrics, nil when
	// metrics are not secure; MetricsClientName the subject its client certificates must carry.
	MetricsCA         *mirror
	MetricsClientName string
	// Auth says how the dispatcher proves who it is to NATS.
	Auth BusAuth
	// Autoscaling is the installation's, nil when off; Triggers the endpoints it scales on
	// (none: the controller sets the replicas).
	Autoscaling *Autoscaling
	Triggers    []scaleTrigger
	// ReplicaCap bounds what the autoscaler may give a dedicated dispatcher (replicaCap); 0:
	// only the installation's autoscaling maximum.
	ReplicaCap int32
	// OTELEnv are the installation's OTEL_* variables (tracing), in order.
	OTELEnv []corev1.EnvVar
}

func (d *dispatcher) endpointName() string {
	if d.Endpoint == nil {
		return ""
	}
	return d.Endpoint.Name
}

func (d *dispatcher) meta(name string) *metav1ac.ObjectMetaApplyConfiguration {
	m := metav1ac.ObjectMeta().WithName(name).WithNamespace(d.Namespace).
		WithLabels(dispatcherLabels(d.Name, d.endpointName()))
	if ep := d.Endpoint; ep != nil {
		m.WithAnnotations(map[string]string{names.AnnotationEndpoint: ep.Name}).
			WithOwnerReferences(metav1ac.OwnerReference().
				WithAPIVersion(v1alpha1.GroupVersion.String()).WithKind("WebhookEndpoint").
				WithName(ep.Name).WithUID(ep.UID).WithController(true))
	}
	return m
}

// serviceAccount is the identity of the dispatcher's Pods.
func (d *dispatcher) serviceAccount() *corev1ac.ServiceAccountApplyConfiguration {
	sa := corev1ac.ServiceAccount(d.Name, d.Namespace)
	sa.ObjectMetaApplyConfiguration = d.meta(d.Name)
	return sa
}

// role grants the least the dispatcher needs: read its namespace's endpoints and policies,
// patch endpoint status, get exactly the Secrets its endpoints reference and may use, record
// Events.
func (d *dispatcher) role() *rbacv1ac.RoleApplyConfiguration {
	r := rbacv1ac.Role(d.Name, d.Namespace)
	r.ObjectMetaApplyConfiguration = d.meta(d.Name)
	if d.Pool {
		// The list of namespaces it serves; what it may do in each is granted there
		// (tokenGrant).
		return r.WithRules(rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("configmaps").
			WithVerbs("get", "list", "watch").WithResourceNames(names.SharedPool))
	}
	r.WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups(v1alpha1.GroupVersion.Group).
			WithResources("webhookendpoints", "retrypolicies").WithVerbs("get", "list", "watch"),
		rbacv1ac.PolicyRule().WithAPIGroups(v1alpha1.GroupVersion.Group).
			WithResources("webhookendpoints/status").WithVerbs("get", "patch"),
	)
	// An empty resourceNames would grant every Secret: never write one.
	if len(d.Secrets) > 0 {
		r.WithRules(rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("secrets").
			WithVerbs("get").WithResourceNames(d.Secrets...))
	}
	r.WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("events").WithVerbs("create", "patch"),
		rbacv1ac.PolicyRule().WithAPIGroups("events.k8s.io").WithResources("events").WithVerbs("create", "patch"),
	)
	return r
}

// roleBinding binds the role to the service account.
func (d *dispatcher) roleBinding() *rbacv1ac.RoleBindingApplyConfiguration {
	rb := rbacv1ac.RoleBinding(d.Name, d.Namespace)
	rb.ObjectMetaApplyConfiguration = d.meta(d.Name)
	rb.WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(d.Name)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(d.Name).WithNamespace(d.Namespace))
	return rb
}

// mirrorSecret is the Secret name in namespace that holds mirror n.
func mirrorSecret(name, namespace string, n *mirror) *corev1ac.SecretApplyConfiguration {
	return corev1ac.Secret(name, namespace).
		WithLabels(map[string]string{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue}).
		WithAnnotations(map[string]string{names.AnnotationSourceVersion: n.SourceVersion}).
		WithType(corev1.SecretTypeOpaque).
		WithData(n.Data)
}

// tokenGrant lets the installation's shared dispatcher (ServiceAccount names.SharedPool of
// poolNamespace) create tokens of namespace's dispatcher ServiceAccount, and nothing else: the
// identity it serves the namespace with.
func tokenGrant(namespace, poolNamespace string) (*rbacv1ac.RoleApplyConfiguration, *rbacv1ac.RoleBindingApplyConfiguration) {
	d := &dispatcher{Namespace: namespace, Name: names.SharedDispatcher}
	r := rbacv1ac.Role(names.SharedPool, namespace)
	r.ObjectMetaApplyConfiguration = d.meta(names.SharedPool)
	r.WithRules(rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("serviceaccounts/token").
		WithVerbs("create").WithResourceNames(names.SharedDispatcher))
	rb := rbacv1ac.RoleBinding(names.SharedPool, namespace)
	rb.ObjectMetaApplyConfiguration = d.meta(names.SharedPool)
	rb.WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(names.SharedPool)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(names.SharedPool).WithNamespace(poolNamespace))
	return r, rb
}

// poolConfigMap lists the namespaces the shared dispatcher serves.
func (d *dispatcher) poolConfigMap(entries []shared.Entry) *corev1ac.ConfigMapApplyConfiguration {
	cm := corev1ac.ConfigMap(names.SharedPool, d.Namespace)
	cm.ObjectMetaApplyConfiguration = d.meta(names.SharedPool)
	return cm.WithData(map[string]string{shared.NamespacesKey: shared.FormatEntries(entries)})
}

// Where the shared dispatcher keeps the served namespaces' tokens.
const poolTokensDir = "/var/run/webhook-operator/tokens"

// args are the dispatcher's command line.
func (d *dispatcher) args() []string {
	args := []string{"dispatcher", "--namespace=" + d.Namespace}
	if d.Pool {
		aud := d.Auth.Audience
		if aud == "" {
			aud = natsauth.DefaultAudience
		}
		args = []string{"dispatcher", "--shared", "--namespaces-configmap=" + names.SharedPool,
			"--tokens-dir=" + poolTokensDir, "--nats-token-audience=" + aud, "--idle-after=" + d.IdleAfter.String()}
		if m := d.Resources.Limits.Memory(); m != nil && !m.IsZero() {
			// What the served namespaces hold in all: half its memory, the rest for the
			// runtime and what each namespace keeps while it is served.
			args = append(args, "--shared-memory-budget="+strconv.FormatInt(m.Value()/2, 10))
		}
	}
	if d.Endpoint != nil {
		args = append(args, "--endpoint="+d.Endpoint.Name)
	}
	args = append(args,
		"--metrics-bind-address=:"+strconv.Itoa(metricsPort),
		"--health-probe-bind-address=:"+strconv.Itoa(probesPort))
	args = append(args, d.Args...)
	if d.NATS.has("creds") {
		args = append(args, "--nats-creds-file="+natsMountPath+"/creds")
	}
	if d.NATS.has("ca.crt") {
		args = append(args, "--nats-ca-file="+natsMountPath+"/ca.crt")
	}
	if d.NATS.has("tls.crt") && d.NATS.has("tls.key") {
		args = append(args, "--nats-cert-file="+natsMountPath+"/tls.crt", "--nats-key-file="+natsMountPath+"/tls.key")
	}
	if d.EgressProxy != nil {
		args = append(args, "--egress-proxy-credentials-dir="+egressProxyMountPath)
	}
	if d.MetricsCA != nil {
		args = append(args, "--metrics-client-ca-file="+metricsCAMountPath+"/"+metricsCAKey)
		if d.MetricsClientName != "" {
			args = append(args, "--metrics-client-name="+d.MetricsClientName)
		}
	}
	if d.Pool {
		return args
	}
	return append(args, d.Auth.tokenArgs()...)
}

// natsFiles are the keys of the mirrored Secret mounted as files.
var natsFiles = []string{"creds", "ca.crt", "tls.crt", "tls.key"}

// env are the dispatcher's environment variables: its identity (downward API), the replica
// count (the configured one, the minimum when autoscaled: it must not change with the
// autoscaler's count, or every scale would roll the Pods), the NATS secrets it must not
// take as arguments, and the installation's OTEL_* settings (traces).
func (d *dispatcher) env() []*corev1ac.EnvVarApplyConfiguration {
	field := func(name, path string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath(path)))
	}
	env := []*corev1ac.EnvVarApplyConfiguration{
		field("POD_NAME", "metadata.name"),
		field("POD_NAMESPACE", "metadata.namespace"),
		corev1ac.EnvVar().WithName(EnvReplicas).WithValue(strconv.Itoa(int(d.Replicas))),
	}
	for _, kv := range [][2]string{{"NATS_USER", "user"}, {"NATS_PASSWORD", "password"}, {"NATS_TOKEN", "token"}} {
		if d.NATS.has(kv[1]) {
			env = append(env, corev1ac.EnvVar().WithName(kv[0]).WithValueFrom(corev1ac.EnvVarSource().
				WithSecretKeyRef(corev1ac.SecretKeySelector().WithName(names.NATSSecret).WithKey(kv[1]))))
		}
	}
	for _, e := range d.OTELEnv {
		if !d.OTEL.has(e.Name) { // the Secret's value wins
			env = append(env, corev1ac.EnvVar().WithName(e.Name).WithValue(e.Value))
		}
	}
	return append(env, d.otelSecretEnv()...)
}

// Where the tracing credentials' files are mounted, and the variables that name them.
const otelMountPath = "/etc/webhook-operator/otel"

var otelFiles = []struct{ key, env string }{
	{"ca.crt", "OTEL_EXPORTER_OTLP_CERTIFICATE"},
	{"tls.crt", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"},
	{"tls.key", "OTEL_EXPORTER_OTLP_CLIENT_KEY"},
}

// otelSecretEnv are the variables of the mirrored tracing credentials: each OTEL_* key of the
// Secret by reference (its value never in the pod template), and the paths of its files.
func (d *dispatcher) otelSecretEnv() []*corev1ac.EnvVarApplyConfiguration {
	if d.OTEL == nil {
		return nil
	}
	var env []*corev1ac.EnvVarApplyConfiguration
	for _, k := range sortedKeys(d.OTEL.Data) {
		if IsOTELEnvName(k) {
			env = append(env, corev1ac.EnvVar().WithName(k).WithValueFrom(corev1ac.EnvVarSource().
				WithSecretKeyRef(corev1ac.SecretKeySelector().WithName(names.OTELSecret).WithKey(k))))
		}
	}
	for _, f := range otelFiles {
		if d.OTEL.has(f.key) && !d.OTEL.has(f.env) {
			env = append(env, corev1ac.EnvVar().WithName(f.env).WithValue(otelMountPath+"/"+f.key))
		}
	}
	return env
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// deployment runs the dispatcher. Its pod template holds only what the Pods need (image,
// arguments, environment, credentials checksum), so it changes, and the Pods roll, only when
// one of those does: adding an endpoint or rotating an endpoint's Secret does not.
func (d *dispatcher) deployment() *appsv1ac.DeploymentApplyConfiguration {
	probe := func(path string) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).
			WithPort(intstr.FromString("probes"))).WithPeriodSeconds(10)
	}
	container := corev1ac.Container().
		WithName("dispatcher").
		WithImage(d.Image).
		WithArgs(d.args()...).
		WithEnv(d.env()...).
		WithPorts(
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(metricsPort).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("probes").WithContainerPort(probesPort).WithProtocol(corev1.ProtocolTCP),
		).
		WithLivenessProbe(probe("/healthz")).
		WithReadinessProbe(probe("/readyz").WithFailureThreshold(3)).
		WithResources(resources(d.Resources)).
		WithSecurityContext(corev1ac.SecurityContext().
			WithRunAsNonRoot(true).
			WithReadOnlyRootFilesystem(true).
			WithAllowPrivilegeEscalation(false).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL")).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)))

	pod := corev1ac.PodSpec().
		WithServiceAccountName(d.Name).
		WithSecurityContext(corev1ac.PodSecurityContext().
			WithRunAsNonRoot(true).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)))

	if slices.ContainsFunc(natsFiles, d.NATS.has) {
		vol := corev1ac.SecretVolumeSource().WithSecretName(names.NATSSecret)
		for _, k := range natsFiles {
			if d.NATS.has(k) {
				vol.WithItems(corev1ac.KeyToPath().WithKey(k).WithPath(k))
			}
		}
		pod.WithVolumes(corev1ac.Volume().WithName("nats").WithSecret(vol))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName("nats").WithMountPath(natsMountPath).WithReadOnly(true))
	}
	if slices.ContainsFunc(otelFiles, func(f struct{ key, env string }) bool { return d.OTEL.has(f.key) }) {
		vol := corev1ac.SecretVolumeSource().WithSecretName(names.OTELSecret)
		for _, f := range otelFiles {
			if d.OTEL.has(f.key) {
				vol.WithItems(corev1ac.KeyToPath().WithKey(f.key).WithPath(f.key))
			}
		}
		pod.WithVolumes(corev1ac.Volume().WithName("otel").WithSecret(vol))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName("otel").WithMountPath(otelMountPath).WithReadOnly(true))
	}
	if d.EgressProxy != nil {
		// Files, not variables: the kubelet renews them when the Secret changes, and the
		// dispatcher reads them at every new tunnel, so a rotation needs no restart.
		vol := corev1ac.SecretVolumeSource().WithSecretName(names.EgressProxySecret)
		for _, k := range egressProxyKeys {
			if d.EgressProxy.has(k) {
				vol.WithItems(corev1ac.KeyToPath().WithKey(k).WithPath(k))
			}
		}
		pod.WithVolumes(corev1ac.Volume().WithName("egress-proxy").WithSecret(vol))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName("egress-proxy").WithMountPath(egressProxyMountPath).WithReadOnly(true))
	}
	if d.MetricsCA != nil {
		// A file, read again by the dispatcher when the kubelet renews it: a CA rotation
		// needs no restart.
		pod.WithVolumes(corev1ac.Volume().WithName("metrics-ca").WithSecret(corev1ac.SecretVolumeSource().
			WithSecretName(names.MetricsCASecret).WithItems(corev1ac.KeyToPath().WithKey(metricsCAKey).WithPath(metricsCAKey))))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName("metrics-ca").WithMountPath(metricsCAMountPath).WithReadOnly(true))
	}
	if d.Pool {
		// Tokens in memory only, bounded: two of a few KiB a namespace.
		pod.WithVolumes(corev1ac.Volume().WithName("tokens").WithEmptyDir(corev1ac.EmptyDirVolumeSource().
			WithMedium(corev1.StorageMediumMemory).WithSizeLimit(resource.MustParse("64Mi"))))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName("tokens").WithMountPath(poolTokensDir))
	} else if d.Auth.Callout {
		pod.WithVolumes(d.Auth.tokenVolume())
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName("nats-token").WithMountPath(natsTokenDir).WithReadOnly(true))
	}
	pod.WithContainers(container)

	// Spread over nodes whenever there may be several replicas (fixed per installation, so
	// that an endpoint starting or stopping to be autoscaled does not roll the Pods).
	if d.Replicas > 1 || d.Autoscaling != nil {
		pod.WithTopologySpreadConstraints(corev1ac.TopologySpreadConstraint().
			WithMaxSkew(1).
			WithTopologyKey(corev1.LabelHostname).
			WithWhenUnsatisfiable(corev1.ScheduleAnyway).
			WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(d.Name))))
	}

	template := corev1ac.PodTemplateSpec().
		WithLabels(dispatcherLabels(d.Name, d.endpointName())).
		WithAnnotations(map[string]string{names.AnnotationSharedLane: names.AnnotationSharedLaneValue}).
		WithSpec(pod)
	if d.NATS != nil {
		template.WithAnnotations(map[string]string{names.AnnotationNATSChecksum: d.NATS.Checksum})
	}
	if d.OTEL != nil {
		template.WithAnnotations(map[string]string{names.AnnotationOTELChecksum: d.OTEL.Checksum})
	}

	spec := appsv1ac.DeploymentSpec().
		WithRevisionHistoryLimit(3).
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(d.Name))).
		WithTemplate(template)
	// An autoscaled dispatcher's replicas are the autoscaler's: never set them.
	if !d.autoscaled() {
		spec.WithReplicas(d.Replicas)
	}
	dep := appsv1ac.Deployment(d.Name, d.Namespace)
	dep.ObjectMetaApplyConfiguration = d.meta(d.Name)
	return dep.WithSpec(spec)
}

func resources(r corev1.ResourceRequirements) *corev1ac.ResourceRequirementsApplyConfiguration {
	ac := corev1ac.ResourceRequirements()
	if len(r.Requests) > 0 {
		ac.WithRequests(r.Requests)
	}
	if len(r.Limits) > 0 {
		ac.WithLimits(r.Limits)
	}
	return ac
}

// objectKey is a namespaced name as a map key.
func objectKey(kind, namespace, name string) string {
	return kind + "/" + types.NamespacedName{Namespace: namespace, Name: name}.String()
}
