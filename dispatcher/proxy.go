package dispatcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
)

// installationProxy is the installation's egress proxy (--egress-proxy) with its credentials
// read from files at every new tunnel, so a rotated Secret needs no restart; nil without one.
func installationProxy(o Options) (*egressproxy.Proxy, error) {
	if o.Config.EgressProxy == "" {
		return nil, nil
	}
	u, err := egressproxy.Parse(o.Config.EgressProxy)
	if err != nil {
		return nil, fmt.Errorf("--egress-proxy: %w", err)
	}
	p := &egressproxy.Proxy{URL: u, Key: "installation"}
	if dir := o.EgressProxyCredentials; dir != "" {
		p.Key += " " + dir
		p.Credentials = func() (string, string, error) {
			user, err1 := readCredential(filepath.Join(dir, corev1.BasicAuthUsernameKey))
			pass, err2 := readCredential(filepath.Join(dir, corev1.BasicAuthPasswordKey))
			if err := errors.Join(err1, err2); err != nil {
				return "", "", err
			}
			return user, pass, nil
		}
	}
	return p, nil
}

// readCredential reads one credential file (a missing one is empty), without quoting it.
func readCredential(path string) (string, error) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading %s: %w", filepath.Base(path), err)
	case len(b) > 4096:
		return "", fmt.Errorf("%s is longer than 4096 bytes", filepath.Base(path))
	}
	return strings.TrimSpace(string(b)), nil
}
