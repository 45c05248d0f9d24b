// Package metricsauth is how the controller, the callout, the ingress and every dispatcher
// serve /metrics, over HTTPS with a self-signed certificate generated in memory (so a
// read-only root filesystem is fine), HTTP/1.1 only (HTTP/2's rapid-reset and stream attacks,
// as kubebuilder disables it). Two ways of knowing the scraper:
//
//   - ServerOptions, as kubebuilder v4 scaffolds it, for the processes of the release
//     namespace: a TokenReview of the scraper's bearer token and a SubjectAccessReview of
//     `get` on the /metrics non-resource URL (controller-runtime's
//     filters.WithAuthenticationAndAuthorization). The scraper needs a token whose identity is
//     bound to a ClusterRole with that rule (the chart's metrics-reader), and the serving
//     process needs to create TokenReviews and SubjectAccessReviews.
//   - ClientCertServerOptions, for the dispatchers, which run in tenants' namespaces as
//     ServiceAccounts a tenant may run its own pods as: mutual TLS, a client certificate
//     signed by the installation's scraper CA (and, when asked, of one subject common name).
//     Nothing is asked of the API server, so a dispatcher's ServiceAccount holds no
//     cluster-wide TokenReview or SubjectAccessReview grant; only the CA's certificate (public)
//     reaches the tenant's namespace.
package metricsauth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// ServerOptions are the metrics server options for addr ("0" disables the server). With
// secure, the server speaks HTTPS with a self-signed certificate (scrapers skip its
// verification or trust it otherwise), and every request must carry a bearer token allowed to
// get /metrics. Without secure it is plain HTTP open to whoever reaches the port: for the
// local stack, or behind a NetworkPolicy.
func ServerOptions(addr string, secure bool) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr}
	if secure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		o.TLSOpts = []func(*tls.Config){serverTLS}
	}
	return o
}

// ClientCerts says which scrapers a server of ClientCertServerOptions accepts.
type ClientCerts struct {
	// CAFile is a PEM bundle of the CA certificates whose client certificates are accepted.
	// It is read again when it changes (a mounted Secret the kubelet renews), so the CA can
	// be rotated without a restart: mount the old and the new CA together meanwhile.
	CAFile string
	// Name, when not empty, is the subject common name a client certificate must carry.
	Name string
}

// ClientCertServerOptions are the metrics server options for addr ("0" disables the server)
// that authenticate scrapers by mutual TLS: HTTPS with a self-signed certificate, and a
// handshake that fails unless the client presents a certificate for client authentication
// that chains to c.CAFile (and carries c.Name). It asks the API server nothing. It fails when
// c.CAFile holds no certificate.
func ClientCertServerOptions(addr string, c ClientCerts) (metricsserver.Options, error) {
	v := &clientVerifier{certs: c}
	if _, err := v.roots(); err != nil {
		return metricsserver.Options{}, err
	}
	return metricsserver.Options{
		BindAddress:   addr,
		SecureServing: true,
		TLSOpts: []func(*tls.Config){serverTLS, func(cfg *tls.Config) {
			// Any certificate is asked for, and verified here against the CA file as it is
			// now (ClientCAs would freeze it at start).
			cfg.ClientAuth = tls.RequireAnyClientCert
			cfg.VerifyPeerCertificate = v.verify
		}},
	}, nil
}

func serverTLS(c *tls.Config) {
	c.NextProtos = []string{"http/1.1"}
	c.MinVersion = tls.VersionTLS12
}

// Bounds on what is read: a CA bundle, and the chain a client presents.
const (
	maxCABytes    = 1 << 20
	maxClientCert = 4
)

// clientVerifier checks client certificates against the CA file, read again when its
// modification time or size changes.
type clientVerifier struct {
	certs ClientCerts

	mu    sync.Mutex
	mtime time.Time
	size  int64
	pool  *x509.CertPool
}

// roots is the CA pool of the file as it is now.
func (v *clientVerifier) roots() (*x509.CertPool, error) {
	fi, err := os.Stat(v.certs.CAFile)
	if err != nil {
		return nil, fmt.Errorf("scraper CA: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pool != nil && fi.ModTime().Equal(v.mtime) && fi.Size() == v.size {
		return v.pool, nil
	}
	f, err := os.Open(v.certs.CAFile)
	if err != nil {
		return nil, fmt.Errorf("scraper CA: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCABytes+1))
	if err != nil {
		return nil, fmt.Errorf("scraper CA: %w", err)
	}
	if len(b) > maxCABytes {
		return nil, fmt.Errorf("scraper CA %s: larger than %d bytes", v.certs.CAFile, maxCABytes)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("scraper CA %s: %w", v.certs.CAFile, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("scraper CA %s: no PEM certificate", v.certs.CAFile)
	}
	v.pool, v.mtime, v.size = pool, fi.ModTime(), fi.Size()
	return pool, nil
}

// verify is the handshake's check of the client's certificate chain.
func (v *clientVerifier) verify(raw [][]byte, _ [][]*x509.Certificate) error {
	if len(raw) == 0 {
		return errors.New("no client certificate")
	}
	if len(raw) > maxClientCert {
		return fmt.Errorf("a client certificate chain of more than %d certificates", maxClientCert)
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return fmt.Errorf("client certificate: %w", err)
		}
		certs[i] = c
	}
	roots, err := v.roots()
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("client certificate: %w", err)
	}
	if v.certs.Name != "" && leaf.Subject.CommonName != v.certs.Name {
		return fmt.Errorf("client certificate of %q, want %q", leaf.Subject.CommonName, v.certs.Name)
	}
	return nil
}
