package controllers

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
)

// The dispatchers' OpenTelemetry settings come from two places: --dispatcher-otel-env
// (Options.DispatcherOTELEnv), plain values written into every dispatcher's pod template, and
// --dispatcher-otel-env-secret (Options.DispatcherOTELSecret), a Secret of the controller's
// namespace mirrored into each dispatcher namespace as names.OTELSecret, whose OTEL_* keys
// reach the dispatchers by reference and whose TLS files are mounted. What would be a secret
// in a pod template (headers, which carry the collector's credentials, and key files) may come
// only from the Secret.

var otelEnvPattern = regexp.MustCompile(`^OTEL_[A-Z0-9_]+$`)

// IsOTELEnvName reports whether name is an OpenTelemetry environment variable name (OTEL_
// followed by capitals, digits or '_'): the only variables the installation may set on
// dispatchers, so it cannot override their identity or NATS credentials.
func IsOTELEnvName(name string) bool { return otelEnvPattern.MatchString(name) }

// OTELSecretOnly says why the OTEL_* variable name may not be given as a plain value that every
// dispatcher Deployment shows ("" when it may): headers carry the collector's credentials, and
// certificate and key variables name files a dispatcher only has from the Secret.
func OTELSecretOnly(name string) string {
	switch {
	case strings.HasSuffix(name, "_HEADERS"):
		return "its headers carry credentials, which would show in every dispatcher's pod template; give it as a key of the Secret of --dispatcher-otel-env-secret"
	case strings.HasSuffix(name, "_CLIENT_KEY"), strings.HasSuffix(name, "_CLIENT_CERTIFICATE"), strings.HasSuffix(name, "_CERTIFICATE"):
		return "it names a file no dispatcher has; put the file in the Secret of --dispatcher-otel-env-secret (keys ca.crt, tls.crt, tls.key), which is mounted and named for it"
	}
	return ""
}

// otelKeys keeps of the tracing Secret's data what dispatchers get: OTEL_* variables and the
// TLS files (ca.crt, tls.crt, tls.key); it returns the other keys, which are left out.
func otelKeys(data map[string][]byte) (kept map[string][]byte, ignored []string) {
	kept = map[string][]byte{}
	for k, v := range data {
		if IsOTELEnvName(k) || slices.ContainsFunc(otelFiles, func(f struct{ key, env string }) bool { return f.key == k }) {
			kept[k] = v
		} else {
			ignored = append(ignored, k)
		}
	}
	slices.Sort(ignored)
	return kept, ignored
}

// otelCredentials reads the --dispatcher-otel-env-secret, again only when its resourceVersion
// changed. It returns nil when none is configured, and when the Secret does not exist (an
// error in the log): tracing credentials missing must not keep dispatchers from delivering.
func (r *DispatcherReconciler) otelCredentials(ctx context.Context) (*mirror, error) {
	key := r.Options.DispatcherOTELSecret
	if key.Name == "" {
		return nil, nil
	}
	m, err := r.readMirror(ctx, key, &r.otel, func(data map[string][]byte) map[string][]byte {
		kept, ignored := otelKeys(data)
		if len(ignored) > 0 {
			ctrl.LoggerFrom(ctx).Info("keys of the dispatchers' tracing Secret that are neither OTEL_* variables nor ca.crt, tls.crt, tls.key are left out", "secret", key.String(), "keys", ignored)
		}
		return kept
	})
	switch {
	case apierrors.IsNotFound(err):
		ctrl.LoggerFrom(ctx).Error(err, "the dispatchers' tracing Secret (--dispatcher-otel-env-secret) does not exist: dispatchers run without it", "secret", key.String())
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("tracing Secret %s: %w", key, err)
	}
	return m, nil
}
