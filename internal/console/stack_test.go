package console_test

import (
	"context"
	"crypto/tls"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/webhook-operator/webhook-operator/internal/console"
	"github.com/webhook-operator/webhook-operator/internal/dataapi"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// stack is what the console's HTTP tests share: a real kube-apiserver with the data API
// aggregated over a real NATS, and the console in front of it. Each test works in namespaces
// of its own. It is started by the first test that asks for it and stopped by TestMain.
type stack struct {
	cp  *testenv.ControlPlane
	js  jetstream.JetStream
	cfg streams.Config
	url string
	ctx context.Context
}

var (
	shared     *stack
	sharedErr  error
	sharedOnce sync.Once
	sharedStop []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(sharedStop) - 1; i >= 0; i-- {
		sharedStop[i]()
	}
	os.Exit(code)
}

// consoleStack is the shared stack, started on first use.
func consoleStack(t *testing.T) *stack {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = startStack() })
	if sharedErr != nil {
		t.Fatalf("starting the console's stack: %v", sharedErr)
	}
	return shared
}

func startStack() (*stack, error) {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	stop := func(f func()) { sharedStop = append(sharedStop, f) }
	dir, err := os.MkdirTemp("", "console-stack-")
	if err != nil {
		return nil, err
	}
	stop(func() { _ = os.RemoveAll(dir) })
	cp, err := testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Aggregation: true})
	if err != nil {
		return nil, err
	}
	stop(func() { _ = cp.Stop() })
	n, err := testenv.StartNATS("")
	if err != nil {
		return nil, err
	}
	stop(n.Cleanup)
	nc, js, err := n.Connect()
	if err != nil {
		return nil, err
	}
	stop(nc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	stop(cancel)
	cfg := streams.DefaultConfig()
	stopAPI, err := runDataAPI(ctx, cp, &dataapi.Bus{NC: nc, JS: js, Streams: cfg}, dir)
	if err != nil {
		return nil, err
	}
	stop(stopAPI)
	s, err := console.New(ctx, console.Options{Kube: cp.Config, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	srv := httptest.NewUnstartedServer(s)
	srv.StartTLS()
	stop(srv.Close)
	return &stack{cp: cp, js: js, cfg: cfg, url: srv.URL, ctx: ctx}, nil
}

// tenant makes namespace ns with its streams.
func (s *stack) tenant(t *testing.T, ns string) {
	t.Helper()
	must(t, s.cp.Client.Create(s.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	must(t, s.cfg.For(ns).Ensure(s.ctx, s.js))
}

// stored writes into ns's streams what the dispatcher would have.
func (s *stack) stored(t *testing.T, ns string) testenv.Stored {
	return testenv.Stored{T: t, JS: s.js, Set: s.cfg.For(ns)}
}

// token is the token of a new ServiceAccount name of ns, granted rules in ns.
func (s *stack) token(t *testing.T, ns, name string, rules ...rbacv1.PolicyRule) string {
	t.Helper()
	return tokenFor(t, s.ctx, s.cp, ns, name, rules)
}

func tokenFor(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, ns, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	c := cp.Client
	must(t, c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	must(t, c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}))
	must(t, c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}))
	cs, err := kubernetes.NewForConfig(cp.Config)
	must(t, err)
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	must(t, err)
	return tr.Status.Token
}

// user is a browser without JavaScript: an HTTP client with a cookie jar, signed in to the
// console, that posts forms with the session's anti-forgery token.
type user struct {
	t    *testing.T
	base string
	hc   *http.Client
	csrf string
}

// signIn signs in to the console at base with token.
func signIn(t *testing.T, base, token string) *user {
	t.Helper()
	u := newBrowser(t, base)
	_, page := u.get("/signin")
	form := inputValue(page, "form")
	code, page := u.post("/signin", url.Values{"form": {form}, "token": {token}})
	if code != http.StatusOK || !strings.Contains(page, `id="who"`) {
		t.Fatalf("signing in: %d %s", code, page)
	}
	return u
}

func newBrowser(t *testing.T, base string) *user {
	jar, err := cookiejar.New(nil)
	must(t, err)
	return &user{t: t, base: base, hc: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
}

// get loads a page and keeps its anti-forgery token.
func (u *user) get(path string) (int, string) {
	u.t.Helper()
	resp, err := u.hc.Get(u.base + path)
	must(u.t, err)
	return u.read(resp)
}

// post submits a form with the session's anti-forgery token (unless the form has one).
func (u *user) post(path string, form url.Values) (int, string) {
	u.t.Helper()
	if _, ok := form["csrf"]; !ok && u.csrf != "" {
		form.Set("csrf", u.csrf)
	}
	resp, err := u.hc.PostForm(u.base+path, form)
	must(u.t, err)
	return u.read(resp)
}

func (u *user) read(resp *http.Response) (int, string) {
	u.t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	must(u.t, err)
	page := string(b)
	if c := inputValue(page, "csrf"); c != "" {
		u.csrf = c
	}
	return resp.StatusCode, page
}

// inputValue is the value of the first input named name on page.
func inputValue(page, name string) string {
	m := regexp.MustCompile(`name="` + regexp.QuoteMeta(name) + `" value="([^"]*)"`).FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// element is the text of the element with id on page, its tags removed and entities decoded
// ("" when there is none).
func element(page, id string) string {
	i := strings.Index(page, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	start := strings.Index(page[i:], ">")
	if start < 0 {
		return ""
	}
	rest := page[i+start+1:]
	tag := page[strings.LastIndex(page[:i], "<")+1 : i]
	tag = strings.Fields(tag)[0]
	// The element ends at its closing tag, counting nested ones of the same name.
	depth, j := 1, 0
	for depth > 0 {
		o := strings.Index(rest[j:], "<"+tag)
		c := strings.Index(rest[j:], "</"+tag+">")
		if c < 0 {
			break
		}
		if o >= 0 && o < c {
			depth++
			j += o + len(tag) + 1
			continue
		}
		depth--
		if depth == 0 {
			rest = rest[:j+c]
			break
		}
		j += c + len(tag) + 3
	}
	text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(rest, " ")
	return strings.Join(strings.Fields(html.UnescapeString(text)), " ")
}
