package deliver

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/dispatcher/attempt"
	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/receiverauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// What a receiver asks beyond the signature, as the attempt meets it: the token of spec.auth
// (internal/receiverauth) and the egress proxy (internal/egressproxy). The rest of the attempt
// knows of them only through exchange and the transport (attempt.NewTransport).

// exchange sends one attempt's request, authorized when the endpoint has spec.auth: the token
// comes from the endpoint's source (cached; fetched through the endpoint's client within the
// attempt's timeout); a token that cannot be had fails the attempt as auth_failed without a
// request; a 401 drops the token and the request is sent once more with a new one. Token values
// are scrubbed from what the receiver answered.
func (w *Worker) exchange(c *endpoint.Config, req *attempt.Request) decide.Outcome {
	client := w.httpClient(c)
	src := w.auth.Load()
	if c.Auth == nil || src == nil || c.ConfigError != nil || c.URLBlocked != nil {
		return attempt.Send(w.f.Hard, client, c, req, time.Now())
	}
	start := time.Now()
	tok, o, ok := w.token(c, src, client, start)
	if !ok {
		return o
	}
	req.Authorization = tok.Header
	o = attempt.Send(w.f.Hard, client, c, req, time.Now())
	if o.StatusCode == http.StatusUnauthorized && w.f.Hard.Err() == nil {
		// The receiver refused the token (revoked, rotated, or expired early): drop it and
		// try once more with a new one.
		src.Invalidate(tok)
		tok2, fo, ok := w.token(c, src, client, start)
		if !ok {
			return fo
		}
		req.Authorization = tok2.Header
		o = attempt.Send(w.f.Hard, client, c, req, time.Now())
		o.Body = scrubToken(o.Body, tok)
		o.Err = scrubToken(o.Err, tok)
		tok = tok2
	}
	o.Start = start
	o.Latency = time.Since(start)
	o.Body, o.Err = scrubToken(o.Body, tok), scrubToken(o.Err, tok)
	return o
}

// token gets the endpoint's token within the attempt's timeout, or the attempt's failure. The
// cached token needs no context (no timer per attempt); only a fetch is waited for.
func (w *Worker) token(c *endpoint.Config, src *receiverauth.Source, client *http.Client, start time.Time) (receiverauth.Token, decide.Outcome, bool) {
	if tok, ok := src.Cached(client); ok {
		return tok, decide.Outcome{}, true
	}
	ctx, cancel := context.WithTimeout(w.f.Hard, c.Timeout)
	defer cancel()
	tok, err := src.Token(ctx, client)
	if err == nil {
		return tok, decide.Outcome{}, true
	}
	return receiverauth.Token{}, decide.Outcome{Start: start, Latency: time.Since(start), Reason: records.FailAuth, Err: err.Error()}, false
}

// scrubToken removes a token (and the credential without its scheme) from stored text.
func scrubToken(s string, tok receiverauth.Token) string {
	if s == "" || tok.Header == "" {
		return s
	}
	_, cred, _ := strings.Cut(tok.Header, " ")
	if len(cred) >= 6 && strings.Contains(s, cred) {
		s = strings.ReplaceAll(s, cred, "[redacted]")
	}
	return s
}

// configureAuth keeps the worker's token source while the endpoint's auth settings stay the
// same, so a change elsewhere in the endpoint keeps its cached token.
func (w *Worker) configureAuth(c *endpoint.Config) {
	if c.Auth == nil {
		w.auth.Store(nil)
		return
	}
	if cur := w.auth.Load(); cur == nil || !receiverauth.Same(cur.Settings(), c.Auth) {
		w.auth.Store(receiverauth.NewSource(c.Auth))
	}
}
