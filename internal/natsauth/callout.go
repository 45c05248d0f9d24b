package natsauth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
)

// Subjects and headers of nats-server's auth callout protocol.
const (
	// CalloutSubject is where the server sends authorization requests, in the callout account.
	CalloutSubject = "$SYS.REQ.USER.AUTH"
	// xkeyHeader carries the server's public curve key when the request is encrypted.
	xkeyHeader = "Nats-Server-Xkey"
	// QueueGroup spreads requests over every controller replica.
	QueueGroup = "webhook-operator-callout"
)

// Bounds of what a connection may send.
const (
	// MaxTokenBytes bounds a bearer token (Kubernetes tokens are a few KiB at most).
	MaxTokenBytes = 16 << 10
	// DefaultMaxSession is how long a connection's authorization lasts at most; it ends
	// earlier when the token expires, and the client reconnects with a fresh one.
	DefaultMaxSession = time.Hour
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// purgeSuffix ends the NATS user of a connection that asks to purge dead letters.
const purgeSuffix = "/purge"

// PurgeUser is the NATS user of a connection that purges namespace's dead letters: it gets
// RolePurger alone, when it is the data API server's (Kube.DataAPI, with a token of the NATS
// audience) and RBAC allows it delete on webhookdeliveries there, and is refused otherwise.
// Tenants purge through the data API (a delete of webhookdeadletters), never on the bus. No
// other connection gets the role, so the right to delete is on no connection that did not ask
// for it, and the purge's operational event is not among a producer's denials on the same
// connection.
func PurgeUser(namespace string) string { return namespace + purgeSuffix }

// Service answers nats-server's authorization requests: it verifies the connection's
// Kubernetes token with a TokenReview, decides its roles in the namespace it asks for
// (a dispatcher ServiceAccount the controller made, or SubjectAccessReviews on the virtual
// resources), and returns a user JWT with exactly those permissions, placed in
// AccountTenants and expiring with the token. A refusal carries its reason, which the server
// logs; the client sees "Authorization Violation".
type Service struct {
	Kube *Kube
	// Bus names what a namespace owns on the bus.
	Bus func(namespace string) Bus
	// Issuer signs the responses and user JWTs; its public key is the server's callout issuer.
	Issuer nkeys.KeyPair
	// XKey, when set, decrypts requests and encrypts responses.
	XKey nkeys.KeyPair
	// Account is where users are placed (AccountTenants).
	Account string
	// MaxSession bounds a connection's authorization (DefaultMaxSession).
	MaxSession time.Duration
	// Timeout bounds one decision (default 4s, within the server's authorization timeout).
	Timeout time.Duration
	// Concurrency bounds the decisions made at once (DefaultConcurrency).
	Concurrency int
	// MaxPending, MaxPendingPerHost, MaxPendingPerNamespace and MaxPendingPerToken bound the
	// requests waiting for a decision or in one: in all, per client host, per namespace asked
	// for and per bearer token (defaults DefaultMaxPending...). A request beyond any bound is
	// refused at once, saying which; the reader of requests never waits.
	MaxPending, MaxPendingPerHost, MaxPendingPerNamespace, MaxPendingPerToken int
	// AllowPlaintextTokens accepts a token on a connection that is not over TLS
	// (--nats-allow-plaintext-tokens): for a loopback demo only, since whoever is on the path
	// would capture it.
	AllowPlaintextTokens bool
	// RatePerHost and BurstPerHost bound the authorization requests of one client host (its
	// address as the server sees it) per second: beyond, a request is refused at once, without
	// a review (defaults DefaultRatePerHost, DefaultBurstPerHost).
	RatePerHost  float64
	BurstPerHost int
	// RefusalTTL is how long a token the API server did not accept is refused again without
	// asking it (DefaultRefusalTTL).
	RefusalTTL time.Duration
	// Limits bound what each connection may do (payload, subscriptions, data); zero fields
	// take DefaultLimits'.
	Limits Limits
	Log    logr.Logger
	Now    func() time.Time

	guardOnce, pendingOnce sync.Once
	g                      *guard
	p                      *pending
	// maxPayload is what the callout's connection may publish (0: unknown).
	maxPayload atomic.Int64
}

func (s *Service) guard() *guard {
	s.guardOnce.Do(func() { s.g = newGuard(s.RatePerHost, s.BurstPerHost, s.RefusalTTL) })
	return s.g
}

func (s *Service) pending() *pending {
	s.pendingOnce.Do(func() {
		s.p = newPending(s.MaxPending, s.MaxPendingPerHost, s.MaxPendingPerNamespace, s.MaxPendingPerToken)
	})
	return s.p
}

// refusal is a reason to refuse a connection, fit for the server's log.
type refusal struct{ reason string }

func (r *refusal) Error() string { return r.reason }

func refuse(format string, a ...any) error { return &refusal{fmt.Sprintf(format, a...)} }

// decision is what a connection gets.
type decision struct {
	namespace string
	user      string
	grant     Grant
	expires   time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// job is a request waiting for a decision.
type job struct {
	m        *nats.Msg
	req      *jwt.AuthorizationRequestClaims
	xkey     string
	keys     pendingKeys
	deadline time.Time
}

// Serve answers requests on nc (a connection to the callout account) until ctx ends. It joins
// QueueGroup, so that every controller replica answers a share. The reader never waits:
// requests over their host's rate, with a token refused a moment ago, or beyond a bound of
// pending requests (in all, per host, per namespace, per token) are refused as they arrive;
// the others wait in a queue for one of Concurrency decisions, so that a flood from one host,
// namespace or token never holds up the others, and one that waited longer than a decision may
// take is refused rather than decided for a client that gave up.
func (s *Service) Serve(ctx context.Context, nc *nats.Conn) error {
	n := s.Concurrency
	if n <= 0 {
		n = DefaultConcurrency
	}
	p := s.pending()
	// acquire bounds what is queued to maxTotal: sending never blocks.
	queue := make(chan job, p.maxTotal)
	s.maxPayload.Store(nc.MaxPayload())
	respond := func(m *nats.Msg, resp []byte) {
		if err := m.Respond(resp); err != nil {
			s.Log.Info("answering an authorization request", "error", err.Error())
		}
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-queue:
					// The wait counts against the decision's time, so the server has its
					// answer within the timeout however long the queue was.
					var d decision
					err := error(refuse("the request waited %s for a decision (the auth callout is overloaded): try again later", s.timeout()))
					if wait := time.Until(j.deadline); wait > 0 {
						dctx, cancel := context.WithTimeout(ctx, wait)
						d, err = s.decide(dctx, j.req)
						cancel()
					}
					respond(j.m, s.answer(j.req, j.xkey, d, err))
					p.release(j.keys)
				}
			}
		}()
	}
	sub, err := nc.QueueSubscribe(CalloutSubject, QueueGroup, func(m *nats.Msg) {
		xkey := m.Header.Get(xkeyHeader)
		req := s.open(m.Data, xkey)
		if req == nil {
			respond(m, nil)
			return
		}
		if err := s.precheck(req); err != nil {
			respond(m, s.answer(req, xkey, decision{}, err))
			return
		}
		keys := pendingKeysOf(req)
		if err := p.acquire(keys); err != nil {
			log, unlogged := s.guard().quiet(keys.host, s.now())
			respond(m, s.answer(req, xkey, decision{}, &quietRefusal{refusal: *err.(*refusal), log: log, unlogged: unlogged}))
			return
		}
		queue <- job{m: m, req: req, xkey: xkey, keys: keys, deadline: time.Now().Add(s.timeout())}
	})
	if err != nil {
		return fmt.Errorf("subscribing to %s: %w", CalloutSubject, err)
	}
	// What arrives is read at once and refused or queued within bounds: never drop.
	_ = sub.SetPendingLimits(-1, -1)
	<-ctx.Done()
	_ = sub.Unsubscribe()
	wg.Wait()
	return nil
}

