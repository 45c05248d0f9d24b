package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLSFiles are a CA and the certificates it signed, as PEM files: a server certificate for
// 127.0.0.1 and localhost, a client certificate, and a peer certificate (both server and
// client, for 127.0.0.1 and localhost) such as servers present to each other on routes,
// gateways and leaf node connections.
type TLSFiles struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	PeerCert, PeerKey     string
}

// WriteTLS makes a new CA, server and client certificate (valid for a day) in dir.
func WriteTLS(dir string) (*TLSFiles, error) { return WriteTLSFor(dir) }

// WriteTLSFor is WriteTLS with a server certificate also valid for hosts (DNS names, with
// wildcards, or IP addresses), e.g. the Service names of servers in a cluster.
func WriteTLSFor(dir string, hosts ...string) (*TLSFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f := &TLSFiles{
		CA:         filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
		PeerCert: filepath.Join(dir, "peer.crt"), PeerKey: filepath.Join(dir, "peer.key"),
	}
	peer := serverTemplate(hosts)
	peer.Subject.CommonName = "nats peer"
	peer.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "webhook-operator test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	for i, leaf := range []struct {
		cert, key string
		tmpl      *x509.Certificate
	}{
		{f.ServerCert, f.ServerKey, serverTemplate(hosts)},
		{f.ClientCert, f.ClientKey, &x509.Certificate{Subject: pkix.Name{CommonName: "webhook-operator"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
		{f.PeerCert, f.PeerKey, peer},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		t := leaf.tmpl
		t.SerialNumber = big.NewInt(int64(i) + 2)
		t.NotBefore, t.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		t.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, t, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := writePEM(leaf.cert, "CERTIFICATE", der); err != nil {
			return nil, err
		}
		if err := writePEM(leaf.key, "EC PRIVATE KEY", kb); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func serverTemplate(hosts []string) *x509.Certificate {
	t := &x509.Certificate{Subject: pkix.Name{CommonName: "nats"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			t.IPAddresses = append(t.IPAddresses, ip)
		} else {
			t.DNSNames = append(t.DNSNames, h)
		}
	}
	return t
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
