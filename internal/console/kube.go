package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Bounds of the console's calls to the Kubernetes API.
const (
	// callTimeout bounds one call.
	callTimeout = 20 * time.Second
	// maxResponseBytes bounds what one answer may hold (a page of 500 deliveries is well
	// under it).
	maxResponseBytes = 16 << 20
)

// Paths of the APIs the console calls.
var (
	crdPath  = "/apis/" + v1alpha1.GroupVersion.String()
	dataPath = "/apis/" + datav1alpha1.SchemeGroupVersion.String()
)

// apiServer is how the console reaches the Kubernetes API: its address and a transport that
// trusts its CA and carries no credential of the console's own. Every call is made with the
// signed-in user's token (kube).
type apiServer struct {
	host string
	rt   http.RoundTripper
}

// newAPIServer builds the transport of cfg without any credential it holds.
func newAPIServer(cfg *rest.Config) (*apiServer, error) {
	if cfg == nil || cfg.Host == "" {
		return nil, errors.New("console: the Kubernetes API server's address is required")
	}
	anon := rest.AnonymousClientConfig(cfg)
	anon.QPS, anon.Burst = -1, -1
	rt, err := rest.TransportFor(anon)
	if err != nil {
		return nil, fmt.Errorf("console: the transport to the Kubernetes API: %w", err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("console: the Kubernetes API server's address %q is not a URL", cfg.Host)
	}
	if u.Scheme == "" {
		u.Scheme = "https"
	}
	return &apiServer{host: strings.TrimRight(u.String(), "/"), rt: rt}, nil
}

// kube calls the Kubernetes API as one user.
type kube struct {
	api   *apiServer
	token string
	hc    *http.Client
}

func (a *apiServer) as(token string) *kube {
	return &kube{api: a, token: token, hc: &http.Client{Transport: a.rt, Timeout: callTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// apiError is an answer of the API server that is not a success: its status and message.
type apiError struct {
	Code    int
	Reason  metav1.StatusReason
	Message string
}

func (e *apiError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("the Kubernetes API answered %d %s", e.Code, http.StatusText(e.Code))
}

// errCode is the HTTP status of an API error; 0 for other errors.
func errCode(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// do makes one call; out, when not nil, receives the answer's JSON.
func (k *kube) do(ctx context.Context, method, path string, query url.Values, contentType string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	u := k.api.host + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+k.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "webhook-operator-console")
	if body != nil {
		if contentType == "" {
			contentType = "application/json"
		}
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := k.hc.Do(req)
	if err != nil {
		return fmt.Errorf("the Kubernetes API cannot be reached: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("reading the Kubernetes API's answer: %w", err)
	}
	if len(b) > maxResponseBytes {
		return fmt.Errorf("the Kubernetes API's answer to %s is larger than %d bytes", path, maxResponseBytes)
	}
	if resp.StatusCode/100 != 2 {
		ae := &apiError{Code: resp.StatusCode}
		var st metav1.Status
		if json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
			ae.Message, ae.Reason = st.Message, st.Reason
		}
		return ae
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("the Kubernetes API's answer to %s: %w", path, err)
		}
	}
	return nil
}

func (k *kube) get(ctx context.Context, path string, query url.Values, out any) error {
	return k.do(ctx, http.MethodGet, path, query, "", nil, out)
}

func (k *kube) create(ctx context.Context, path string, obj, out any) error {
	return k.do(ctx, http.MethodPost, path, url.Values{"fieldValidation": {"Strict"}}, "", obj, out)
}

func (k *kube) mergePatch(ctx context.Context, path string, patch, out any) error {
	return k.do(ctx, http.MethodPatch, path, url.Values{"fieldValidation": {"Strict"}}, "application/merge-patch+json", patch, out)
}

func (k *kube) delete(ctx context.Context, path string, query url.Values, out any) error {
	return k.do(ctx, http.MethodDelete, path, query, "", nil, out)
}

// nsPath is the path of resource (with its API prefix) in namespace ns, and of a name and
// subresource when given.
func nsPath(prefix, ns, resource string, parts ...string) string {
	p := prefix + "/namespaces/" + url.PathEscape(ns) + "/" + resource
	for _, s := range parts {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// whoAmI asks the API server who the token is (SelfSubjectReview): a token it does not
// accept is a 401.
func (k *kube) whoAmI(ctx context.Context) (authenticationv1.UserInfo, error) {
	var r authenticationv1.SelfSubjectReview
	err := k.create(ctx, "/apis/authentication.k8s.io/v1/selfsubjectreviews", &authenticationv1.SelfSubjectReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "SelfSubjectReview"}}, &r)
	return r.Status.UserInfo, err
}

// access is one verb on one resource of a namespace, asked with a SelfSubjectAccessReview.
type access struct {
	Verb, Group, Resource, Subresource string
}

func (a access) String() string {
	r := a.Resource
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	if a.Group != "" {
		r += "." + a.Group
	}
	return a.Verb + " " + r
}

// decision is whether RBAC allows an access, and why not when it does not.
type decision struct {
	Allowed bool
	// Why says, when not allowed, what RBAC does not grant, in words.
	Why string
}

// can asks, at once, whether the user may do each of accesses in namespace ns.
func (k *kube) can(ctx context.Context, ns string, accesses ...access) map[access]decision {
	out := make(map[access]decision, len(accesses))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range accesses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := k.review(ctx, ns, a)
			mu.Lock()
			out[a] = d
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (k *kube) review(ctx context.Context, ns string, a access) decision {
	var r authorizationv1.SelfSubjectAccessReview
	err := k.create(ctx, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", &authorizationv1.SelfSubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"},
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource}},
	}, &r)
	if err != nil {
		return decision{Why: "could not ask the Kubernetes API whether you may " + a.String() + ": " + err.Error()}
	}
	if r.Status.Allowed {
		return decision{Allowed: true}
	}
	where := "in namespace " + ns
	if ns == "" {
		where = "cluster-wide"
	}
	why := "RBAC does not allow you to " + a.String() + " " + where
	if r.Status.Reason != "" {
		why += " (" + r.Status.Reason + ")"
	}
	return decision{Why: why}
}

// The accesses the console's pages and actions need.
var (
	canListEndpoints   = access{Verb: "list", Group: v1alpha1.GroupVersion.Group, Resource: "webhookendpoints"}
	canPatchEndpoints  = access{Verb: "patch", Group: v1alpha1.GroupVersion.Group, Resource: "webhookendpoints"}
	canCreateReplays   = access{Verb: "create", Group: v1alpha1.GroupVersion.Group, Resource: "webhookreplays"}
	canListDeliveries  = access{Verb: "list", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceDeliveries}
	canListDeadLetters = access{Verb: "list", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceDeadLetters}
	canDeliveryPayload = access{Verb: "get", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceDeliveries, Subresource: "payload"}
	canDLQPayload      = access{Verb: "get", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceDeadLetters, Subresource: "payload"}
	canPurge           = access{Verb: "delete", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceDeadLetters}
	canPurgeMany       = access{Verb: "deletecollection", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceDeadLetters}
	canPublish         = access{Verb: "create", Group: datav1alpha1.GroupName, Resource: datav1alpha1.ResourceEvents}
	canCreateSecrets   = access{Verb: "create", Resource: "secrets"}
	canListNamespaces  = access{Verb: "list", Resource: "namespaces"}
)
