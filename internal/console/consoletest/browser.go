// Package consoletest drives the web console in a real browser, Debian's chromium run
// headless through chromedp, for the tests that need one: internal/console's (against
// envtest), test/e2e's (the demo stack) and test/cluster's (the chart on a real node). It
// holds the browser (each step bounded, the process gone when the test ends) and the tour
// the demo stack and the real node both take.
package consoletest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Hostile is what a hostile producer or receiver writes: markup that would change the page's
// title if the console ever rendered it instead of showing it as text.
const Hostile = `<script>document.title="pwned"</script><img src=x onerror="document.title='pwned'">`

// HostileEvent is an event's JSON body whose note is Hostile, its markup unescaped as a
// hostile producer writes it.
func HostileEvent() string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]string{"note": Hostile})
	return strings.TrimSpace(b.String())
}

// StepTimeout bounds each step of a Browser.
const StepTimeout = 30 * time.Second

// Chromium is Debian's chromium (or another Chromium-based browser on PATH), or "" when none
// is installed.
func Chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser drives one tab of a headless chromium, each step bounded by StepTimeout.
type Browser struct {
	t   testing.TB
	ctx context.Context
	// Base is the console's URL (https://... or http://127.0.0.1:<port>), without a slash
	// at the end.
	Base string
	// Shots, when set, is a directory where Shot saves screenshots.
	Shots string
}

// Need skips the test with a message when chromium is not installed: call it before starting
// what the browser would look at.
func Need(t testing.TB) {
	t.Helper()
	if Chromium() == "" {
		t.Skip("chromium is not installed: the console's browser tests need it (Debian: apt-get install -y chromium); see docs/console.md")
	}
}

// Start starts chromium headless for a console at base; it skips the test with a message when
// chromium is not installed, and stops the browser (its process and profile) when the test
// ends. Certificate errors are ignored: tests serve the console with their own CAs.
func Start(t testing.TB, base string) *Browser {
	t.Helper()
	Need(t)
	chrome := Chromium()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.IgnoreCertErrors, chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	// The first run starts the browser, on a context without a deadline (cancelling a
	// deadline's context would end the browser); its start is bounded by a timer instead.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(bctx, chromedp.Navigate("about:blank")) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting %s: %v", chrome, err)
		}
	case <-time.After(time.Minute):
		bcancel()
		t.Fatalf("starting %s: not ready within a minute", chrome)
	}
	return &Browser{t: t, ctx: bctx, Base: base, Shots: os.Getenv("CONSOLE_SCREENSHOTS")}
}

// Run runs one bounded action and returns its value; a failure ends the test with where the
// browser was and what the page said.
func Run[T any](b *Browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, StepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		lctx, lcancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer lcancel()
		loc, _ := chromedp.Run(lctx, chromedp.Location())
		body, _ := chromedp.Run(lctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		b.t.Fatalf("%s: %v (at %s: %q)", what, err, loc, body)
	}
	return v
}

// Do runs steps as one bounded action.
func (b *Browser) Do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	Run(b, what, chromedp.Steps(steps...))
}

// Text is the text of the element with id.
func (b *Browser) Text(id string) string {
	b.t.Helper()
	return Run(b, "reading #"+id, chromedp.Text(chromedp.ID(id)))
}

// Disabled says whether the first element matching the CSS selector is disabled.
func (b *Browser) Disabled(selector string) bool {
	b.t.Helper()
	return Run(b, "whether "+selector+" is disabled", chromedp.Evaluate[bool](`document.querySelector(`+jsString(selector)+`).disabled`))
}

// Markup counts the script and img elements in the page's main part: a hostile value
// rendered as markup instead of text would add one.
func (b *Browser) Markup() int {
	b.t.Helper()
	return Run(b, "counting markup", chromedp.Evaluate[int](`document.querySelectorAll("main script, main img").length`))
}

// Title is the page's title.
func (b *Browser) Title() string {
	b.t.Helper()
	return Run(b, "the title", chromedp.Title())
}

// Shot saves a screenshot of the page as <Shots>/console-<name>.png when Shots is set.
func (b *Browser) Shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if b.Shots == "" {
			return nil
		}
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(b.Shots, "console-"+name+".png"), png, 0o644)
	})
}

// SignIn signs in with token on the sign-in page (signing out first when a session is open)
// and waits for the namespaces page.
func (b *Browser) SignIn(token string) {
	b.t.Helper()
	b.Do("opening the console", chromedp.Navigate(b.Base+"/"), chromedp.WaitVisible(chromedp.CSS("#token, #namespaces")))
	if Run(b, "whether a session is open", chromedp.Evaluate[bool](`document.getElementById("namespaces") !== null`)) {
		b.Do("signing out", chromedp.Click(chromedp.CSS("header button")), chromedp.WaitVisible(chromedp.ID("token")))
	}
	b.Do("signing in",
		b.Shot("signin"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("namespaces")),
	)
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	out := []byte{'"'}
	for _, r := range []byte(s) {
		if r == '"' || r == '\\' {
			out = append(out, '\\')
		}
		out = append(out, r)
	}
	return string(append(out, '"'))
}
