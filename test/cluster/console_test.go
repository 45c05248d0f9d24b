package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/console/consoletest"
)

// console is the chart's console (console.enabled) on the real node, in a real browser
// (chromium headless, driven by chromedp) through `kubectl port-forward` to its Service: a
// viewer of shop signs in with a `kubectl create token`, sees shop's endpoints and not
// ledger's, is refused the replay RBAC does not grant with why, and sees a hostile event and
// receiver response as text; the editor replays the dead letter, watches the replay complete,
// and the receiver pod gets the event.
func (s *install) console(t *testing.T) {
	consoletest.Need(t)
	start := time.Now()
	// Another tenant, with an endpoint shop's viewer may not see.
	const other, otherEndpoint = "ledger", "books"
	s.tenant(t, other)
	apply(t, `
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: `+otherEndpoint+`, namespace: `+other+`}
spec:
  url: https://books.ledger.svc.cluster.local:8443/webhooks
  eventTypes: ["entry.*"]
`)

	// A dead letter whose event and last response are hostile markup.
	pl := newPlugin(t, shop, s.tls)
	name := "console-" + runID
	endpoint(t, shop, name, receiver(t, shop, name), `"note.*"`, "  retryPolicyRef: {name: two-quick}\n")
	respondWith(t, shop, name, 500, consoletest.Hostile)
	id := runID + "note"
	pl.run(t, shop, "publish", "note.created", "--id", id, "--data", consoletest.HostileEvent())
	var dead string
	eventually(t, 2*time.Minute, "a dead letter of "+name, func() error {
		for _, dl := range pl.deadLetters(t, shop, name) {
			if dl.EventID == id {
				dead = dl.DeliveryID
				return nil
			}
		}
		return fmt.Errorf("no dead letter of %s yet", id)
	})
	respond(t, shop, name, 200)

	// The viewer: the chart's viewer and payload-reader roles; the editor is the plugin's.
	if command("", "kubectl", "-n", shop, "get", "serviceaccount", "console-viewer").err != nil {
		kubectl(t, "-n", shop, "create", "serviceaccount", "console-viewer")
		kubectl(t, "-n", shop, "create", "rolebinding", "console-viewer", "--clusterrole=webhook-operator-viewer", "--serviceaccount="+shop+":console-viewer")
		kubectl(t, "-n", shop, "create", "rolebinding", "console-viewer-payloads", "--clusterrole=webhook-operator-payload-reader", "--serviceaccount="+shop+":console-viewer")
	}
	viewer := strings.TrimSpace(kubectl(t, "-n", shop, "create", "token", "console-viewer", "--duration", "1h"))
	editor := strings.TrimSpace(kubectl(t, "-n", shop, "create", "token", "editor", "--duration", "1h"))

	forward, port := portForward(t, operatorNS, "svc/"+release+"-console", 443)
	t.Cleanup(func() {
		_ = forward.Process.Kill()
		_ = forward.Wait()
	})
	b := consoletest.Start(t, fmt.Sprintf("http://127.0.0.1:%d", port))
	replay := consoletest.Tour{
		Namespace: shop, Endpoint: name, DeadLetter: dead,
		Other: other, OtherEndpoint: otherEndpoint,
		Viewer: viewer, ViewerName: "system:serviceaccount:" + shop + ":console-viewer",
		Editor: editor, EditorName: "system:serviceaccount:" + shop + ":editor",
		ReplayTimeout: 2 * time.Minute,
	}.Take(t, b)
	waitReceived(t, shop, name, []string{id}, 2*time.Minute)
	logf(t, "console in chromium: viewer saw shop and not ledger, Replay refused with why, the hostile event and response as text; the editor's WebhookReplay %s completed and the receiver got %s (%s)",
		replay, id, time.Since(start).Round(time.Second))
}
