package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	monitoringNS    = "monitoring"
	prometheusImage = "localhost/cluster/prometheus:test"
)

// prometheusConfig scrapes what the chart's dispatcher PodMonitor selects, the way it says:
// the pods' metrics port over HTTPS (self-signed: tlsConfig insecureSkipVerify), with the
// client certificate of the chart's scraper CA (the dispatchers ask the API server nothing,
// and Prometheus has no token bound to metrics-reader), honouring the metrics' own labels.
const prometheusConfig = `
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [/etc/prometheus/rules.yml]
scrape_configs:
- job_name: webhook-dispatchers
  scheme: https
  tls_config: {insecure_skip_verify: true, cert_file: /etc/scraper/tls.crt, key_file: /etc/scraper/tls.key}
  honor_labels: true
  kubernetes_sd_configs: [{role: pod}]
  relabel_configs:
  - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_managed_by], regex: webhook-operator, action: keep}
  - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: metrics, action: keep}
  - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
  - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
`

// startPrometheus runs Prometheus (built from the module proxy) in the cluster with the
// chart's alert rules (its PrometheusRule's groups, rendered by helm).
func (s *install) startPrometheus(t *testing.T) {
	rules, alerts := chartRules(t, world.root)
	dir := filepath.Join(world.dir, "prometheus")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"prometheus.yml": []byte(prometheusConfig), "rules.yml": rules} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Prometheus' own checker first: the rules load as Prometheus loads them.
	sh(t, filepath.Join(world.root, "bin", "promtool"), "check", "rules", filepath.Join(dir, "rules.yml"))
	kubectl(t, "create", "namespace", monitoringNS)
	kubectl(t, "-n", monitoringNS, "create", "configmap", "prometheus",
		"--from-file="+filepath.Join(dir, "prometheus.yml"), "--from-file="+filepath.Join(dir, "rules.yml"))
	// The scraper's client certificate and key, given to Prometheus as an installer would: a
	// copy of the chart's Secret (its CA's certificate alone reaches the dispatchers).
	var scraper struct {
		Data map[string]string `json:"data"`
	}
	kubectlJSON(t, &scraper, "-n", operatorNS, "get", "secret", release+"-metrics-scraper-tls", "-o", "json")
	if scraper.Data["tls.crt"] == "" || scraper.Data["tls.key"] == "" {
		t.Fatalf("the chart's scraper Secret has no client certificate (%d keys)", len(scraper.Data))
	}
	apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: scraper-tls, namespace: monitoring}
type: kubernetes.io/tls
data: {tls.crt: %s, tls.key: %s}
`, scraper.Data["tls.crt"], scraper.Data["tls.key"]))
	apply(t, fmt.Sprintf(`
apiVersion: v1
kind: ServiceAccount
metadata: {name: prometheus, namespace: monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: test-prometheus-discovery}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: test-prometheus-discovery}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: test-prometheus-discovery}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: prometheus, namespace: monitoring}
spec:
  replicas: 1
  selector: {matchLabels: {app: prometheus}}
  template:
    metadata: {labels: {app: prometheus}}
    spec:
      serviceAccountName: prometheus
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: prometheus
        image: %[1]s
        imagePullPolicy: Never
        args: [--config.file=/etc/prometheus/prometheus.yml, --storage.tsdb.path=/prometheus, --web.listen-address=:9090]
        ports: [{name: web, containerPort: 9090}]
        readinessProbe:
          httpGet: {path: /-/ready, port: web}
          periodSeconds: 2
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts:
        - {name: config, mountPath: /etc/prometheus, readOnly: true}
        - {name: data, mountPath: /prometheus}
        - {name: scraper, mountPath: /etc/scraper, readOnly: true}
      volumes:
      - name: scraper
        secret: {secretName: scraper-tls}
      - name: config
        configMap: {name: prometheus}
      - name: data
        emptyDir: {}
---
apiVersion: v1
kind: Service
metadata: {name: prometheus, namespace: monitoring}
spec:
  selector: {app: prometheus}
  ports: [{name: web, port: 9090}]
`, prometheusImage))
	rollout(t, monitoringNS, "deployment/prometheus", "app=prometheus", "3m")
	logf(t, "Prometheus runs with the chart's %d alerts, scraping the dispatchers as its PodMonitor says", len(alerts))
}

// promAlert is one alert of Prometheus' /api/v1/alerts.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func alerts() ([]promAlert, error) {
	b, err := rawGet("/api/v1/namespaces/monitoring/services/http:prometheus:9090/proxy/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	var r struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	return r.Data.Alerts, json.Unmarshal(b, &r)
}

// waitAlert waits until alert name for endpoint is firing (firing true) or gone (false).
func waitAlert(t *testing.T, name, ns, endpoint string, firing bool) {
	t.Helper()
	eventually(t, 3*time.Minute, fmt.Sprintf("alert %s of %s/%s firing=%v", name, ns, endpoint, firing), func() error {
		as, err := alerts()
		if err != nil {
			return err
		}
		var seen []string
		on := false
		for _, a := range as {
			seen = append(seen, a.Labels["alertname"]+"/"+a.Labels["endpoint"]+":"+a.State)
			if a.Labels["alertname"] == name && a.Labels["namespace"] == ns && a.Labels["endpoint"] == endpoint && a.State == "firing" {
				on = true
			}
		}
		if on != firing {
			return fmt.Errorf("alerts: %s", strings.Join(seen, " "))
		}
		return nil
	})
}

// monitoring runs Prometheus with the chart's rules and breaks the walk-through's flaky
// endpoint again: the chart's WebhookEndpointDisabled fires from what Prometheus scraped of
// the dispatchers, and resolves once `kubectl webhooks enable` re-enables it.
func (s *install) monitoring(t *testing.T) {
	if s.flaky == "" {
		t.Skip("the walk-through made no endpoint to disable")
	}
	s.startPrometheus(t)
	pl := newPlugin(t, shop, s.tls)
	respond(t, shop, s.flaky, 503)
	produce(t, shop, "producer-alert", "invoice.created", runID+"alert", 4, 5)
	kubectl(t, "-n", shop, "wait", "--for=condition=Disabled", "webhookendpoint/"+s.flaky, "--timeout=3m")
	waitAlert(t, "WebhookEndpointDisabled", shop, s.flaky, true)
	logf(t, "Prometheus: the chart's alert WebhookEndpointDisabled fires for %s/%s", shop, s.flaky)
	respond(t, shop, s.flaky, 200)
	pl.run(t, shop, "enable", s.flaky)
	waitAlert(t, "WebhookEndpointDisabled", shop, s.flaky, false)
	logf(t, "Prometheus: WebhookEndpointDisabled resolved after kubectl webhooks enable")
}