// pendingKeysOf are the host, the namespace asked for and the token of req.
func pendingKeysOf(req *jwt.AuthorizationRequestClaims) pendingKeys {
	ns, _ := strings.CutSuffix(strings.TrimSpace(req.ConnectOptions.Username), purgeSuffix)
	return pendingKeys{host: req.ClientInformation.Host, namespace: ns, token: sha256.Sum256([]byte(req.ConnectOptions.Token))}
}

// Handle answers one request. A request it cannot read gets no answer (nil), which the server
// takes as a refusal.
func (s *Service) Handle(ctx context.Context, data []byte, serverXKey string) []byte {
	req := s.open(data, serverXKey)
	if req == nil {
		return nil
	}
	if err := s.precheck(req); err != nil {
		return s.answer(req, serverXKey, decision{}, err)
	}
	d, err := s.decideWithin(ctx, req)
	return s.answer(req, serverXKey, d, err)
}

// open decrypts (when the server encrypted it), decodes and validates a request; nil when it
// cannot, with the reason logged.
func (s *Service) open(data []byte, serverXKey string) *jwt.AuthorizationRequestClaims {
	if serverXKey != "" {
		if s.XKey == nil {
			s.Log.Info("refusing an encrypted authorization request: no xkey seed is configured")
			return nil
		}
		plain, err := s.XKey.Open(data, serverXKey)
		if err != nil {
			s.Log.Info("refusing an authorization request that does not decrypt", "error", err.Error())
			return nil
		}
		data = plain
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		s.Log.Info("refusing an unreadable authorization request", "error", err.Error())
		return nil
	}
	vr := jwt.CreateValidationResults()
	req.Validate(vr)
	if len(vr.Errors()) > 0 {
		s.Log.Info("refusing an invalid authorization request", "error", vr.Errors()[0].Error())
		return nil
	}
	return req
}

