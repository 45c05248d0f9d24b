package metricsauth_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A secure metrics server, against a real API server: HTTPS only; no token is 401, a valid
// token of an identity without the metrics-reader rule is 403, a token bound to it reads the
// metrics; a made-up token is refused. Insecure, it is plain HTTP open to anyone.
func TestServerOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cs := kubernetes.NewForConfigOrDie(cp.Config)

	const ns = "monitoring"
	for _, o := range []struct {
		create func() error
	}{
		{func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
				Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}}}, metav1.CreateOptions{})
			return err
		}},
	} {
		if err := o.create(); err != nil {
			t.Fatal(err)
		}
	}
	token := func(sa string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, stranger := token("prometheus"), token("stranger")
	ctrlmetrics.Registry.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "metricsauth_test_total", Help: "a metric to read"}))

	secure := serve(t, ctx, cp.Config, metricsauth.ServerOptions(freeAddr(t), true))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, c := range []struct {
		name, token string
		code        int
	}{
		{"no token", "", http.StatusUnauthorized},
		// controller-runtime's filter answers 500 when the TokenReview fails on a token
		// that is not a JWT; refused all the same.
		{"a made-up token", "not-a-token", http.StatusInternalServerError},
		{"a token without metrics-reader", stranger, http.StatusForbidden},
		{"a metrics reader", reader, http.StatusOK},
	} {
		code, body := get(t, hc, "https://"+secure+"/metrics", c.token)
		if code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.code)
		}
		if code == http.StatusOK && !strings.Contains(body, "metricsauth_test_total") {
			t.Errorf("%s: the metrics lack the registered counter:\n%s", c.name, body)
		}
		if code != http.StatusOK && strings.Contains(body, "metricsauth_test_total") {
			t.Errorf("%s: metrics served with %d", c.name, code)
		}
	}
	if code, _ := get(t, &http.Client{Timeout: 5 * time.Second}, "http://"+secure+"/metrics", reader); code == http.StatusOK {
		t.Errorf("the secure server answered plain HTTP")
	}

	plain := serve(t, ctx, cp.Config, metricsauth.ServerOptions(freeAddr(t), false))
	if code, body := get(t, &http.Client{Timeout: 5 * time.Second}, "http://"+plain+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "metricsauth_test_total") {
		t.Errorf("insecure: %d %s", code, body)
	}
}

// serve starts a metrics server with o and waits until it listens; it returns its address.
func serve(t *testing.T, ctx context.Context, cfg *rest.Config, o metricsserver.Options) string {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(o, cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Start(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() error {
		c, err := net.Dial("tcp", o.BindAddress)
		if err == nil {
			_ = c.Close()
		}
		return err
	}, "the metrics server to listen on %s", o.BindAddress)
	return o.BindAddress
}

func get(t *testing.T, hc *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A dispatcher's metrics server (ClientCertServerOptions, what `webhook-operator dispatcher
// --metrics-secure` serves) knows its scrapers without the API server: the handshake fails
// without a client certificate, with one of another CA, with a server-only certificate of the
// scraper CA and, when a name is asked, with another subject; a client certificate of the
// scraper CA reads the metrics. The CA file is read again when it changes (a rotation), and a
// file without a certificate is refused at start.
func TestClientCertServerOptions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	scraperCA, err := testenv.WriteTLS(filepath.Join(dir, "scraper"))
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := testenv.WriteTLS(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt") // the mounted mirror of the scraper CA
	copyFile(t, scraperCA.CA, caFile)
	ctrlmetrics.Registry.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "metricsauth_mtls_test_total", Help: "a metric to read"}))

	// No API server at all: nothing is reviewed.
	noAPI := &rest.Config{Host: "https://127.0.0.1:1"}
	byCert := func(name string) string {
		t.Helper()
		o, err := metricsauth.ClientCertServerOptions(freeAddr(t), metricsauth.ClientCerts{CAFile: caFile, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return serve(t, ctx, noAPI, o)
	}
	anyName, named := byCert(""), byCert("webhook-operator")

	client := func(cert, key string) *http.Client {
		t.Helper()
		c := &tls.Config{InsecureSkipVerify: true} // the server's certificate is self-signed
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				t.Fatal(err)
			}
			c.Certificates = []tls.Certificate{pair}
		}
		// A new connection for each request: every case is a handshake of its own.
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c, DisableKeepAlives: true}}
	}
	for _, c := range []struct {
		name      string
		addr      string
		cert, key string
		ok        bool
	}{
		{"no client certificate", anyName, "", "", false},
		{"a client certificate of another CA", anyName, otherCA.ClientCert, otherCA.ClientKey, false},
		{"a server certificate of the scraper CA", anyName, scraperCA.ServerCert, scraperCA.ServerKey, false},
		{"the scraper's client certificate", anyName, scraperCA.ClientCert, scraperCA.ClientKey, true},
		{"the scraper's client certificate, its name asked", named, scraperCA.ClientCert, scraperCA.ClientKey, true},
		{"a peer certificate of the scraper CA, another name asked", named, scraperCA.PeerCert, scraperCA.PeerKey, false},
	} {
		// A bearer token is no way in.
		code, body := get(t, client(c.cert, c.key), "https://"+c.addr+"/metrics", "a-token")
		switch {
		case c.ok && (code != http.StatusOK || !strings.Contains(body, "metricsauth_mtls_test_total")):
			t.Errorf("%s: %d %s, want the metrics", c.name, code, body)
		case !c.ok && code != 0:
			t.Errorf("%s: answered %d, want a failed handshake", c.name, code)
		}
	}
	// The peer certificate (client and server auth) of the scraper CA is refused only for its name.
	if code, _ := get(t, client(scraperCA.PeerCert, scraperCA.PeerKey), "https://"+anyName+"/metrics", ""); code != http.StatusOK {
		t.Errorf("a client-auth certificate of the scraper CA without a name asked: %d", code)
	}
	if code, _ := get(t, &http.Client{Timeout: 5 * time.Second}, "http://"+anyName+"/metrics", ""); code == http.StatusOK {
		t.Errorf("the mutual-TLS server answered plain HTTP")
	}

	// Rotation: the mounted file now holds the other CA.
	copyFile(t, otherCA.CA, caFile)
	testenv.Eventually(t, 10*time.Second, func() error {
		if code, _ := get(t, client(otherCA.ClientCert, otherCA.ClientKey), "https://"+anyName+"/metrics", ""); code != http.StatusOK {
			return fmt.Errorf("the new CA's client: %d", code)
		}
		return nil
	}, "the rotated CA to be read")
	if code, _ := get(t, client(scraperCA.ClientCert, scraperCA.ClientKey), "https://"+anyName+"/metrics", ""); code != 0 {
		t.Errorf("the old CA's client after the rotation: %d", code)
	}

	if err := os.WriteFile(caFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := metricsauth.ClientCertServerOptions(freeAddr(t), metricsauth.ClientCerts{CAFile: caFile}); err == nil {
		t.Error("a CA file without a certificate was accepted")
	}
	if _, err := metricsauth.ClientCertServerOptions(freeAddr(t), metricsauth.ClientCerts{CAFile: filepath.Join(dir, "missing")}); err == nil {
		t.Error("a missing CA file was accepted")
	}
}

// copyFile writes src's content to dst through a new file renamed over it, as the kubelet
// swaps a mounted Secret's files.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}
