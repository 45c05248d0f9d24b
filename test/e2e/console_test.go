package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/console/consoletest"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestConsoleOnTheDemoStack: the console as `make demo` runs it (its own process, plain HTTP
// on loopback, the data API aggregated) works in a real browser. A viewer signs in with a
// token, sees its namespace's endpoints and not another's, is refused the replay RBAC does not
// grant with the reason on the page, and sees a hostile event and response as text; an editor
// replays the dead letter and watches the replay complete, and the receiver gets the event.
func TestConsoleOnTheDemoStack(t *testing.T) {
	consoletest.Need(t)
	u := newUser(t, "e2e-console")
	other := newUser(t, "e2e-console-other")
	rcv := u.receiver("notes")
	rcv.SetResponder(func(testenv.Request) testenv.Response {
		return testenv.Response{Status: 500, Body: consoletest.Hostile}
	})
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: notes}
spec:
  url: %s
  eventTypes: [note.>]
  retryPolicyRef: {name: once}
`, rcv.URL()))
	other.apply(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: ledger-secret}
spec:
  url: https://ledger.example.com/hooks
  eventTypes: [entry.>]
`)
	u.waitReady("notes")
	u.publish("note.created", "evt_console", consoletest.HostileEvent())
	var dead string
	testenv.Eventually(t, 60*time.Second, func() error {
		var p page[deadLetter]
		u.json(&p, "kubectl", "webhooks", "dlq", "list", "notes")
		for _, d := range p.Data {
			if d.EventID == "evt_console" {
				dead = d.DeliveryID
				return nil
			}
		}
		return fmt.Errorf("no dead letter of evt_console yet: %+v", p.Data)
	}, "")
	rcv.SetResponder(nil)

	// A viewer (with the payload reader's grant) and an editor of the namespace, each a
	// ServiceAccount bound to the chart's tenant roles, with a token as `kubectl create token`
	// makes one for the demo.
	u.must(nil, "kubectl", "create", "serviceaccount", "viewer")
	u.must(nil, "kubectl", "create", "rolebinding", "viewer", "--clusterrole=webhook-operator-viewer", "--serviceaccount="+u.ns+":viewer")
	u.must(nil, "kubectl", "create", "rolebinding", "viewer-payloads", "--clusterrole=webhook-operator-payload-reader", "--serviceaccount="+u.ns+":viewer")
	u.must(nil, "kubectl", "create", "serviceaccount", "editor")
	u.must(nil, "kubectl", "create", "rolebinding", "editor", "--clusterrole=webhook-operator-editor", "--serviceaccount="+u.ns+":editor")
	viewer := strings.TrimSpace(u.must(nil, "kubectl", "create", "token", "viewer"))
	editor := strings.TrimSpace(u.must(nil, "kubectl", "create", "token", "editor"))

	b := consoletest.Start(t, stack.ConsoleURL)
	consoletest.Tour{
		Namespace: u.ns, Endpoint: "notes", DeadLetter: dead,
		Other: other.ns, OtherEndpoint: "ledger-secret",
		Viewer: viewer, ViewerName: "system:serviceaccount:" + u.ns + ":viewer",
		Editor: editor, EditorName: "system:serviceaccount:" + u.ns + ":editor",
	}.Take(t, b)
	receive(t, rcv, "evt_console")
}
