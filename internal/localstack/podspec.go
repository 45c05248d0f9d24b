package localstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// tokenProjector writes a projected ServiceAccount token of audience, valid for seconds, to
// path and keeps it fresh there, as the kubelet does.
type tokenProjector func(ctx context.Context, audience string, seconds int64, path string) error

// podMeta is what the downward API can tell a container about its pod.
type podMeta struct {
	Name, Namespace, ServiceAccount string
	Labels, Annotations             map[string]string
}

// command is a container turned into a local process: what to run, with which environment,
// and where its declared ports and probes really are.
type command struct {
	Path string
	Args []string
	Env  []string
	// Ports maps a container port (number) to the loopback port it really listens on.
	Ports map[int32]int
	// Readiness is the URL of the readiness probe, empty without one.
	Readiness string
	// Rewrites says, for the log, what was changed to run the container locally.
	Rewrites []string
}

// containerCommand turns c into a local command: the image is ignored and binary runs in its
// place (c.command, when set, must name the same program); fieldRef, secretKeyRef and
// configMapKeyRef environment variables are resolved from meta and the API server; $(VAR)
// references are expanded; every declared container port gets a free loopback port, and an
// argument that binds a declared port (":8080", "0.0.0.0:8080") is rewritten to it; Secret,
// ConfigMap, emptyDir and projected ServiceAccount token volumes are written under
// dir/volumes (tokens by project) and mount paths in arguments and variables rewritten to there.
func containerCommand(ctx context.Context, reader client.Reader, binary, dir string, meta podMeta, spec *corev1.PodSpec, c *corev1.Container, project tokenProjector) (*command, error) {
	cmd := &command{Path: binary, Ports: map[int32]int{}}

	var env []corev1.EnvVar
	for _, from := range c.EnvFrom {
		vars, err := envFrom(ctx, reader, meta.Namespace, from)
		if err != nil {
			return nil, err
		}
		env = append(env, vars...)
	}
	resolved := map[string]string{}
	var order []string
	set := func(name, value string) {
		if _, ok := resolved[name]; !ok {
			order = append(order, name)
		}
		resolved[name] = value
	}
	for _, e := range env {
		set(e.Name, e.Value)
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, resolved))
			continue
		}
		v, ok, err := envValue(ctx, reader, meta, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("environment variable %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}

	// Volumes: materialise what can be, and map mount paths to local directories.
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		local, err := materialiseVolume(ctx, reader, meta.Namespace, dir, spec, m, project)
		if err != nil {
			return nil, err
		}
		mounts[m.MountPath] = local
		cmd.Rewrites = append(cmd.Rewrites, fmt.Sprintf("volume %s mounted at %s is %s", m.Name, m.MountPath, local))
	}
	remount := func(s string) string {
		paths := make([]string, 0, len(mounts))
		for p := range mounts {
			paths = append(paths, p)
		}
		sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
		for _, p := range paths {
			if i := strings.Index(s, p); i >= 0 {
				return s[:i] + mounts[p] + s[i+len(p):]
			}
		}
		return s
	}
	for _, name := range order {
		cmd.Env = append(cmd.Env, name+"="+remount(resolved[name]))
	}

	// Ports.
	for _, p := range c.Ports {
		local, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		cmd.Ports[p.ContainerPort] = local
		name := p.Name
		if name == "" {
			name = "port"
		}
		cmd.Rewrites = append(cmd.Rewrites, fmt.Sprintf("container port %s %d is 127.0.0.1:%d", name, p.ContainerPort, local))
	}

	argv := append([]string{}, c.Command...)
	if len(argv) > 0 {
		if filepath.Base(argv[0]) != filepath.Base(binary) {
			return nil, fmt.Errorf("container %s runs %q: only the operator's own program (%s) runs locally", c.Name, argv[0], filepath.Base(binary))
		}
		argv = argv[1:]
	}
	argv = append(argv, c.Args...)
	for _, a := range argv {
		a = remount(expand(a, resolved))
		cmd.Args = append(cmd.Args, rebind(a, cmd.Ports))
	}

	if rp := c.ReadinessProbe; rp != nil && rp.HTTPGet != nil {
		port, err := probePort(c, rp.HTTPGet.Port.String(), cmd.Ports)
		if err != nil {
			return nil, fmt.Errorf("readiness probe: %w", err)
		}
		path := rp.HTTPGet.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		scheme := "http"
		if rp.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		cmd.Readiness = fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, port, path)
	}
	return cmd, nil
}

// envValue resolves a valueFrom. ok is false for an optional reference to something missing.
func envValue(ctx context.Context, reader client.Reader, meta podMeta, from *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case from.FieldRef != nil:
		v, err := fieldValue(meta, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: meta.Namespace, Name: ref.Name}, s); err != nil {
			if apierrors.IsNotFound(err) && ref.Optional != nil && *ref.Optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q: %w", ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if ref.Optional != nil && *ref.Optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q has no key %q", ref.Name, ref.Key)
		}
		return string(v), true, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm := &corev1.ConfigMap{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: meta.Namespace, Name: ref.Name}, cm); err != nil {
			if apierrors.IsNotFound(err) && ref.Optional != nil && *ref.Optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %q: %w", ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if ref.Optional != nil && *ref.Optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %q has no key %q", ref.Name, ref.Key)
		}
		return v, true, nil
	}
	return "", false, fmt.Errorf("only fieldRef, secretKeyRef and configMapKeyRef are supported locally")
}

