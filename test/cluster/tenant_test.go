package cluster

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// runID starts every event id of this run: a reused cluster's JetStream de-duplicates ids
// it saw within the last minutes.
var runID = fmt.Sprintf("r%04x", time.Now().Unix()%0x10000)

// signingSecret is every endpoint's Standard Webhooks secret in these tests.
const signingSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// tenant makes a namespace as a team would: the endpoints' signing Secret and the receivers'
// CA (both consenting to the namespace's endpoints), the receivers' serving certificate, and a
// producer ServiceAccount bound to the chart's webhook-operator-producer ClusterRole.
func (s *install) tenant(t *testing.T, ns string) {
	t.Helper()
	if command("", "kubectl", "get", "namespace", ns).err == nil {
		return
	}
	kubectl(t, "create", "namespace", ns)
	kubectl(t, "-n", ns, "create", "secret", "generic", "signing", "--from-literal=secret="+signingSecret)
	kubectl(t, "-n", ns, "create", "secret", "generic", "receiver-ca", "--from-file=ca.crt="+s.tls.CA)
	kubectl(t, "-n", ns, "annotate", "secret", "signing", "receiver-ca", "webhook-operator.io/allowed-endpoints=*")
	kubectl(t, "-n", ns, "create", "secret", "tls", "receiver-tls", "--cert="+s.tls.ServerCert, "--key="+s.tls.ServerKey)
	kubectl(t, "-n", ns, "create", "serviceaccount", "producer")
	kubectl(t, "-n", ns, "create", "rolebinding", "producer", "--clusterrole=webhook-operator-producer", "--serviceaccount="+ns+":producer")
}

// receiver runs a receiver pod behind a headless Service: the endpoint's URL is its Service's
// DNS name, which resolves to the pod's address (in outbound.allowedCIDRs).
func receiver(t *testing.T, ns, name string) string {
	t.Helper()
	apply(t, fmt.Sprintf(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: receiver
        image: %[3]s
        imagePullPolicy: Never
        ports:
        - {name: https, containerPort: 8443}
        - {name: control, containerPort: 8080}
        readinessProbe:
          httpGet: {path: /healthz, port: control}
          periodSeconds: 2
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts:
        - {name: tls, mountPath: /tls, readOnly: true}
        - {name: signing, mountPath: /signing, readOnly: true}
        # internal/testenv's package init (envtest's) writes below /tmp.
        - {name: tmp, mountPath: /tmp}
      volumes:
      - name: tmp
        emptyDir: {}
      - name: tls
        secret: {secretName: receiver-tls}
      - name: signing
        secret: {secretName: signing}
---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  clusterIP: None
  selector: {app: %[1]s}
  ports:
  - {name: https, port: 8443}
  - {name: control, port: 8080}
`, name, ns, receiverImage))
	kubectl(t, "-n", ns, "rollout", "status", "deployment/"+name, "--timeout=3m")
	return fmt.Sprintf("https://%s.%s.svc.cluster.local:8443/webhooks", name, ns)
}

// receiverState is what a receiver pod reports.
type receiverState struct {
	Stats    testenv.ReceiverStats      `json:"stats"`
	Receipts map[string]testenv.Receipt `json:"receipts"`
}

// receipts reads a receiver's state through the API server's service proxy.
func receipts(ns, name string) (receiverState, error) {
	var st receiverState
	b, err := rawGet(fmt.Sprintf("/api/v1/namespaces/%s/services/http:%s:8080/proxy/receipts", ns, name))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

// respond makes a receiver answer every webhook with status.
func respond(t *testing.T, ns, name string, status int) {
	t.Helper()
	respondWith(t, ns, name, status, "")
}

// respondWith makes a receiver answer every webhook with status and body ("": its own).
func respondWith(t *testing.T, ns, name string, status int, body string) {
	t.Helper()
	query := url.Values{"status": {fmt.Sprint(status)}}
	if body != "" {
		query.Set("body", body)
	}
	// kubectl has no PUT through the proxy: the raw API does it (kubectl replace --raw).
	r := command("", "kubectl", "replace", "--raw", fmt.Sprintf("/api/v1/namespaces/%s/services/http:%s:8080/proxy/respond?%s", ns, name, query.Encode()), "-f", "/dev/null")
	if r.err != nil {
		t.Fatalf("setting %s/%s to answer %d: %v %s", ns, name, status, r.err, r.stderr)
	}
}

// produced is a producer pod's summary line.
type produced struct {
	Published int      `json:"published"`
	Unacked   []string `json:"unacked"`
	Retries   int      `json:"retries"`
}

// startProducer runs a producer pod publishing count events <prefix>-<n> of eventType at rate
// per second, with its own ServiceAccount's projected token (audience of the auth callout)
// and the TLS material the controller mirrors into the namespace.
func startProducer(t *testing.T, ns, name, eventType, prefix string, count int, rate float64) {
	t.Helper()
	_ = command("", "kubectl", "-n", ns, "delete", "pod", name, "--ignore-not-found", "--wait=true")
	apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s, labels: {app: producer}}
spec:
  restartPolicy: Never
  serviceAccountName: producer
  automountServiceAccountToken: false
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: producer
    image: %[3]s
    imagePullPolicy: Never
    args: [-type, %[4]s, -prefix, %[5]s, -count, "%[6]d", -rate, "%[7]g"]
    env:
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    volumeMounts:
    - {name: token, mountPath: /var/run/secrets/nats, readOnly: true}
    - {name: nats-tls, mountPath: /nats-tls, readOnly: true}
  volumes:
  - name: token
    projected:
      sources:
      - serviceAccountToken: {audience: nats.webhook-operator.io, expirationSeconds: 3600, path: token}
  - name: nats-tls
    secret: {secretName: webhook-dispatcher-nats}
`, name, ns, producerImage, eventType, prefix, count, rate))
}

// waitProducer waits for the producer pod to finish and returns what it published.
func waitProducer(t *testing.T, ns, name string, timeout time.Duration) produced {
	t.Helper()
	var phase string
	eventually(t, timeout, "producer "+name+" to finish", func() error {
		phase = strings.TrimSpace(command("", "kubectl", "-n", ns, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout)
		if phase != "Succeeded" && phase != "Failed" {
			return fmt.Errorf("phase %q", phase)
		}
		return nil
	})
	logs := kubectl(t, "-n", ns, "logs", name)
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	var p produced
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &p); err != nil || phase != "Succeeded" {
		t.Fatalf("producer %s: phase %s, %v:\n%s", name, phase, err, logs)
	}
	return p
}

// produce runs a producer to the end.
func produce(t *testing.T, ns, name, eventType, prefix string, count int, rate float64) produced {
	t.Helper()
	startProducer(t, ns, name, eventType, prefix, count, rate)
	return waitProducer(t, ns, name, 5*time.Minute)
}

// ids are the event ids a producer publishes.
func ids(prefix string, count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// waitReceived waits until the receiver accepted every id.
func waitReceived(t *testing.T, ns, rcv string, want []string, timeout time.Duration) receiverState {
	t.Helper()
	var st receiverState
	eventually(t, timeout, fmt.Sprintf("receiver %s/%s to accept %d events", ns, rcv, len(want)), func() error {
		var err error
		if st, err = receipts(ns, rcv); err != nil {
			return err
		}
		var missing []string
		for _, id := range want {
			if st.Receipts[id].Count == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("%d of %d not received yet, e.g. %v", len(missing), len(want), missing[:min(5, len(missing))])
		}
		return nil
	})
	return st
}
