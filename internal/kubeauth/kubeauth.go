// Package kubeauth asks the Kubernetes API server who a bearer token belongs to (a
// TokenReview) and what that identity may do on webhook-operator's virtual resources (a
// SubjectAccessReview). The auth callout (internal/natsauth) and the HTTP ingress
// (internal/ingress) decide with it, so an identity's rights on the bus and at the ingress
// are the same RBAC rules.
package kubeauth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Virtual resources of the API group: nothing stores them; Kubernetes RBAC on them decides what
// an identity may do with events and deliveries, through SubjectAccessReviews.
const (
	// ResourceEvents: create publishes events of the namespace.
	ResourceEvents = "webhookevents"
	// ResourceDeliveries: get or list reads the delivery log, dead letters, pending counts and
	// health; create replays dead letters.
	ResourceDeliveries = "webhookdeliveries"
)

// ErrNotAuthenticated says the API server does not accept the token for any audience asked.
var ErrNotAuthenticated = errors.New("the Kubernetes API server does not accept the token")

// Reviewer asks the API server.
type Reviewer struct {
	Client kubernetes.Interface
}

// Authenticate reviews token for each audience set in turn (nil: the API server's own
// audiences) and returns who it is and the index of the set it was accepted for;
// ErrNotAuthenticated when none accepts it. A review for a set counts only when the API server
// says the token is of one of its audiences (status.audiences): an authenticator that ignores
// audiences does not make a token of the API server's audience one of the set.
func (r Reviewer) Authenticate(ctx context.Context, token string, audiences ...[]string) (authenticationv1.UserInfo, int, error) {
	for i, aud := range audiences {
		tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: aud},
		}, metav1.CreateOptions{})
		if err != nil {
			return authenticationv1.UserInfo{}, -1, fmt.Errorf("reviewing the token: %w", err)
		}
		if tr.Status.Authenticated && (aud == nil || slices.ContainsFunc(tr.Status.Audiences, func(a string) bool { return slices.Contains(aud, a) })) {
			return tr.Status.User, i, nil
		}
	}
	return authenticationv1.UserInfo{}, -1, ErrNotAuthenticated
}

// Allowed asks whether user may verb resource (a virtual resource of the API group) in namespace.
func (r Reviewer) Allowed(ctx context.Context, user authenticationv1.UserInfo, namespace, resource, verb string) (bool, error) {
	extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
	for key, v := range user.Extra {
		extra[key] = authorizationv1.ExtraValue(v)
	}
	sar, err := r.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user.Username, Groups: user.Groups, UID: user.UID, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: namespace, Group: v1alpha1.GroupVersion.Group, Resource: resource, Verb: verb,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("reviewing %s on %s: %w", verb, resource, err)
	}
	return sar.Status.Allowed && !sar.Status.Denied, nil
}

// TokenExpiry reads the expiry of a JWT bearer token (a ServiceAccount or OIDC token). The
// signature is not checked: call it on a token the API server has accepted.
func TokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}, false
	}
	return time.Unix(claims.Exp, 0), true
}
