package cluster

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// rogueRoute is a tenant trying to join the NATS cluster as a route, which would let it read
// and write every namespace: a pod in the walk-through's namespace runs nats-server with the
// strongest material a tenant has, the client certificate the controller mirrors into every
// dispatcher namespace (webhook-dispatcher-nats), trusts the routes' CA (a certificate, not a
// secret) and guesses the route password. The servers refuse it in the TLS handshake (its
// certificate is not of the routes' CA), and none of them has a route to it. The node's CNI
// enforces no NetworkPolicy, so this is the credential and the CA holding alone.
func (s *install) rogueRoute(t *testing.T) {
	const name = "rogue-route"
	natsImage := "localhost/cluster/nats-server:" + strings.TrimSpace(readFile(t, filepath.Join(world.root, "bin", "nats-server.version")))
	kubectl(t, "-n", shop, "create", "configmap", name, "--from-file=route-ca.crt="+s.routeTLS.CA,
		"--from-literal=nats.conf="+`server_name: rogue
listen: 0.0.0.0:4222
cluster {
  name: nats
  listen: 0.0.0.0:6222
  routes: [ "nats-route://route:guessed@nats-0.nats-headless.nats.svc.cluster.local:6222" ]
  tls { cert_file: /tenant/tls.crt, key_file: /tenant/tls.key, ca_file: /config/route-ca.crt }
}
`)
	defer func() {
		_ = command("", "kubectl", "-n", shop, "delete", "pod,configmap", name, "--ignore-not-found", "--wait=false")
	}()
	apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: nats
    image: %[3]s
    imagePullPolicy: Never
    args: [-c, /config/nats.conf]
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    volumeMounts:
    - {name: config, mountPath: /config, readOnly: true}
    - {name: tenant, mountPath: /tenant, readOnly: true}
  volumes:
  - name: config
    configMap: {name: %[1]s}
  - name: tenant
    secret: {secretName: webhook-dispatcher-nats}
`, name, shop, natsImage))
	kubectl(t, "-n", shop, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=2m")
	ip := strings.TrimSpace(kubectl(t, "-n", shop, "get", "pod", name, "-o", "jsonpath={.status.podIP}"))
	logf(t, "a rogue nats-server in namespace %s (%s) with the tenant's client certificate routes to nats-0", shop, ip)

	// nats-0 logs each refused attempt with the rogue's address; it retries every second.
	var refusals []string
	eventually(t, 2*time.Minute, "nats-0 refusing the rogue route twice", func() error {
		r := command("", "kubectl", "-n", natsNS, "logs", "nats-0", "--since=5m")
		if r.err != nil {
			return fmt.Errorf("%v: %s", r.err, r.stderr)
		}
		refusals = refusals[:0]
		for _, line := range strings.Split(r.stdout, "\n") {
			if strings.Contains(line, ip+":") && strings.Contains(line, "TLS route handshake error") {
				refusals = append(refusals, line)
			}
		}
		if len(refusals) < 2 {
			rogue := command("", "kubectl", "-n", shop, "logs", name, "--tail=20")
			return fmt.Errorf("%d refusals of %s in nats-0's log; the rogue's log:\n%s", len(refusals), ip, rogue.stdout)
		}
		return nil
	})
	logf(t, "nats-0: %s", refusals[0])
	for i := range 3 {
		pod := fmt.Sprintf("nats-%d", i)
		b, err := rawGet(fmt.Sprintf("/api/v1/namespaces/%s/pods/http:%s:8222/proxy/routez", natsNS, pod))
		if err != nil {
			t.Fatal(err)
		}
		var rz struct {
			Routes []struct {
				RemoteName string `json:"remote_name"`
				IP         string `json:"ip"`
			} `json:"routes"`
		}
		if err := json.Unmarshal(b, &rz); err != nil {
			t.Fatalf("%s /routez: %v", pod, err)
		}
		var remotes []string
		for _, r := range rz.Routes {
			if r.IP == ip || r.RemoteName == "rogue" {
				t.Errorf("%s has a route to the rogue server: %+v", pod, r)
			}
			if !slices.Contains(remotes, r.RemoteName) {
				remotes = append(remotes, r.RemoteName)
			}
		}
		slices.Sort(remotes)
		logf(t, "%s routes to %v", pod, remotes)
		if len(remotes) != 2 {
			t.Errorf("%s routes to %v, want the two other servers", pod, remotes)
		}
	}
}