// fieldValue is the downward API.
func fieldValue(meta podMeta, path string) (string, error) {
	switch path {
	case "metadata.name":
		return meta.Name, nil
	case "metadata.namespace":
		return meta.Namespace, nil
	case "spec.serviceAccountName":
		return meta.ServiceAccount, nil
	case "spec.nodeName":
		return "localhost", nil
	case "status.podIP", "status.hostIP":
		return "127.0.0.1", nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": meta.Labels, "metadata.annotations": meta.Annotations} {
		if strings.HasPrefix(path, prefix+"['") && strings.HasSuffix(path, "']") {
			return m[strings.TrimSuffix(strings.TrimPrefix(path, prefix+"['"), "']")], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported locally", path)
}

func envFrom(ctx context.Context, reader client.Reader, namespace string, from corev1.EnvFromSource) ([]corev1.EnvVar, error) {
	var data map[string]string
	switch {
	case from.SecretRef != nil:
		s := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: from.SecretRef.Name}, s); err != nil {
			if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom secret %q: %w", from.SecretRef.Name, err)
		}
		data = map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
	case from.ConfigMapRef != nil:
		cm := &corev1.ConfigMap{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: from.ConfigMapRef.Name}, cm); err != nil {
			if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom configmap %q: %w", from.ConfigMapRef.Name, err)
		}
		data = cm.Data
	default:
		return nil, fmt.Errorf("envFrom: only secretRef and configMapRef are supported locally")
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]corev1.EnvVar, 0, len(keys))
	for _, k := range keys {
		out = append(out, corev1.EnvVar{Name: from.Prefix + k, Value: data[k]})
	}
	return out, nil
}

// materialiseVolume writes the volume a mount refers to under dir/volumes/<name> and returns
// that directory (plus the mount's subPath).
func materialiseVolume(ctx context.Context, reader client.Reader, namespace, dir string, spec *corev1.PodSpec, m corev1.VolumeMount, project tokenProjector) (string, error) {
	var vol *corev1.Volume
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == m.Name {
			vol = &spec.Volumes[i]
		}
	}
	if vol == nil {
		return "", fmt.Errorf("volume mount %q names no volume", m.Name)
	}
	local := filepath.Join(dir, "volumes", vol.Name)
	if err := os.RemoveAll(local); err != nil {
		return "", err
	}
	if err := os.MkdirAll(local, 0o700); err != nil {
		return "", err
	}
	var data map[string][]byte
	var items []corev1.KeyToPath
	switch {
	case vol.EmptyDir != nil:
	case vol.Secret != nil:
		s := &corev1.Secret{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: vol.Secret.SecretName}, s); err != nil {
			return "", fmt.Errorf("volume %q: secret %q: %w", vol.Name, vol.Secret.SecretName, err)
		}
		data, items = s.Data, vol.Secret.Items
	case vol.ConfigMap != nil:
		cm := &corev1.ConfigMap{}
		if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: vol.ConfigMap.Name}, cm); err != nil {
			return "", fmt.Errorf("volume %q: configmap %q: %w", vol.Name, vol.ConfigMap.Name, err)
		}
		data, items = map[string][]byte{}, vol.ConfigMap.Items
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		for k, v := range cm.BinaryData {
			data[k] = v
		}
	case vol.Projected != nil:
		for _, src := range vol.Projected.Sources {
			t := src.ServiceAccountToken
			if t == nil {
				return "", fmt.Errorf("volume %q: only serviceAccountToken projections are supported locally", vol.Name)
			}
			seconds := int64(3600)
			if t.ExpirationSeconds != nil {
				seconds = *t.ExpirationSeconds
			}
			if project == nil {
				return "", fmt.Errorf("volume %q: no ServiceAccount token can be projected here", vol.Name)
			}
			if err := project(ctx, t.Audience, seconds, filepath.Join(local, filepath.Clean("/"+t.Path))); err != nil {
				return "", fmt.Errorf("volume %q: %w", vol.Name, err)
			}
		}
	default:
		return "", fmt.Errorf("volume %q: only secret, configMap, emptyDir and projected token volumes are supported locally", vol.Name)
	}
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return "", fmt.Errorf("volume %q has no key %q", vol.Name, it.Key)
		}
		p := filepath.Join(local, filepath.Clean("/"+it.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, v, 0o600); err != nil {
			return "", err
		}
	}
	if m.SubPath != "" {
		return filepath.Join(local, filepath.Clean("/"+m.SubPath)), nil
	}
	return local, nil
}

// rebind rewrites an argument that binds a declared container port on every interface
// (":8080", "0.0.0.0:8080", "--x=:8080") to the loopback port it was given.
func rebind(arg string, ports map[int32]int) string {
	prefix, addr := "", arg
	if i := strings.LastIndex(arg, "="); i >= 0 {
		prefix, addr = arg[:i+1], arg[i+1:]
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return arg
	}
	switch host {
	case "", "0.0.0.0", "::", "127.0.0.1", "localhost":
	default:
		return arg
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return arg
	}
	if local, ok := ports[int32(n)]; ok {
		return prefix + "127.0.0.1:" + strconv.Itoa(local)
	}
	return arg
}

// probePort finds the loopback port of a probe's port (a name or a number).
func probePort(c *corev1.Container, port string, ports map[int32]int) (int, error) {
	n, err := strconv.Atoi(port)
	if err != nil {
		for _, p := range c.Ports {
			if p.Name == port {
				n = int(p.ContainerPort)
				err = nil
			}
		}
		if err != nil {
			return 0, fmt.Errorf("no container port is named %q", port)
		}
	}
	if local, ok := ports[int32(n)]; ok {
		return local, nil
	}
	return 0, fmt.Errorf("port %d is not a declared container port", n)
}

// expand replaces $(VAR) with the value of VAR as Kubernetes does: unknown references stay as
// they are and $$ escapes a $.
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