// quietRefusal refuses a flood: a host over its rate, or a request beyond a bound of pending
// requests. It is logged at most every quietEvery per host and kind, with the count of those
// not logged.
type quietRefusal struct {
	refusal
	log      bool
	unlogged int
}

// precheck refuses, without asking the API server, a request of a host over its rate and one
// whose token the API server refused a moment ago.
func (s *Service) precheck(req *jwt.AuthorizationRequestClaims) error {
	g, now := s.guard(), s.now()
	ok, log, unlogged := g.admit(req.ClientInformation.Host, now)
	if !ok {
		return &quietRefusal{refusal: refusal{fmt.Sprintf("too many connection attempts from %s (more than %g a second): try again later",
			req.ClientInformation.Host, g.rate)}, log: log, unlogged: unlogged}
	}
	if t := req.ConnectOptions.Token; t != "" && g.wasRefused(t, now) {
		return refuse("the Kubernetes API server did not accept this token a moment ago")
	}
	return nil
}

// timeout bounds one decision.
func (s *Service) timeout() time.Duration {
	if s.Timeout <= 0 {
		return 4 * time.Second
	}
	return s.Timeout
}

// decideWithin is decide bounded by the service's timeout.
func (s *Service) decideWithin(ctx context.Context, req *jwt.AuthorizationRequestClaims) (decision, error) {
	dctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	return s.decide(dctx, req)
}

// answer is the signed (and, when the request was, encrypted) response to req: the user of d,
// or the refusal err. It logs the outcome.
func (s *Service) answer(req *jwt.AuthorizationRequestClaims, serverXKey string, d decision, err error) []byte {
	resp := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	resp.Audience = req.Server.ID
	client := fmt.Sprintf("%s (%s)", req.ClientInformation.Host, req.ClientInformation.Name)
	if err == nil {
		uc := jwt.NewUserClaims(req.UserNkey)
		uc.Name = d.user + "@" + d.namespace
		uc.Audience = s.Account
		uc.Expires = d.expires.Unix()
		uc.Permissions = Permissions(s.Bus(d.namespace), d.grant)
		uc.AllowedConnectionTypes.Add(jwt.ConnectionTypeStandard)
		s.Limits.apply(&uc.Limits)
		resp.Jwt, err = uc.Encode(s.Issuer)
		if err != nil {
			err = refuse("signing the user: %v", err)
		}
	}
	var rate *quietRefusal
	switch {
	case errors.As(err, &rate):
		resp.Error = err.Error()
		if rate.log {
			s.Log.Info("bus connections refused", "client", client, "reason", err.Error(), "refusedSinceLastLogged", rate.unlogged)
		}
	case err != nil:
		resp.Jwt = ""
		resp.Error = err.Error()
		s.Log.Info("bus connection refused", "client", client, "user", d.user, "namespace", d.namespace, "reason", err.Error())
	default:
		s.Log.Info("bus connection authorized", "client", client, "user", d.user, "namespace", d.namespace,
			"roles", d.grant.Roles, "expires", d.expires.UTC().Format(time.RFC3339))
	}
	out, err := resp.Encode(s.Issuer)
	if err != nil {
		s.Log.Error(err, "signing an authorization response")
		return nil
	}
	final := []byte(out)
	if serverXKey != "" {
		if final, err = s.XKey.Seal(final, serverXKey); err != nil {
			s.Log.Error(err, "encrypting an authorization response")
			return nil
		}
	}
	if limit := s.maxPayload.Load(); limit > 0 && int64(len(final)) > limit && resp.Jwt != "" {
		// The server would never see it: refuse, saying why, rather than let it time out.
		return s.answer(req, serverXKey, d, refuse("the grant of %s in namespace %s takes %d bytes, more than NATS's max_payload of %d: raise max_payload", d.user, d.namespace, len(final), limit))
	}
	return final
}

