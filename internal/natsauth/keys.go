package natsauth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/nats-io/nkeys"
)

// LoadIssuer reads an account nkey seed (SA...) from file: the key the callout signs with.
func LoadIssuer(file string) (nkeys.KeyPair, error) {
	return loadSeed(file, nkeys.PrefixByteAccount, "an account nkey seed (SA...)")
}

// LoadXKey reads a curve key seed (SX...) from file: the key requests are encrypted to.
func LoadXKey(file string) (nkeys.KeyPair, error) {
	return loadSeed(file, nkeys.PrefixByteCurve, "a curve key seed (SX...)")
}

func loadSeed(file string, prefix nkeys.PrefixByte, what string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	seed := bytes.TrimSpace(b)
	p, _, err := nkeys.DecodeSeed(seed)
	if err != nil || p != prefix {
		return nil, fmt.Errorf("%s does not hold %s", file, what)
	}
	return nkeys.FromSeed(seed)
}

// Keys are the secrets of an installation: the callout's signing and encryption keys and the
// two static users' passwords.
type Keys struct {
	// IssuerSeed and XKeySeed are nkey seeds (SA..., SX...).
	IssuerSeed, XKeySeed []byte
	// Issuer and XKey are their public keys, for the server configuration.
	Issuer, XKey string
	// AdminPassword and CalloutPassword are random.
	AdminPassword, CalloutPassword string
}

// GenerateKeys makes a new set of keys.
func GenerateKeys() (*Keys, error) {
	acc, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	xk, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	k := &Keys{}
	if k.IssuerSeed, err = acc.Seed(); err != nil {
		return nil, err
	}
	if k.Issuer, err = acc.PublicKey(); err != nil {
		return nil, err
	}
	if k.XKeySeed, err = xk.Seed(); err != nil {
		return nil, err
	}
	if k.XKey, err = xk.PublicKey(); err != nil {
		return nil, err
	}
	if k.AdminPassword, err = randomPassword(); err != nil {
		return nil, err
	}
	if k.CalloutPassword, err = randomPassword(); err != nil {
		return nil, err
	}
	return k, nil
}

// NewPassword is a new random password (32 characters of URL-safe base64), fit for a URL's
// user information as it is.
func NewPassword() (string, error) { return randomPassword() }

func randomPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
