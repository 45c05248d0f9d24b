{{/* Names, labels and the values every template shares. */}}

{{- define "webhook-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "webhook-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The controller's Deployment, Service, roles and the rest: <fullname>-controller. */}}
{{- define "webhook-operator.controllerName" -}}
{{- printf "%s-controller" (include "webhook-operator.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{- define "webhook-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "webhook-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: webhook-operator
{{- end }}

{{- define "webhook-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "webhook-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "webhook-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "webhook-operator.controllerName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository:tag, or repository@digest when a digest is given. */}}
{{- define "webhook-operator.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- end }}

{{/*
The Secret the chart always creates: the plugin (`kubectl webhooks`) reads the NATS URL from it,
and with inline credentials it holds them too. Its name is fixed so the plugin finds it.
*/}}
{{- define "webhook-operator.natsSecretName" -}}
webhook-operator-nats
{{- end }}

{{/* true when any inline NATS credential is set. */}}
{{- define "webhook-operator.inlineCredentials" -}}
{{- $c := .Values.nats.credentials }}
{{- if or $c.creds $c.user $c.password $c.token $c.caCrt }}true{{ end }}
{{- end }}

{{/* true in auth-callout mode (nats.auth.mode=callout). */}}
{{- define "webhook-operator.callout" -}}
{{- if eq (.Values.nats.auth.mode | default "callout") "callout" }}true{{ end }}
{{- end }}

{{/* The TLS Secret (ca.crt, tls.crt, tls.key) when nats.tls is enabled (callout mode), else nothing. */}}
{{- define "webhook-operator.natsTLSSecret" -}}
{{- if and .Values.nats.tls.enabled (include "webhook-operator.callout" .) }}
{{- required "nats.tls.enabled needs nats.tls.existingSecret: a Secret with ca.crt, tls.crt and tls.key" .Values.nats.tls.existingSecret }}
{{- end }}
{{- end }}

{{/* The image dispatchers run: dispatcher.image, else the controller's own. */}}
{{- define "webhook-operator.dispatcherImage" -}}
{{- .Values.dispatcher.image | default (include "webhook-operator.image" .) }}
{{- end }}

{{/*
"true" where the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy:
the kind in the cluster's discovery (helm install, upgrade), or the group version on
Kubernetes 1.30+ (helm template, whose capabilities list no kinds).
*/}}
{{- define "webhook-operator.admissionPolicyServed" -}}
{{- if or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
      (and (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1") (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version)) }}true{{ end }}
{{- end }}

{{/*
Callout mode sends Kubernetes tokens to NATS: refused without TLS (the TLS Secret, or tls://
URLs only) unless nats.allowPlaintextTokens says otherwise, which becomes the flag.
*/}}
{{- define "webhook-operator.plaintextTokens" -}}
{{- if include "webhook-operator.callout" . }}
{{- $tlsURLs := true }}
{{- range splitList "," .Values.nats.url }}
{{- if not (hasPrefix "tls://" (trim .)) }}{{ $tlsURLs = false }}{{ end }}
{{- end }}
{{- if .Values.nats.allowPlaintextTokens }}true
{{- else if not (or .Values.nats.tls.enabled $tlsURLs) }}
{{- fail "nats.tls.enabled=false with a nats:// URL would send every Kubernetes token to NATS in clear: enable nats.tls (a Secret with ca.crt, tls.crt and tls.key), use tls:// URLs, or set nats.allowPlaintextTokens=true for a loopback demo" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where the callout's keys are mounted in the callout's pods, and the TLS files in every pod. */}}
{{- define "webhook-operator.calloutMountPath" -}}
/etc/webhook-operator/callout
{{- end }}
{{- define "webhook-operator.tlsMountPath" -}}
/etc/webhook-operator/nats-tls
{{- end }}

{{/*
The Secret the controller mirrors into every dispatcher namespace, or nothing. In callout mode
it is the TLS Secret, of which only ca.crt, tls.crt and tls.key are copied; in static mode the
credentials Secret.
*/}}
{{- define "webhook-operator.natsCredentialsSecret" -}}
{{- if include "webhook-operator.callout" . }}
{{- if or .Values.nats.existingSecret (include "webhook-operator.inlineCredentials" .) }}
{{- fail "nats.existingSecret and nats.credentials are for nats.auth.mode=static: in callout mode nothing shared reaches the dispatchers (TLS material goes in nats.tls.existingSecret)" }}
{{- end }}
{{- include "webhook-operator.natsTLSSecret" . }}
{{- else }}
{{- include "webhook-operator.staticCredentialsSecret" . }}
{{- end }}
{{- end }}

{{/* The Secret holding the static NATS credentials, or nothing when there are none. */}}
{{- define "webhook-operator.staticCredentialsSecret" -}}
{{- if and .Values.nats.existingSecret (include "webhook-operator.inlineCredentials" .) }}
{{- fail "nats.existingSecret and nats.credentials are exclusive: give the credentials in one place" }}
{{- end }}
{{- if eq .Values.nats.existingSecret (include "webhook-operator.natsSecretName" .) }}
{{- fail (printf "nats.existingSecret cannot be %s: the chart creates that Secret; name yours differently" .Values.nats.existingSecret) }}
{{- end }}
{{- if .Values.nats.existingSecret }}
{{- .Values.nats.existingSecret }}
{{- else if include "webhook-operator.inlineCredentials" . }}
{{- include "webhook-operator.natsSecretName" . }}
{{- end }}
{{- end }}

{{/* true when the credentials Secret holds key $key ("creds" or "ca.crt"). */}}
{{- define "webhook-operator.natsHasFile" -}}
{{- $root := index . 0 }}{{- $key := index . 1 }}
{{- if include "webhook-operator.callout" $root }}
{{- else if $root.Values.nats.existingSecret }}
{{- if has $key $root.Values.nats.existingSecretKeys }}true{{ end }}
{{- else if eq $key "creds" }}
{{- if $root.Values.nats.credentials.creds }}true{{ end }}
{{- else if eq $key "ca.crt" }}
{{- if $root.Values.nats.credentials.caCrt }}true{{ end }}
{{- end }}
{{- end }}

{{/* The secret volume's items: the credential files to mount, or nothing. */}}
{{- define "webhook-operator.natsFileItems" -}}
{{- if include "webhook-operator.natsHasFile" (list . "creds") }}
- key: creds
  path: creds
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "ca.crt") }}
- key: ca.crt
  path: ca.crt
{{- end }}
{{- end }}

{{- define "webhook-operator.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ end }}
{{- end }}

{{/* Where the NATS credential files are mounted in the controller. */}}
{{- define "webhook-operator.natsMountPath" -}}
/etc/webhook-operator/nats
{{- end }}

{{/* A resource quantity as a string: 1, "500m", 0.5 or "64Mi"; whole numbers never in e-notation. */}}
{{- define "webhook-operator.quantity" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* The controller's arguments, from the values, as a YAML list. */}}
{{- define "webhook-operator.args" -}}
{{- $v := .Values }}
{{- $args := list "controller" (printf "--nats-url=%s" (required "nats.url is required" $v.nats.url)) }}
{{- with include "webhook-operator.natsCredentialsSecret" . }}
{{- $args = append $args (printf "--nats-credentials-secret=%s/%s" $.Release.Namespace .) }}
{{- end }}
{{- if include "webhook-operator.callout" . }}
{{- $c := $v.nats.auth.callout }}
{{- /* The bus's mode and the dispatchers' tokens; the callout itself is served by its own Deployment (callout.yaml). */}}
{{- $args = concat $args (list "--nats-auth-callout" (printf "--nats-token-audience=%s" $c.tokenAudience)) }}
{{- $args = append $args (printf "--nats-token-expiration-seconds=%d" (int64 $c.tokenExpirationSeconds)) }}
{{- if $c.allowAPIAudienceTokens }}
{{- $args = append $args "--nats-allow-api-audience-tokens" }}
{{- end }}
{{- if include "webhook-operator.plaintextTokens" . }}
{{- $args = append $args "--nats-allow-plaintext-tokens" }}
{{- end }}
{{- end }}
{{- if include "webhook-operator.natsTLSSecret" . }}
{{- $dir := include "webhook-operator.tlsMountPath" . }}
{{- $args = concat $args (list (printf "--nats-ca-file=%s/ca.crt" $dir) (printf "--nats-cert-file=%s/tls.crt" $dir) (printf "--nats-key-file=%s/tls.key" $dir)) }}
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "creds") }}
{{- $args = append $args (printf "--nats-creds-file=%s/creds" (include "webhook-operator.natsMountPath" .)) }}
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "ca.crt") }}
{{- $args = append $args (printf "--nats-ca-file=%s/ca.crt" (include "webhook-operator.natsMountPath" .)) }}
{{- end }}
{{- with $v.streams }}
{{- $args = concat $args (list
      (printf "--events-stream=%s" .names.events)
      (printf "--events-subject-prefix=%s" .eventsSubjectPrefix)
      (printf "--deliveries-stream=%s" .names.deliveries)
      (printf "--attempts-stream=%s" .names.attempts)
      (printf "--dead-letter-stream=%s" .names.deadLetter)
      (printf "--kv-bucket=%s" .names.bucket)
      (printf "--internal-subject-prefix=%s" .internalSubjectPrefix)
      (printf "--stream-replicas=%d" (int64 .replicas))
      (printf "--stream-storage=%s" .storage)
      (printf "--events-max-age=%s" (toString .eventsMaxAge))
      (printf "--attempts-max-age=%s" (toString .attemptsMaxAge))
      (printf "--dead-letter-max-age=%s" (toString .deadLetterMaxAge))
      (printf "--max-consumers=%d" (int64 .maxConsumers))
      (printf "--duplicate-window=%s" (toString .duplicateWindow))
      (printf "--events-max-bytes=%s" (include "webhook-operator.quantity" .eventsMaxBytes))
      (printf "--deliveries-max-bytes=%s" (include "webhook-operator.quantity" .deliveriesMaxBytes))
      (printf "--deliveries-max-msgs=%d" (int64 .deliveriesMaxMsgs))
      (printf "--attempts-max-bytes=%s" (include "webhook-operator.quantity" .attemptsMaxBytes))
      (printf "--dead-letter-max-bytes=%s" (include "webhook-operator.quantity" .deadLetterMaxBytes))
      (printf "--kv-max-bytes=%s" (include "webhook-operator.quantity" .bucketMaxBytes))
      (printf "--kv-max-value-size=%s" (include "webhook-operator.quantity" .bucketMaxValueSize))
      (printf "--replay-key-ttl=%s" (toString .replayKeyTTL))) }}
{{- with .placement }}
{{- if .cluster }}
{{- $args = append $args (printf "--stream-placement-cluster=%s" .cluster) }}
{{- end }}
{{- if .tags }}
{{- $args = append $args (printf "--stream-placement-tags=%s" (join "," .tags)) }}
{{- end }}
{{- end }}
{{- end }}
{{- with $v.outbound }}
{{- $args = append $args (printf "--allow-http=%t" .allowHTTP) }}
{{- if .allowedCIDRs }}
{{- $args = append $args (printf "--allowed-cidrs=%s" (join "," .allowedCIDRs)) }}
{{- end }}
{{- if .blockedCIDRs }}
{{- $args = append $args (printf "--blocked-cidrs=%s" (join "," .blockedCIDRs)) }}
{{- end }}
{{- $args = append $args (printf "--allow-cross-namespace-sources=%t" .allowCrossNamespaceSources) }}
{{- with .egressProxy }}
{{- if .url }}
{{- $args = append $args (printf "--egress-proxy=%s" .url) }}
{{- with .credentialsSecret }}
{{- $args = append $args (printf "--egress-proxy-credentials-secret=%s" .) }}
{{- end }}
{{- else if .credentialsSecret }}
{{- fail "outbound.egressProxy.credentialsSecret needs outbound.egressProxy.url: the proxy they open" }}
{{- end }}
{{- end }}
{{- end }}
{{- $args = append $args (printf "--max-event-bytes=%d" (int64 $v.maxEventBytes)) }}
{{- $args = append $args (printf "--max-endpoints-per-namespace=%d" (int64 $v.maxEndpointsPerNamespace)) }}
{{- $args = append $args (printf "--excluded-namespaces=%s" (join "," $v.excludedNamespaces)) }}
{{- with $v.dispatcher }}
{{- if .image }}
{{- $args = append $args (printf "--dispatcher-image=%s" .image) }}
{{- end }}
{{- $args = append $args (printf "--dispatcher-replicas=%d" (int64 .replicas)) }}
{{- if .shared }}
{{- $args = append $args "--shared-dispatcher" }}
{{- $args = append $args (printf "--shared-dispatcher-idle-after=%s" (.sharedIdleAfter | default "1m")) }}
{{- end }}
{{- $req := (.resources | default dict).requests | default dict }}
{{- $lim := (.resources | default dict).limits | default dict }}
{{- /* Each always passed, empty for none: the controller's defaults are not the chart's. */}}
{{- $args = append $args (printf "--dispatcher-cpu-request=%s" (include "webhook-operator.quantity" ($req.cpu | default ""))) }}
{{- $args = append $args (printf "--dispatcher-memory-request=%s" (include "webhook-operator.quantity" ($req.memory | default ""))) }}
{{- $args = append $args (printf "--dispatcher-cpu-limit=%s" (include "webhook-operator.quantity" ($lim.cpu | default ""))) }}
{{- $args = append $args (printf "--dispatcher-memory-limit=%s" (include "webhook-operator.quantity" ($lim.memory | default ""))) }}
{{- $max := .maxResources | default dict }}
{{- $args = concat $args (list (printf "--dispatcher-max-replicas=%d" (int64 .maxReplicas))
      (printf "--dispatcher-max-cpu=%s" (include "webhook-operator.quantity" ($max.cpu | default "")))
      (printf "--dispatcher-max-memory=%s" (include "webhook-operator.quantity" ($max.memory | default "")))) }}
{{- with .autoscaling }}
{{- if .enabled }}
{{- $args = concat $args (list "--autoscaling=true"
      (printf "--autoscaling-nats-monitoring-endpoint=%s" (required "dispatcher.autoscaling.natsMonitoringEndpoint is required when dispatcher.autoscaling.enabled: host:port of a NATS server's monitoring port, e.g. nats.nats.svc:8222" .natsMonitoringEndpoint))
      (printf "--autoscaling-nats-monitoring-https=%t" .natsMonitoringHTTPS)
      (printf "--autoscaling-nats-account=%s" (.natsAccount | default (ternary "WEBHOOKS" "$G" (eq (include "webhook-operator.callout" $) "true"))))
      (printf "--autoscaling-max-replicas=%d" (int64 .maxReplicas))
      (printf "--autoscaling-lag-threshold=%d" (int64 .lagThreshold))
      (printf "--autoscaling-polling-interval=%s" (toString .pollingInterval))) }}
{{- end }}
{{- end }}
{{- if (.networkPolicy | default dict).enabled }}
{{- $np := $v.networkPolicy }}
{{- $args = append $args "--dispatcher-egress-policy=true" }}
{{- with $np.dns.to }}{{ $args = append $args (printf "--dispatcher-egress-dns-to=%s" (toJson .)) }}{{ end }}
{{- with $np.nats.to }}{{ $args = append $args (printf "--dispatcher-egress-nats-to=%s" (toJson .)) }}{{ end }}
{{- with $np.apiServer.cidrs }}{{ $args = append $args (printf "--dispatcher-egress-api-server-cidrs=%s" (join "," .)) }}{{ end }}
{{- $args = append $args (printf "--dispatcher-egress-api-server-ports=%s" (join "," $np.apiServer.ports)) }}
{{- end }}
{{- end }}
{{- with $v.tracing }}
{{- if .enabled }}
{{- $otel := dict "OTEL_TRACES_EXPORTER" "otlp"
      "OTEL_EXPORTER_OTLP_ENDPOINT" (required "tracing.endpoint is required when tracing.enabled: the OTLP endpoint of a collector, e.g. http://otel-collector.observability:4317" .endpoint)
      "OTEL_EXPORTER_OTLP_PROTOCOL" .protocol
      "OTEL_SERVICE_NAME" .serviceName }}
{{- if .sampler }}{{ $_ := set $otel "OTEL_TRACES_SAMPLER" .sampler }}{{ end }}
{{- if .samplerArg }}{{ $_ := set $otel "OTEL_TRACES_SAMPLER_ARG" (toString .samplerArg) }}{{ end }}
{{- range $k, $val := .env }}
{{- if regexMatch "_(HEADERS|CERTIFICATE|CLIENT_KEY)$" $k }}
{{- fail (printf "tracing.env.%s would show in every dispatcher's pod template: put it in the Secret tracing.envSecret names (OTEL_* keys are set by reference, ca.crt, tls.crt and tls.key are mounted)" $k) }}
{{- end }}
{{- $_ := set $otel $k (toString $val) }}
{{- end }}
{{- range $k := keys $otel | sortAlpha }}
{{- $args = append $args (printf "--dispatcher-otel-env=%s=%s" $k (get $otel $k)) }}
{{- end }}
{{- with .envSecret }}
{{- $args = append $args (printf "--dispatcher-otel-env-secret=%s" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if include "webhook-operator.leaderElection" . }}
{{- $args = concat $args (list "--leader-elect=true" (printf "--leader-election-namespace=%s" .Release.Namespace)) }}
{{- else }}
{{- $args = append $args "--leader-elect=false" }}
{{- end }}
{{- if $v.metrics.secure }}
{{- $args = append $args (printf "--dispatcher-metrics-ca-secret=%s" (include "webhook-operator.scraperTLSSecret" .)) }}
{{- with $v.metrics.scraper.tls.commonName }}
{{- $args = append $args (printf "--dispatcher-metrics-client-name=%s" .) }}
{{- end }}
{{- end }}
{{- $args = concat $args (list
      (printf "--metrics-secure=%t" $v.metrics.secure)
      (printf "--metrics-bind-address=:%d" (int64 $v.metrics.port))
      (printf "--health-probe-bind-address=:%d" (int64 $v.healthProbe.port))
      (printf "--max-concurrent-reconciles=%d" (int64 $v.maxConcurrentReconciles))
      (printf "--replay-ttl=%s" (toString $v.replayTTL))
      (printf "--max-erasures=%d" (int64 $v.erasures.maxRunning))
      (printf "--max-erasures-per-namespace=%d" (int64 $v.erasures.maxRunningPerNamespace))) }}
{{- if $v.logLevel }}
{{- $args = append $args (printf "--zap-log-level=%s" (toString $v.logLevel)) }}
{{- end }}
{{- $args = concat $args $v.extraArgs }}
{{- toYaml $args }}
{{- end }}

{{/* The Secret (key token) the ServiceMonitor presents to the controller with secure metrics. */}}
{{- define "webhook-operator.scraperSecret" -}}
{{- if .Values.metrics.scraper.create }}
{{- printf "%s-metrics-scraper" (include "webhook-operator.fullname" . | trunc 46 | trimSuffix "-") }}
{{- else }}
{{- required "metrics.scraper.existingSecret is required when metrics.secure is true and metrics.scraper.create is false" .Values.metrics.scraper.existingSecret }}
{{- end }}
{{- end }}

{{/*
The Secret of the release namespace (ca.crt, tls.crt, tls.key) with the scraper CA and the
client certificate the dispatchers' secure metrics accept: the chart's, or metrics.scraper.tls.existingSecret.
*/}}
{{- define "webhook-operator.scraperTLSSecret" -}}
{{- with .Values.metrics.scraper.tls.existingSecret }}
{{- . }}
{{- else }}
{{- printf "%s-metrics-scraper-tls" (include "webhook-operator.fullname" . | trunc 42 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* How the dispatchers' PodMonitor reaches /metrics: HTTPS with the scraper's client certificate, or HTTP. */}}
{{- define "webhook-operator.dispatcherScrapeSettings" -}}
{{- if .Values.metrics.secure }}
{{- $secret := include "webhook-operator.scraperTLSSecret" . }}
scheme: https
tlsConfig:
  {{- with .Values.metrics.tlsConfig }}
  {{- toYaml (omit . "cert" "keySecret") | nindent 2 }}
  {{- end }}
  cert:
    secret:
      name: {{ $secret }}
      key: tls.crt
  keySecret:
    name: {{ $secret }}
    key: tls.key
{{- else }}
scheme: http
{{- end }}
{{- end }}

{{/* How the controller's ServiceMonitor reaches /metrics: HTTPS with a bearer token, or HTTP. */}}
{{- define "webhook-operator.scrapeSettings" -}}
{{- if .Values.metrics.secure }}
scheme: https
authorization:
  type: Bearer
  credentials:
    name: {{ include "webhook-operator.scraperSecret" . }}
    key: token
{{- with .Values.metrics.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- else }}
scheme: http
{{- end }}
{{- end }}

{{/*
The namespaces the controller never acts in: excludedNamespaces and the release namespace, as
JSON {"list": [...], "cel": "'a', 'b'", "text": "a, b"}, for the admission policy and the
controller's --excluded-namespaces (to which the controller adds its own namespace itself).
*/}}
{{- define "webhook-operator.excludedNamespaces" -}}
{{- $list := list }}
{{- range .Values.excludedNamespaces }}{{ $list = append $list (toString .) }}{{ end }}
{{- if not (has .Release.Namespace $list) }}{{ $list = append $list .Release.Namespace }}{{ end }}
{{- $quoted := list }}
{{- range $list }}{{ $quoted = append $quoted (printf "'%s'" .) }}{{ end }}
{{- dict "list" $list "cel" (join ", " $quoted) "text" (join ", " $list) | toJson }}
{{- end }}

{{/* The ingress's Deployment, Service, ServiceAccount and roles: <fullname>-ingress. */}}
{{- define "webhook-operator.ingressName" -}}
{{- printf "%s-ingress" (include "webhook-operator.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "webhook-operator.ingressSelectorLabels" -}}
app.kubernetes.io/name: {{ include "webhook-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ingress
{{- end }}

{{- define "webhook-operator.ingressLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "webhook-operator.ingressSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: webhook-operator
{{- end }}

{{/* The URL the ingress is reached at inside the cluster (the plugin reads it from the NATS Secret). */}}
{{- define "webhook-operator.ingressURL" -}}
{{- $v := .Values.ingress }}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" (not (empty $v.tls.existingSecret))) (include "webhook-operator.ingressName" .) .Release.Namespace (int64 $v.service.port) }}
{{- end }}

{{/* The ingress's arguments, as a YAML list. */}}
{{- define "webhook-operator.ingressArgs" -}}
{{- $v := .Values }}
{{- $i := $v.ingress }}
{{- $args := list "ingress" (printf "--nats-url=%s" (required "nats.url is required" $v.nats.url)) }}
{{- if include "webhook-operator.callout" . }}
{{- $args = append $args "--nats-token-file=/var/run/secrets/nats.webhook-operator.io/token" }}
{{- end }}
{{- if include "webhook-operator.natsTLSSecret" . }}
{{- $dir := include "webhook-operator.tlsMountPath" . }}
{{- $args = concat $args (list (printf "--nats-ca-file=%s/ca.crt" $dir) (printf "--nats-cert-file=%s/tls.crt" $dir) (printf "--nats-key-file=%s/tls.key" $dir)) }}
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "creds") }}
{{- $args = append $args (printf "--nats-creds-file=%s/creds" (include "webhook-operator.natsMountPath" .)) }}
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "ca.crt") }}
{{- $args = append $args (printf "--nats-ca-file=%s/ca.crt" (include "webhook-operator.natsMountPath" .)) }}
{{- end }}
{{- $args = concat $args (list
      (printf "--events-stream=%s" $v.streams.names.events)
      (printf "--events-subject-prefix=%s" $v.streams.eventsSubjectPrefix)
      (printf "--internal-subject-prefix=%s" $v.streams.internalSubjectPrefix)
      (printf "--max-event-bytes=%d" (int64 $v.maxEventBytes))
      (printf "--bind-address=:%d" (int64 $i.port))
      (printf "--metrics-secure=%t" $v.metrics.secure)
      (printf "--metrics-bind-address=:%d" (int64 $v.metrics.port))
      (printf "--health-probe-bind-address=:%d" (int64 $v.healthProbe.port))
      (printf "--token-audience=%s" (join "," $i.tokenAudiences))
      (printf "--rate-limit=%v" $i.rateLimit)
      (printf "--rate-burst=%d" (int64 $i.rateBurst))
      (printf "--replicas=%d" (int64 $i.replicas))
      (printf "--max-batch-events=%d" (int64 $i.maxBatchEvents))
      (printf "--max-batch-bytes=%s" (include "webhook-operator.quantity" $i.maxBatchBytes))
      (printf "--max-concurrent-requests=%d" (int64 $i.maxConcurrentRequests))
      (printf "--max-reviews-in-flight=%d" (int64 $i.maxReviewsInFlight))
      (printf "--max-body-bytes-in-flight=%s" (include "webhook-operator.quantity" $i.maxBodyBytesInFlight))
      (printf "--max-connections=%d" (int64 $i.maxConnections))
      (printf "--max-connections-per-client=%d" (int64 $i.maxConnectionsPerClient))
      (printf "--publish-timeout=%s" (toString $i.publishTimeout))
      (printf "--auth-cache-ttl=%s" (toString $i.authCacheTTL))) }}
{{- with $i.maxBodyBytesPerNamespace }}
{{- $args = append $args (printf "--max-body-bytes-per-namespace=%s" (include "webhook-operator.quantity" .)) }}
{{- end }}
{{- if $i.tls.existingSecret }}
{{- $args = concat $args (list "--tls-cert-file=/etc/webhook-operator/ingress-tls/tls.crt" "--tls-key-file=/etc/webhook-operator/ingress-tls/tls.key") }}
{{- end }}
{{- if $v.logLevel }}
{{- $args = append $args (printf "--zap-log-level=%s" (toString $v.logLevel)) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{- define "webhook-operator.calloutName" -}}
{{- printf "%s-callout" (include "webhook-operator.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "webhook-operator.calloutSelectorLabels" -}}
app.kubernetes.io/name: {{ include "webhook-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: callout
{{- end }}

{{- define "webhook-operator.calloutLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "webhook-operator.calloutSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: webhook-operator
{{- end }}

{{/* The auth callout's arguments (webhook-operator callout), as a YAML list. */}}
{{- define "webhook-operator.calloutArgs" -}}
{{- $v := .Values }}
{{- $c := $v.nats.auth.callout }}
{{- $dir := include "webhook-operator.calloutMountPath" . }}
{{- $args := list "callout" (printf "--nats-url=%s" (required "nats.url is required" $v.nats.url)) (printf "--nats-callout-issuer-seed-file=%s/issuer.seed" $dir) }}
{{- if $c.encrypted }}
{{- $args = append $args (printf "--nats-callout-xkey-seed-file=%s/xkey.seed" $dir) }}
{{- end }}
{{- $args = concat $args (list (printf "--nats-token-audience=%s" $c.tokenAudience) (printf "--nats-max-session=%s" (toString $c.maxSession))) }}
{{- if $v.ingress.enabled }}
{{- $args = append $args (printf "--nats-ingress-service-account=%s/%s" .Release.Namespace (include "webhook-operator.ingressName" .)) }}
{{- end }}
{{- if $v.apiserver.enabled }}
{{- $args = append $args (printf "--nats-apiserver-service-account=%s/%s" .Release.Namespace (include "webhook-operator.apiserverName" .)) }}
{{- end }}
{{- if $c.allowAPIAudienceTokens }}
{{- $args = append $args "--nats-allow-api-audience-tokens" }}
{{- end }}
{{- if include "webhook-operator.plaintextTokens" . }}
{{- $args = append $args "--nats-allow-plaintext-tokens" }}
{{- end }}
{{- with $c.userLimits }}
{{- $args = concat $args (list
      (printf "--nats-user-max-payload=%s" (include "webhook-operator.quantity" .maxPayload))
      (printf "--nats-user-max-subscriptions=%d" (int64 .maxSubscriptions))
      (printf "--nats-user-max-data=%s" (include "webhook-operator.quantity" .maxData))) }}
{{- end }}
{{- if include "webhook-operator.natsTLSSecret" . }}
{{- $tls := include "webhook-operator.tlsMountPath" . }}
{{- $args = concat $args (list (printf "--nats-ca-file=%s/ca.crt" $tls) (printf "--nats-cert-file=%s/tls.crt" $tls) (printf "--nats-key-file=%s/tls.key" $tls)) }}
{{- end }}
{{- with $v.streams }}
{{- $args = concat $args (list
      (printf "--events-stream=%s" .names.events)
      (printf "--events-subject-prefix=%s" .eventsSubjectPrefix)
      (printf "--deliveries-stream=%s" .names.deliveries)
      (printf "--attempts-stream=%s" .names.attempts)
      (printf "--dead-letter-stream=%s" .names.deadLetter)
      (printf "--kv-bucket=%s" .names.bucket)
      (printf "--internal-subject-prefix=%s" .internalSubjectPrefix)) }}
{{- end }}
{{- $args = concat $args (list
      (printf "--allow-cross-namespace-sources=%t" $v.outbound.allowCrossNamespaceSources)
      (printf "--max-event-bytes=%d" (int64 $v.maxEventBytes))
      (printf "--metrics-secure=%t" $v.metrics.secure)
      (printf "--metrics-bind-address=:%d" (int64 $v.metrics.port))
      (printf "--health-probe-bind-address=:%d" (int64 $v.healthProbe.port))) }}
{{- if $v.logLevel }}
{{- $args = append $args (printf "--zap-log-level=%s" (toString $v.logLevel)) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/* The data API server's Deployment, Service, ServiceAccount, roles and APIService: <fullname>-apiserver. */}}
{{- define "webhook-operator.apiserverName" -}}
{{- printf "%s-apiserver" (include "webhook-operator.fullname" . | trunc 53 | trimSuffix "-") }}
{{- end }}

{{- define "webhook-operator.apiserverSelectorLabels" -}}
app.kubernetes.io/name: {{ include "webhook-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: apiserver
{{- end }}

{{- define "webhook-operator.apiserverLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "webhook-operator.apiserverSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: webhook-operator
{{- end }}

{{/* The data API server's arguments, as a YAML list. */}}
{{- define "webhook-operator.apiserverArgs" -}}
{{- $v := .Values }}
{{- $a := $v.apiserver }}
{{- $args := list "apiserver" (printf "--nats-url=%s" (required "nats.url is required" $v.nats.url)) }}
{{- if include "webhook-operator.callout" . }}
{{- $args = append $args "--nats-token-file=/var/run/secrets/nats.webhook-operator.io/token" }}
{{- end }}
{{- if include "webhook-operator.natsTLSSecret" . }}
{{- $dir := include "webhook-operator.tlsMountPath" . }}
{{- $args = concat $args (list (printf "--nats-ca-file=%s/ca.crt" $dir) (printf "--nats-cert-file=%s/tls.crt" $dir) (printf "--nats-key-file=%s/tls.key" $dir)) }}
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "creds") }}
{{- $args = append $args (printf "--nats-creds-file=%s/creds" (include "webhook-operator.natsMountPath" .)) }}
{{- end }}
{{- if include "webhook-operator.natsHasFile" (list . "ca.crt") }}
{{- $args = append $args (printf "--nats-ca-file=%s/ca.crt" (include "webhook-operator.natsMountPath" .)) }}
{{- end }}
{{- with $v.streams }}
{{- $args = concat $args (list
      (printf "--events-stream=%s" .names.events)
      (printf "--events-subject-prefix=%s" .eventsSubjectPrefix)
      (printf "--deliveries-stream=%s" .names.deliveries)
      (printf "--attempts-stream=%s" .names.attempts)
      (printf "--dead-letter-stream=%s" .names.deadLetter)
      (printf "--kv-bucket=%s" .names.bucket)
      (printf "--internal-subject-prefix=%s" .internalSubjectPrefix)) }}
{{- end }}
{{- $args = concat $args (list
      (printf "--max-event-bytes=%d" (int64 $v.maxEventBytes))
      (printf "--secure-port=%d" (int64 $a.port))
      "--tls-cert-file=/etc/webhook-operator/apiserver-tls/tls.crt"
      "--tls-private-key-file=/etc/webhook-operator/apiserver-tls/tls.key") }}
{{- toYaml $args }}
{{- end }}