// decide verifies the connection's token and decides what it may do in the namespace it asks
// for (its user field; a ServiceAccount's own namespace when empty). Its inbox is the one of
// the nkey it proves (provenInbox). Every error is a refusal whose text says why.
func (s *Service) decide(ctx context.Context, req *jwt.AuthorizationRequestClaims) (decision, error) {
	var d decision
	co := req.ConnectOptions
	token, user := co.Token, co.Username
	if token == "" {
		return d, refuse("no token: connect with a Kubernetes bearer token as the NATS token")
	}
	if len(token) > MaxTokenBytes {
		return d, refuse("the token is longer than %d bytes", MaxTokenBytes)
	}
	if req.TLS == nil && !s.AllowPlaintextTokens {
		return d, refuse("the connection is not over TLS, and a Kubernetes token must not cross the network in clear: connect over TLS (the controller's --nats-allow-plaintext-tokens accepts it anyway, for a loopback demo)")
	}
	inbox, err := provenInbox(co, req.ClientInformation.Nonce)
	if err != nil {
		return d, err
	}
	d.grant.Inbox = inbox
	id, err := s.Kube.Authenticate(ctx, token)
	if errors.Is(err, errNotAuthenticated) {
		s.guard().refuse(token, s.now())
		if s.Kube.AllowAPIAudience {
			return d, refuse("the Kubernetes API server does not accept the token (expired, revoked, or of another cluster)")
		}
		return d, refuse("the Kubernetes API server does not accept the token for audience %s (expired, revoked, of another cluster, or of the API server's own audience, which the controller's --nats-allow-api-audience-tokens would accept)", s.Kube.Audience)
	}
	if err != nil {
		return d, refuse("cannot verify the token now: %v", err)
	}
	d.user = id.User.Username
	saNamespace, saName, isSA := id.ServiceAccount()
	var purge bool
	d.namespace, purge = strings.CutSuffix(strings.TrimSpace(user), purgeSuffix)
	if d.namespace == "" && isSA {
		d.namespace = saNamespace
	}
	if d.namespace == "" {
		return d, refuse("say which namespace to use: connect with the namespace as the NATS user")
	}
	if len(d.namespace) > 63 || !dnsLabel.MatchString(d.namespace) {
		ns := d.namespace
		d.namespace = ""
		return d, refuse("%.70q is not a namespace name", ns)
	}

	if purge {
		if !isSA || !id.NATSAudience || s.Kube.DataAPI == "" || s.Kube.DataAPI != saNamespace+"/"+saName {
			return d, refuse("%s may not purge dead letters on the bus: only the data API server does, for callers the Kubernetes API authorized (delete on %s of %s)",
				d.user, datav1alpha1.ResourceDeadLetters, datav1alpha1.GroupName)
		}
		ok, err := s.Kube.Allowed(ctx, id.User, d.namespace, ResourceDeliveries, "delete")
		if err != nil {
			return d, refuse("cannot ask the API server what %s may do now: %v", d.user, err)
		}
		if !ok {
			return d, refuse("%s may not purge dead letters in namespace %s: RBAC grants no delete on %s (API group webhook-operator.io)", d.user, d.namespace, ResourceDeliveries)
		}
		d.grant.Roles = []Role{RolePurger}
	}
	if !purge && isSA && id.NATSAudience && saNamespace == d.namespace && s.Kube.Dispatchers != nil {
		acct, ok, err := s.Kube.Dispatchers(ctx, saNamespace, saName)
		if err != nil {
			return d, refuse("cannot look up ServiceAccount %s/%s now: %v", saNamespace, saName, err)
		}
		if ok && acct.UID != id.User.UID {
			return d, refuse("the token is of ServiceAccount %s/%s with UID %s, not of the dispatcher ServiceAccount of that name the controller made (UID %s)",
				saNamespace, saName, id.User.UID, acct.UID)
		}
		if ok {
			ep := acct.Endpoint
			d.grant.Roles = []Role{RoleDispatcher}
			if s.Kube.SourceConsumers != nil {
				sources, err := s.Kube.SourceConsumers(ctx, saNamespace, ep)
				if err != nil {
					return d, refuse("cannot list the source consumers of %s/%s now: %v", saNamespace, saName, err)
				}
				fit := FitSources(sources)
				if fit < len(sources) {
					// Each endpoint beyond the grant's bound says so itself (Ready False
					// SourceGrantFull, which the controller sets from the same FitSources), and
					// its dispatcher does not pull its sources; what is left out is logged.
					s.Log.Info("a dispatcher's grant holds only part of its source consumers", "namespace", saNamespace,
						"dispatcher", saName, "granted", fit, "sources", len(sources), "firstLeftOut", sources[fit].Stream+"/"+sources[fit].Consumer)
				}
				d.grant.Sources = sources[:fit]
			}
		}
	}
	if !purge && isSA && id.NATSAudience && saNamespace == d.namespace && s.Kube.Ingress != "" && s.Kube.Ingress == saNamespace+"/"+saName {
		d.grant.Roles = []Role{RoleIngress}
	}
	if !purge && isSA && id.NATSAudience && saNamespace == d.namespace && s.Kube.DataAPI != "" && s.Kube.DataAPI == saNamespace+"/"+saName {
		d.grant.Roles = []Role{RoleDataAPI}
	}
	if len(d.grant.Roles) == 0 {
		for _, c := range []struct {
			resource, verb string
			role           Role
		}{
			{ResourceEvents, "create", RoleProducer},
			{ResourceDeliveries, "create", RoleReplayer},
		} {
			if slices.Contains(d.grant.Roles, c.role) {
				continue
			}
			ok, err := s.Kube.Allowed(ctx, id.User, d.namespace, c.resource, c.verb)
			if err != nil {
				return d, refuse("cannot ask the API server what %s may do now: %v", d.user, err)
			}
			if ok {
				d.grant.Roles = append(d.grant.Roles, c.role)
			}
		}
	}
	if len(d.grant.Roles) == 0 {
		return d, refuse("%s may do nothing with webhooks on the bus in namespace %s: RBAC grants neither create on %s nor create on %s (API group webhook-operator.io); "+
			"deliveries and dead letters are read through the Kubernetes API (%s), not the bus",
			d.user, d.namespace, ResourceEvents, ResourceDeliveries, datav1alpha1.GroupName)
	}
	if (d.grant.Has(RoleProducer) || d.grant.Has(RoleReplayer)) && s.Kube.EventPublishing != nil {
		ok, err := s.Kube.EventPublishing(ctx, d.namespace)
		if err != nil {
			return d, refuse("cannot read the WebhookQuota of namespace %s now: %v", d.namespace, err)
		}
		d.grant.RateLimited = !ok
	}
	maxSession := s.MaxSession
	if maxSession <= 0 {
		maxSession = DefaultMaxSession
	}
	d.expires = s.now().Add(maxSession)
	if exp, ok := kubeauth.TokenExpiry(token); ok && exp.Before(d.expires) {
		d.expires = exp
	}
	return d, nil
}

