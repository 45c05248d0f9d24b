package receiverauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Settings are one endpoint's resolved receiver authentication: exactly one of OAuth2 and
// JWT. They are immutable.
type Settings struct {
	// OAuth2 gets an access token from a token endpoint (client-credentials grant).
	OAuth2 *OAuth2
	// JWT is signed by the dispatcher and sent as the bearer token.
	JWT *JWT
	// Timeout bounds one token request (the endpoint's attempt timeout).
	Timeout time.Duration

	fingerprint string
}

// AuthStyle is how the client's id and secret reach the token endpoint.
type AuthStyle int

const (
	// AuthBasic sends them as HTTP basic authentication (RFC 6749 section 2.3.1).
	AuthBasic AuthStyle = iota
	// AuthBody sends them as client_id and client_secret in the request body.
	AuthBody
)

// OAuth2 is the client-credentials grant.
type OAuth2 struct {
	TokenURL string
	ClientID string
	// ClientSecret authenticates the client, unless Assertion does.
	ClientSecret string
	// Assertion authenticates the client by a JWT it signs (private_key_jwt): issuer and
	// subject default to the client id, the audience to the token URL.
	Assertion *JWT
	Scopes    []string
	// Params are added to the token request (audience, resource and the extra parameters).
	Params    url.Values
	AuthStyle AuthStyle
}

// JWT is a key and the claims the dispatcher signs with it.
type JWT struct {
	// Algorithm is RS256, ES256 or EdDSA; the key is of its kind.
	Algorithm string
	KeyID     string
	Issuer    string
	Subject   string
	Audience  string
	Lifetime  time.Duration

	signer jose.Signer
	// keyDigest stands for the key in the fingerprint.
	keyDigest string
}

// Algorithms a JWT may be signed with.
const (
	RS256 = "RS256"
	ES256 = "ES256"
	EdDSA = "EdDSA"
)

// MaxLifetime bounds a JWT's lifetime; DefaultLifetime is used without one.
const (
	MaxLifetime     = time.Hour
	DefaultLifetime = 5 * time.Minute
)

// NewJWT parses the PEM private key (PKCS #8, PKCS #1 or SEC 1, not encrypted) and checks it
// is of the algorithm's kind: an RSA key of at least 2048 bits for RS256, a P-256 key for
// ES256, an Ed25519 key for EdDSA. The errors never quote the key.
func NewJWT(keyPEM []byte, alg, keyID, issuer, subject, audience string, lifetime time.Duration) (*JWT, error) {
	key, err := parsePrivateKey(keyPEM)
	if err != nil {
		return nil, err
	}
	var ja jose.SignatureAlgorithm
	switch alg {
	case RS256:
		k, ok := key.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("algorithm RS256 needs an RSA key, the key is %s", kindOf(key))
		}
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("the RSA key has %d bits; RS256 needs at least 2048", k.N.BitLen())
		}
		ja = jose.RS256
	case ES256:
		k, ok := key.(*ecdsa.PrivateKey)
		if !ok || k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("algorithm ES256 needs an ECDSA P-256 key, the key is %s", kindOf(key))
		}
		ja = jose.ES256
	case EdDSA:
		if _, ok := key.(ed25519.PrivateKey); !ok {
			return nil, fmt.Errorf("algorithm EdDSA needs an Ed25519 key, the key is %s", kindOf(key))
		}
		ja = jose.EdDSA
	default:
		return nil, fmt.Errorf("algorithm %q is not RS256, ES256 or EdDSA", alg)
	}
	if lifetime <= 0 {
		lifetime = DefaultLifetime
	}
	lifetime = min(lifetime, MaxLifetime)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: ja, Key: jose.JSONWebKey{Key: key, KeyID: keyID}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("making the JWT signer: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("reading the key's public part: %w", err)
	}
	// The public key stands for the private one: a digest of it changes with the key and
	// reveals nothing secret.
	sum := sha256.Sum256(pub)
	return &JWT{Algorithm: alg, KeyID: keyID, Issuer: issuer, Subject: subject, Audience: audience, Lifetime: lifetime,
		signer: signer, keyDigest: hex.EncodeToString(sum[:])}, nil
}

func parsePrivateKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("the key is not PEM (-----BEGIN PRIVATE KEY----- ...)")
	}
	if strings.Contains(block.Type, "ENCRYPTED") || block.Headers["Proc-Type"] != "" {
		return nil, errors.New("the key is encrypted; give it unencrypted (the Secret protects it)")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("the PEM block is %q, not a private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("the %s does not parse", strings.ToLower(block.Type))
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("the key is %s, which cannot sign", kindOf(key))
	}
	return s, nil
}

func kindOf(key any) string {
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return fmt.Sprintf("RSA (%d bits)", k.N.BitLen())
	case *ecdsa.PrivateKey:
		return "ECDSA " + k.Curve.Params().Name
	case ed25519.PrivateKey:
		return "Ed25519"
	}
	return fmt.Sprintf("%T", key)
}

// Finish computes what Same compares; call it once the settings are complete.
func (s *Settings) Finish() *Settings {
	h := sha256.New()
	line := func(parts ...string) {
		for _, p := range parts {
			fmt.Fprintf(h, "%d:%s;", len(p), p)
		}
		h.Write([]byte{'\n'})
	}
	jwtLine := func(j *JWT) {
		if j != nil {
			line("jwt", j.Algorithm, j.KeyID, j.Issuer, j.Subject, j.Audience, j.Lifetime.String(), j.keyDigest)
		}
	}
	line("timeout", s.Timeout.String())
	if o := s.OAuth2; o != nil {
		line("oauth2", o.TokenURL, o.ClientID, o.ClientSecret, fmt.Sprint(o.AuthStyle))
		line(o.Scopes...)
		keys := make([]string, 0, len(o.Params))
		for k := range o.Params {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			line(append([]string{k}, o.Params[k]...)...)
		}
		jwtLine(o.Assertion)
	}
	jwtLine(s.JWT)
	s.fingerprint = hex.EncodeToString(h.Sum(nil))
	return s
}

// Same reports whether a token of a serves b: nothing the token depends on changed.
func Same(a, b *Settings) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.fingerprint == b.fingerprint
}

// Secrets are the values of the settings that must never be stored: the client secret (a
// token endpoint or a receiver may echo it back).
func (s *Settings) Secrets() []string {
	if s == nil || s.OAuth2 == nil || s.OAuth2.ClientSecret == "" {
		return nil
	}
	return []string{s.OAuth2.ClientSecret}
}
