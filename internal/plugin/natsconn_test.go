package plugin

import "testing"

func TestParseCreds(t *testing.T) {
	const creds = `-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.payload.sig
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4
------END USER NKEY SEED------

*************************************************************
`
	jwt, seed, err := parseCreds(creds)
	if err != nil || jwt != "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.payload.sig" || seed != "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4" {
		t.Errorf("parseCreds = %q, %q, %v", jwt, seed, err)
	}
	if _, _, err := parseCreds("user: x"); err == nil {
		t.Error("parseCreds accepted something that is not a creds file")
	}
}