// provenInbox checks that the connection proves the user nkey it presents (its signature of
// the nonce the server sent it verifies) and returns that key's inbox, the only one the
// connection will be allowed to subscribe to. A connection cannot name an inbox: a password is
// refused, so that no one claims the inbox of a connection they watched (NATS monitoring lists
// every subscription). The nonce is new for every connection, so a signature seen once is
// worth nothing later.
func provenInbox(co jwt.ConnectOptions, nonce string) (string, error) {
	if co.Password != "" {
		return "", refuse("a NATS password is refused: a connection's inbox is derived from the nkey it proves; connect with a new user nkey (natsauth.ClientOptions)")
	}
	if co.Nkey == "" {
		return "", refuse("no nkey: connect with a new user nkey that signs the server's nonce (natsauth.ClientOptions); its public key makes the connection's inbox")
	}
	if !nkeys.IsValidPublicUserKey(co.Nkey) {
		return "", refuse("the nkey is not a user public key (U...)")
	}
	// The server passes its nonce on only with a signature, and a server configured by
	// ServerConfig sends every client one (NonceUser): without a signature, the client did not
	// sign.
	if co.SignedNonce == "" {
		return "", refuse("the nkey came without its signature of the server's nonce: sign the nonce with the nkey (natsauth.ClientOptions does)")
	}
	if nonce == "" {
		return "", refuse("the server passed on no nonce with the connection's signature: its configuration lacks the nkey user that makes it send one (natsauth.ServerConfig)")
	}
	sig, err := base64.RawURLEncoding.DecodeString(co.SignedNonce)
	if err != nil {
		sig, err = base64.StdEncoding.DecodeString(co.SignedNonce)
	}
	if err != nil {
		return "", refuse("the signature of the nonce is not base64")
	}
	kp, err := nkeys.FromPublicKey(co.Nkey)
	if err != nil {
		return "", refuse("the nkey is not a user public key (U...)")
	}
	if err := kp.Verify([]byte(nonce), sig); err != nil {
		return "", refuse("the nkey's signature of the server's nonce does not verify")
	}
	return InboxOf(co.Nkey), nil
}
