package controllers

// The controller's own permissions. It grants each dispatcher a namespaced Role that is a
// subset of these (Kubernetes forbids granting what one does not hold).
//
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookendpoints;retrypolicies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookendpoints/status;retrypolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookendpoints/finalizers,verbs=update
// WebhookReplays: run (status), and deleted once complete for longer than --replay-ttl.
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookreplays,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookreplays/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// The dispatchers' egress NetworkPolicies (--dispatcher-egress-policy).
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// Secrets: read by metadata (to notice rotations and read consent; its cache keeps no data nor
// other annotations, see secretMetadataOnly) and created (generated signing secrets, the
// mirrors of the NATS, tracing and egress proxy credentials and of the scraper CA); only the
// mirrors are ever changed or deleted by the controller. get, list and watch stay
// cluster-wide: Kubernetes RBAC cannot grant a metadata-only list, and the controller must
// hold get on each Secret it grants a dispatcher's Role (escalation prevention); the whole
// Secrets it reads are the NATS, tracing and egress proxy credentials and the scraper CA in
// its own namespace (docs/security.md).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=secrets,verbs=update;patch;delete,resourceNames=webhook-dispatcher-nats;webhook-dispatcher-otel;webhook-dispatcher-egress-proxy;webhook-dispatcher-metrics-ca
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// The streams ConfigMap of each namespace with endpoints (its finalizer removes the
// namespace's streams); namespaces (metadata) to tell a namespace's deletion from a lone
// ConfigMap's and to read a source namespace's consent (webhook-operator.io/event-readers).
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=update;patch;delete,resourceNames=webhook-operator-streams;webhook-shared-dispatcher
// The shared dispatcher (--shared-dispatcher): the controller grants it, in each namespace it
// serves, the creation of that namespace's dispatcher ServiceAccount's tokens, which it must
// hold to grant (escalation prevention); its ConfigMap lists the namespaces served.
// +kubebuilder:rbac:groups="",resources=serviceaccounts/token,verbs=create,resourceNames=webhook-dispatcher
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// Leader election: the Lease in the controller's own namespace only (a Role there, not the
// ClusterRole; the chart renders it in the release namespace).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=webhook-operator-system
// Secure metrics: the controller's own /metrics authenticates and authorizes its scrapers
// (TokenReview, SubjectAccessReview). The dispatchers' know theirs by client certificate
// (metricsca.go): the controller grants nothing cluster-wide to anyone, and may not change a
// ClusterRoleBinding.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
