package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
)

// The installation's egress proxy (--egress-proxy, opconfig.Config.EgressProxy) reaches every
// dispatcher as an argument; its credentials come from --egress-proxy-credentials-secret
// (Options.EgressProxySecret), a Secret of the controller's namespace whose username and
// password keys the controller mirrors into each dispatcher namespace as
// names.EgressProxySecret, mounted at egressProxyMountPath. Whoever may read Secrets in a
// dispatcher namespace reads them: give the proxy credentials that only open its tunnels.

// egressProxyMountPath is where a dispatcher reads the proxy's credentials.
const egressProxyMountPath = "/etc/webhook-operator/egress-proxy"

// egressProxyKeys are the keys of a kubernetes.io/basic-auth Secret, the only ones mirrored.
var egressProxyKeys = []string{corev1.BasicAuthUsernameKey, corev1.BasicAuthPasswordKey}

// egressProxyCredentials reads the --egress-proxy-credentials-secret, again only when its
// resourceVersion changed; nil when none is configured. A Secret that does not exist is an
// error in the log and no credentials: the proxy then answers 407 and deliveries fail with
// reason proxy, which says what is wrong where the endpoints' owners look.
func (r *DispatcherReconciler) egressProxyCredentials(ctx context.Context) (*mirror, error) {
	key := r.Options.EgressProxySecret
	if key.Name == "" {
		return nil, nil
	}
	m, err := r.readMirror(ctx, key, &r.egress, func(data map[string][]byte) map[string][]byte {
		kept := map[string][]byte{}
		for _, k := range egressProxyKeys {
			if v, ok := data[k]; ok {
				kept[k] = v
			}
		}
		return kept
	})
	switch {
	case apierrors.IsNotFound(err):
		ctrl.LoggerFrom(ctx).Error(err, "the egress proxy's credentials Secret (--egress-proxy-credentials-secret) does not exist: dispatchers reach the proxy without credentials", "secret", key.String())
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("egress proxy credentials Secret %s: %w", key, err)
	}
	return m, nil
}
