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
// controller writes it, the shared dispatcher's replicas follow it. A line is
// "<namespace> <digest>[ awake]" (Entry).
const NamespacesKey = "namespaces"

// MaxNamespaces bounds what a pool ConfigMap lists (a ConfigMap holds 1 MiB; a line takes at
// most 87 bytes).
const MaxNamespaces = 12000

// Entry is one namespace a shared dispatcher serves.
type Entry struct {
	Namespace string
	// Digest changes when what the namespace's dispatcher acts on of its endpoints changes
	// (wake.Digest): the namespace is woken if it sleeps.
	Digest string
	// Awake keeps the namespace's dispatcher running while it is idle (wake.MaySleep false:
	// what would wake it is not watched).
	Awake bool
}

var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	digest   = regexp.MustCompile(`^[0-9a-f]{1,64}$`)
)

// FormatEntries is the pool ConfigMap's NamespacesKey value for entries (sorted, one a
// namespace).
func FormatEntries(entries []Entry) string {
	s := slices.Clone(entries)
	slices.SortFunc(s, func(a, b Entry) int { return strings.Compare(a.Namespace, b.Namespace) })
	s = slices.CompactFunc(s, func(a, b Entry) bool { return a.Namespace == b.Namespace })
	var b strings.Builder
	for _, e := range s {
		b.WriteString(e.Namespace)
		b.WriteByte(' ')
		b.WriteString(e.Digest)
		if e.Awake {
			b.WriteString(" awake")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ParseEntries reads a pool ConfigMap's NamespacesKey value: the namespaces it names, and an
// error for a line that is not one or for more than MaxNamespaces (the valid ones, up to the
// bound, are returned anyway). A line that names a namespace only (an earlier controller's)
// keeps it awake: nothing would wake it.
func ParseEntries(v string) ([]Entry, error) {
	var out []Entry
	var bad []string
	for line := range strings.Lines(v) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		e := Entry{Namespace: f[0], Awake: true}
		ok := dnsLabel.MatchString(e.Namespace)
		switch {
		case len(f) == 2 && digest.MatchString(f[1]):
			e.Digest, e.Awake = f[1], false
		case len(f) == 3 && digest.MatchString(f[1]) && f[2] == "awake":
			e.Digest = f[1]
		case len(f) != 1:
			ok = false
		}
		switch {
		case !ok:
			if len(bad) < 3 {
				bad = append(bad, fmt.Sprintf("%.70q", strings.TrimSpace(line)))
			}
		case len(out) < MaxNamespaces:
			out = append(out, e)
		default:
			return out, fmt.Errorf("more than %d namespaces: the rest are not served", MaxNamespaces)
		}
	}
	if len(bad) > 0 {
		return out, fmt.Errorf("not a namespace and its digest: %s", strings.Join(bad, ", "))
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
	var last []Entry
	update := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		var list []Entry
		if ok {
			var err error
			if list, err = ParseEntries(cm.Data[NamespacesKey]); err != nil {
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
