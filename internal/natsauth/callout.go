package natsauth

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

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

// inboxPattern is a connection's own inbox prefix: random, so no other connection can guess it.
var (
	inboxPattern = regexp.MustCompile(`^_INBOX_[A-Za-z0-9]{16,64}$`)
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// ValidInbox reports whether p may be a connection's inbox prefix.
func ValidInbox(p string) bool { return inboxPattern.MatchString(p) }

// purgeSuffix ends the NATS user of a connection that asks to purge dead letters.
const purgeSuffix = "/purge"

// PurgeUser is the NATS user of a connection that purges namespace's dead letters: it gets
// RolePurger alone, when RBAC allows delete on webhookdeliveries there, and is refused
// otherwise. No other connection gets the role, so the right to delete is on no connection
// that did not ask for it, and the purge's operational event is not among a producer's
// denials on the same connection.
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
	// Concurrency bounds the decisions made at once (default 16).
	Concurrency int
	Log         logr.Logger
	Now         func() time.Time
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

// Serve answers requests on nc (a connection to the callout account) until ctx ends. It joins
// QueueGroup, so that every controller replica answers a share.
func (s *Service) Serve(ctx context.Context, nc *nats.Conn) error {
	n := s.Concurrency
	if n <= 0 {
		n = 16
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	sub, err := nc.QueueSubscribe(CalloutSubject, QueueGroup, func(m *nats.Msg) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			resp := s.Handle(ctx, m.Data, m.Header.Get(xkeyHeader))
			if err := m.Respond(resp); err != nil {
				s.Log.Info("answering an authorization request", "error", err.Error())
			}
		}()
	})
	if err != nil {
		return fmt.Errorf("subscribing to %s: %w", CalloutSubject, err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	wg.Wait()
	return nil
}

// Handle answers one request. A request it cannot read gets no answer (nil), which the server
// takes as a refusal.
func (s *Service) Handle(ctx context.Context, data []byte, serverXKey string) []byte {
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
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 4 * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	co := req.ConnectOptions
	d, err := s.decide(dctx, co.Token, co.Username, co.Password)

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
		resp.Jwt, err = uc.Encode(s.Issuer)
		if err != nil {
			err = refuse("signing the user: %v", err)
		}
	}
	if err != nil {
		resp.Jwt = ""
		resp.Error = err.Error()
		s.Log.Info("bus connection refused", "client", client, "user", d.user, "namespace", d.namespace, "reason", err.Error())
	} else {
		s.Log.Info("bus connection authorized", "client", client, "user", d.user, "namespace", d.namespace,
			"roles", d.grant.Roles, "expires", d.expires.UTC().Format(time.RFC3339))
	}
	out, err := resp.Encode(s.Issuer)
	if err != nil {
		s.Log.Error(err, "signing an authorization response")
		return nil
	}
	if serverXKey != "" {
		sealed, err := s.XKey.Seal([]byte(out), serverXKey)
		if err != nil {
			s.Log.Error(err, "encrypting an authorization response")
			return nil
		}
		return sealed
	}
	return []byte(out)
}

// decide verifies token and decides what it may do in the namespace the connection asks for
// (its user field; a ServiceAccount's own namespace when empty). password, when set, is the
// connection's inbox prefix. Every error is a refusal whose text says why.
func (s *Service) decide(ctx context.Context, token, user, password string) (decision, error) {
	var d decision
	if token == "" {
		return d, refuse("no token: connect with a Kubernetes bearer token as the NATS token")
	}
	if len(token) > MaxTokenBytes {
		return d, refuse("the token is longer than %d bytes", MaxTokenBytes)
	}
	id, err := s.Kube.Authenticate(ctx, token)
	if errors.Is(err, errNotAuthenticated) {
		return d, refuse("the Kubernetes API server does not accept the token (expired, revoked, or of another cluster)")
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
	if password != "" && !ValidInbox(password) {
		return d, refuse("the NATS password must be the connection's inbox prefix: _INBOX_ followed by 16 to 64 letters or digits")
	}
	d.grant.Inbox = password

	if purge {
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
		ep, ok, err := s.Kube.Dispatchers(ctx, saNamespace, saName)
		if err != nil {
			return d, refuse("cannot look up ServiceAccount %s/%s now: %v", saNamespace, saName, err)
		}
		if ok {
			d.grant.Roles = []Role{RoleDispatcher}
			if s.Kube.SourceConsumers != nil {
				cs, ss, err := s.Kube.SourceConsumers(ctx, saNamespace, ep)
				if err != nil {
					return d, refuse("cannot list the source consumers of %s/%s now: %v", saNamespace, saName, err)
				}
				d.grant.SourceConsumers = cs[:min(len(cs), MaxSourceConsumers)]
				d.grant.SourceStreams = ss[:min(len(ss), MaxSourceConsumers)]
			}
		}
	}
	if !purge && isSA && id.NATSAudience && saNamespace == d.namespace && s.Kube.Ingress != "" && s.Kube.Ingress == saNamespace+"/"+saName {
		d.grant.Roles = []Role{RoleIngress}
	}
	if len(d.grant.Roles) == 0 {
		for _, c := range []struct {
			resource, verb string
			role           Role
		}{
			{ResourceEvents, "create", RoleProducer},
			{ResourceDeliveries, "get", RoleReader},
			{ResourceDeliveries, "list", RoleReader},
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
		return d, refuse("%s may do nothing with webhooks in namespace %s: RBAC grants none of create on %s, get, list or create on %s (API group webhook-operator.io)",
			d.user, d.namespace, ResourceEvents, ResourceDeliveries)
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
