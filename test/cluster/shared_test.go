package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// pooled is the namespace the shared dispatcher step makes.
const pooled = "pooled"

// sharedDispatcher turns the chart's dispatcher.shared on with helm upgrade (the installer's
// values kept), on the real node: every namespace with endpoints loses its own dispatcher
// Deployment once the shared one in the release namespace is available, and a namespace's
// events are delivered, signed, through the shared pod, which holds that namespace's tokens
// from the TokenRequest API; an endpoint's status names the shared Deployment; an idle
// namespace sleeps and an event wakes it and is delivered; a namespace
// labelled webhook-operator.io/own-dispatcher=true gets its own back. Turned off again, every
// namespace gets its own Deployment back, and its events are delivered through it.
func (s *install) sharedDispatcher(t *testing.T) {
	s.tenant(t, pooled)
	url := receiver(t, pooled, "orders")
	endpoint(t, pooled, "orders", url, `"order.*"`, "")
	rollout(t, pooled, "deployment/webhook-dispatcher", "app.kubernetes.io/name=webhook-dispatcher", "3m")

	logf(t, "helm upgrade --set dispatcher.shared=true")
	sh(t, "helm", "upgrade", release, "charts/webhook-operator", "--namespace", operatorNS, "--reuse-values",
		"--set", "dispatcher.shared=true", "--set", "dispatcher.sharedIdleAfter=10s", "--wait", "--timeout", "5m")
	eventually(t, 3*time.Minute, "the shared dispatcher's Deployment to be made", func() error {
		return command("", "kubectl", "-n", operatorNS, "get", "deployment", "webhook-shared-dispatcher").err
	})
	rollout(t, operatorNS, "deployment/webhook-shared-dispatcher", "webhook-operator.io/dispatcher=webhook-shared-dispatcher", "3m")
	eventually(t, 3*time.Minute, "namespace "+pooled+"'s own dispatcher Deployment to go", func() error {
		if r := command("", "kubectl", "-n", pooled, "get", "deployment", "webhook-dispatcher", "--ignore-not-found", "-o", "name"); strings.TrimSpace(r.stdout) != "" {
			return fmt.Errorf("still there: %s", r.stdout)
		}
		return nil
	})
	var served []string
	for line := range strings.Lines(kubectl(t, "-n", operatorNS, "get", "configmap", "webhook-shared-dispatcher", "-o", "jsonpath={.data.namespaces}")) {
		if f := strings.Fields(line); len(f) > 0 {
			served = append(served, f[0])
		}
	}
	if !slices.Contains(served, pooled) || !slices.Contains(served, shop) {
		t.Errorf("the shared dispatcher's ConfigMap lists %q, want %s and %s among them", served, pooled, shop)
	}
	eventually(t, 2*time.Minute, "the endpoint's status to name the shared Deployment", func() error {
		got := kubectl(t, "-n", pooled, "get", "webhookendpoint", "orders", "-o", "jsonpath={.status.dispatcher.namespace}/{.status.dispatcher.name} {.status.conditions[?(@.type=='Ready')].message}")
		if !strings.HasPrefix(got, operatorNS+"/webhook-shared-dispatcher ") || !strings.Contains(got, "through Deployment "+operatorNS+"/webhook-shared-dispatcher") {
			return fmt.Errorf("status: %s", got)
		}
		return nil
	})

	p := produce(t, pooled, "producer-shared", "order.created", runID+"shared", 30, 15)
	if p.Published != 30 {
		t.Fatalf("the producer published %+v", p)
	}
	st := waitReceived(t, pooled, "orders", ids(runID+"shared", 30), 3*time.Minute)
	if st.Stats.BadSignatures != 0 {
		t.Errorf("receiver: %+v (want every signature verified)", st.Stats)
	}
	logs := kubectl(t, "-n", operatorNS, "logs", "deployment/webhook-shared-dispatcher", "--tail=-1")
	if !strings.Contains(logs, `"serving namespace"`) || !strings.Contains(logs, `"namespace":"`+pooled+`"`) {
		t.Errorf("the shared dispatcher's log does not say it serves %s:\n%s", pooled, tail(logs, 20))
	}
	logf(t, "30 events delivered through the shared dispatcher (namespaces %s), no bad signature", strings.Join(served, ", "))

	// Idle, the namespace sleeps (dispatcher.sharedIdleAfter=10s, and its pull requests run
	// out); an event wakes it and is delivered.
	sleeping := `"msg":"sleeping: nothing to do","namespace":"` + pooled + `"`
	eventually(t, 3*time.Minute, "namespace "+pooled+" to sleep", func() error {
		if logs := kubectl(t, "-n", operatorNS, "logs", "deployment/webhook-shared-dispatcher", "--tail=-1"); !strings.Contains(logs, sleeping) {
			return fmt.Errorf("no line says it sleeps:\n%s", tail(logs, 5))
		}
		return nil
	})
	woken := time.Now()
	if p := produce(t, pooled, "producer-woken", "order.created", runID+"woken", 5, 5); p.Published != 5 {
		t.Fatalf("the producer published %+v", p)
	}
	waitReceived(t, pooled, "orders", ids(runID+"woken", 5), 2*time.Minute)
	logs = kubectl(t, "-n", operatorNS, "logs", "deployment/webhook-shared-dispatcher", "--tail=-1")
	if !strings.Contains(logs, `"msg":"waking","namespace":"`+pooled+`","reason":"event"`) {
		t.Errorf("the shared dispatcher's log does not say an event woke %s:\n%s", pooled, tail(logs, 20))
	}
	logf(t, "namespace %s slept, and 5 events published then were delivered (%s from the producer's start)", pooled, time.Since(woken).Round(time.Second))

	// A namespace that asks for its own dispatcher gets it back.
	kubectl(t, "label", "namespace", shop, "webhook-operator.io/own-dispatcher=true")
	eventually(t, 3*time.Minute, "namespace "+shop+"'s own dispatcher Deployment to come back", func() error {
		return command("", "kubectl", "-n", shop, "get", "deployment", "webhook-dispatcher").err
	})
	rollout(t, shop, "deployment/webhook-dispatcher", "app.kubernetes.io/name=webhook-dispatcher", "3m")
	kubectl(t, "label", "namespace", shop, "webhook-operator.io/own-dispatcher-")

	logf(t, "helm upgrade --set dispatcher.shared=false")
	sh(t, "helm", "upgrade", release, "charts/webhook-operator", "--namespace", operatorNS, "--reuse-values",
		"--set", "dispatcher.shared=false", "--wait", "--timeout", "5m")
	eventually(t, 3*time.Minute, "namespace "+pooled+"'s own dispatcher Deployment to come back", func() error {
		return command("", "kubectl", "-n", pooled, "get", "deployment", "webhook-dispatcher").err
	})
	rollout(t, pooled, "deployment/webhook-dispatcher", "app.kubernetes.io/name=webhook-dispatcher", "3m")
	eventually(t, 3*time.Minute, "the shared dispatcher's Deployment to go", func() error {
		if r := command("", "kubectl", "-n", operatorNS, "get", "deployment", "webhook-shared-dispatcher", "--ignore-not-found", "-o", "name"); strings.TrimSpace(r.stdout) != "" {
			return fmt.Errorf("still there: %s", r.stdout)
		}
		return nil
	})
	produce(t, pooled, "producer-own", "order.created", runID+"own", 10, 10)
	waitReceived(t, pooled, "orders", ids(runID+"own", 10), 3*time.Minute)
	logf(t, "shared dispatcher off: namespace %s's own Deployment is back and delivers", pooled)
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
