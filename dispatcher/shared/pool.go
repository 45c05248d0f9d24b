package shared

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
)

// NamespacesKey is the key of the pool ConfigMap (names.SharedPool, in the controller's
// namespace) that lists the namespaces a shared dispatcher serves, one a line, sorted: the
// controller writes it, the shared dispatcher's replicas follow it.
const NamespacesKey = "namespaces"

// MaxNamespaces bounds what a pool ConfigMap lists (a ConfigMap holds 1 MiB; a namespace name
// takes at most 64 bytes a line).
const MaxNamespaces = 15000

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// FormatNamespaces is the pool ConfigMap's NamespacesKey value for namespaces.
func FormatNamespaces(namespaces []string) string {
	s := slices.Clone(namespaces)
	slices.Sort(s)
	s = slices.Compact(s)
	if len(s) == 0 {
		return ""
	}
	return strings.Join(s, "\n") + "\n"
}

// ParseNamespaces reads a pool ConfigMap's NamespacesKey value: the namespaces it names, and
// an error for a line that is no namespace name or for more than MaxNamespaces (the valid
// ones, up to the bound, are returned anyway).
func ParseNamespaces(v string) ([]string, error) {
	var out []string
	var bad []string
	for line := range strings.Lines(v) {
		ns := strings.TrimSpace(line)
		switch {
		case ns == "":
		case !dnsLabel.MatchString(ns):
			if len(bad) < 3 {
				bad = append(bad, fmt.Sprintf("%.70q", ns))
			}
		case len(out) < MaxNamespaces:
			out = append(out, ns)
		default:
			return out, fmt.Errorf("more than %d namespaces: the rest are not served", MaxNamespaces)
		}
	}
	if len(bad) > 0 {
		return out, fmt.Errorf("not namespace names: %s", strings.Join(bad, ", "))
	}
	return out, nil
}

// Follow watches ConfigMap namespace/name (get, list and watch on that one name are all it
// needs) with the process's own identity and serves the namespaces it lists whenever they
// change, none while it does not exist, until ctx ends.
func (s *Shared) Follow(ctx context.Context, namespace, name string) {
	serve := s.Serve
	logf := func(format string, args ...any) { s.o.Logger.Info(fmt.Sprintf(format, args...)) }
	lw := toolscache.NewListWatchFromClient(s.kube.CoreV1().RESTClient(), "configmaps", namespace, fields.OneTermEqualSelector("metadata.name", name))
	var last []string
	update := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		var list []string
		if ok {
			var err error
			if list, err = ParseNamespaces(cm.Data[NamespacesKey]); err != nil {
				logf("ConfigMap %s/%s: %v", namespace, name, err)
			}
		}
		if last != nil && slices.Equal(list, last) {
			return
		}
		last = list
		serve(list)
	}
	_, inf := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		ResyncPeriod:  10 * time.Minute,
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    update,
			UpdateFunc: func(_, obj any) { update(obj) },
			DeleteFunc: func(any) { update(nil) },
		},
	})
	inf.RunWithContext(ctx)
}
