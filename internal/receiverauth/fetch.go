package receiverauth

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Error is a token that could not be had. Its message says why and never holds a secret.
type Error struct{ Message string }

func (e *Error) Error() string { return e.Message }

func errorf(format string, a ...any) *Error {
	return &Error{Message: records.Bound(fmt.Sprintf(format, a...), records.MaxErrorText)}
}

// maxTokenBytes bounds an access token: it travels in a header of every request.
const maxTokenBytes = 16 << 10

// assertionType is the client_assertion_type of private_key_jwt (RFC 7523 section 2.2).
const assertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

// sign signs a JWT with j's key and claims (iss, sub, aud given when j leaves them empty),
// issued now and expiring after j's lifetime, with a fresh jti.
func (j *JWT) sign(now time.Time, iss, sub, aud string) (string, time.Time, error) {
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	exp := now.Add(j.Lifetime)
	c := jwt.Claims{
		Issuer:   first(j.Issuer, iss),
		Subject:  first(j.Subject, j.Issuer, sub),
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(exp),
		ID:       base64.RawURLEncoding.EncodeToString(id),
	}
	if a := first(j.Audience, aud); a != "" {
		c.Audience = jwt.Audience{a}
	}
	s, err := jwt.Signed(j.signer).Claims(c).Serialize()
	if err != nil {
		return "", time.Time{}, errorf("signing the JWT: %v", err)
	}
	return s, exp, nil
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// fetch gets a new token: it signs the bearer JWT, or asks the token endpoint.
func (s *Settings) fetch(ctx context.Context, client *http.Client, now time.Time) (value string, expiry time.Time, err error) {
	if s.JWT != nil {
		tok, exp, err := s.JWT.sign(now, "", "", "")
		if err != nil {
			return "", time.Time{}, err
		}
		return "Bearer " + tok, exp, nil
	}
	return s.OAuth2.fetch(ctx, client, now)
}

// fetch asks the token endpoint for an access token (client-credentials grant) through client,
// which follows no redirect: the client's credentials go to the token URL's host only.
func (o *OAuth2) fetch(ctx context.Context, client *http.Client, now time.Time) (string, time.Time, error) {
	params := url.Values{}
	for k, v := range o.Params {
		params[k] = v
	}
	cfg := clientcredentials.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, TokenURL: o.TokenURL, Scopes: o.Scopes,
		EndpointParams: params, AuthStyle: oauth2.AuthStyleInHeader}
	if o.AuthStyle == AuthBody {
		cfg.AuthStyle = oauth2.AuthStyleInParams
	}
	var secrets []string
	if o.Assertion != nil {
		assertion, _, err := o.Assertion.sign(now, o.ClientID, o.ClientID, o.TokenURL)
		if err != nil {
			return "", time.Time{}, err
		}
		params.Set("client_assertion_type", assertionType)
		params.Set("client_assertion", assertion)
		// The client id goes in the body beside the assertion; there is no secret.
		cfg.ClientSecret, cfg.AuthStyle = "", oauth2.AuthStyleInParams
		secrets = append(secrets, assertion)
	} else if o.ClientSecret != "" {
		secrets = append(secrets, credentialForms(o.ClientID, o.ClientSecret)...)
	}
	tok, err := cfg.Token(context.WithValue(ctx, oauth2.HTTPClient, client))
	if err != nil {
		return "", time.Time{}, tokenError(o.TokenURL, err, secrets)
	}
	if !strings.EqualFold(tok.Type(), "Bearer") {
		return "", time.Time{}, errorf("the token endpoint issued a token of type %q; only Bearer tokens are sent", records.Bound(tok.Type(), 64))
	}
	if len(tok.AccessToken) > maxTokenBytes || !validHeaderValue(tok.AccessToken) {
		return "", time.Time{}, errorf("the token endpoint issued an access token that cannot be sent as a header (over %d bytes or with control characters)", maxTokenBytes)
	}
	return "Bearer " + tok.AccessToken, tok.Expiry, nil
}

// credentialForms are the forms in which the client secret travels, and in which a token
// endpoint may echo it back: as it is, form-encoded (client_secret_post), and inside the basic
// credentials (client_secret_basic, with and without the form encoding RFC 6749 asks for).
func credentialForms(id, secret string) []string {
	b64 := base64.StdEncoding.EncodeToString
	return []string{secret, url.QueryEscape(secret), b64([]byte(url.QueryEscape(id) + ":" + url.QueryEscape(secret))), b64([]byte(id + ":" + secret))}
}

// tokenError says why a token request failed, without the request's URL (whose query may hold
// something) or any of secrets, which are removed before anything is cut short (a secret cut
// in two would escape).
func tokenError(tokenURL string, err error, secrets []string) *Error {
	redact := func(msg string) string {
		for _, s := range secrets {
			if len(s) >= 4 {
				msg = strings.ReplaceAll(msg, s, "[redacted]")
			}
		}
		return msg
	}
	host := "the token endpoint"
	if u, perr := url.Parse(tokenURL); perr == nil && u.Host != "" {
		host = "the token endpoint " + u.Host
	}
	var re *oauth2.RetrieveError
	var ue *url.Error
	msg := ""
	switch {
	case errors.As(err, &re):
		status := "an error"
		if re.Response != nil {
			status = re.Response.Status
		}
		msg = host + " answered " + status
		switch {
		case re.ErrorCode != "" && re.ErrorDescription != "":
			msg += ": " + redact(re.ErrorCode) + ": " + redact(re.ErrorDescription)
		case re.ErrorCode != "":
			msg += ": " + redact(re.ErrorCode)
		case len(re.Body) > 0:
			msg += ": " + records.Bound(redact(strings.TrimSpace(string(re.Body))), 256)
		}
		if re.Response != nil && re.Response.StatusCode >= 300 && re.Response.StatusCode < 400 {
			msg += " (redirects are not followed)"
		}
	case errors.As(err, &ue):
		msg = "requesting a token from " + host + ": " + ue.Err.Error()
	default:
		msg = "requesting a token from " + host + ": " + err.Error()
	}
	return errorf("%s", redact(msg))
}

// validHeaderValue reports whether v may be sent in a header: no control characters but tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
