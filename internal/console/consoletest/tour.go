package consoletest

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Tour is what a console must show a viewer and an editor of a namespace, wherever it runs
// (the demo stack, a real node): the namespace's endpoints and not another's, a replay RBAC
// does not grant refused with why, a hostile event and response as text, and a dead letter
// replayed until the replay says Complete.
type Tour struct {
	// Namespace is the viewer's and editor's; Endpoint one of its endpoints, with the dead
	// letter DeadLetter whose event and last response hold Hostile.
	Namespace, Endpoint, DeadLetter string
	// Other is another namespace with an endpoint OtherEndpoint, which the viewer may not see.
	Other, OtherEndpoint string
	// Viewer's token may read endpoints, deliveries and dead letters with their payloads in
	// Namespace, and not create replays; ViewerName is part of who it is
	// (system:serviceaccount:<ns>:<name>).
	Viewer, ViewerName string
	// Editor's token may also create replays; EditorName is part of who it is.
	Editor, EditorName string
	// ReplayTimeout bounds the wait for the replay to complete (a minute when zero).
	ReplayTimeout time.Duration
}

// Take signs in as the viewer, then as the editor, and checks each page; it returns the
// name of the WebhookReplay the editor made.
func (tour Tour) Take(t *testing.T, b *Browser) (replay string) {
	t.Helper()
	ns := tour.Namespace
	b.SignIn(tour.Viewer)
	namespaces, who := b.Text("namespaces"), b.Text("who")
	if !strings.Contains(who, tour.ViewerName) {
		t.Errorf("the page says %q, not who signed in (%s)", who, tour.ViewerName)
	}
	if !strings.Contains(namespaces, ns) || strings.Contains(namespaces, tour.Other) {
		t.Errorf("the viewer sees namespaces %q, want %s and not %s", namespaces, ns, tour.Other)
	}

	// The namespace's endpoints; the other namespace's are refused, with why.
	b.Do("the namespace page", chromedp.Navigate(b.Base+"/ns/"+ns), chromedp.WaitVisible(chromedp.ID("endpoints")))
	endpoints := b.Text("endpoints")
	if !strings.Contains(endpoints, tour.Endpoint) || strings.Contains(endpoints, tour.OtherEndpoint) {
		t.Errorf("%s's endpoints read %q: want %s and not %s", ns, endpoints, tour.Endpoint, tour.OtherEndpoint)
	}
	b.Do("another namespace", chromedp.Navigate(b.Base+"/ns/"+tour.Other), chromedp.WaitVisible(chromedp.ID("error")))
	if refusal := b.Text("error"); !strings.Contains(refusal, "forbidden") || strings.Contains(refusal, tour.OtherEndpoint) {
		t.Errorf("another namespace's endpoints: %q, want a refusal", refusal)
	}

	// The dead letters: Replay is refused, and the page says why.
	b.Do("the dead letters", chromedp.Navigate(b.Base+"/ns/"+ns+"/deadletters"), chromedp.WaitVisible(chromedp.CSS("#deadletters button.replay")))
	wantWhy := "RBAC does not allow you to create webhookreplays.webhook-operator.io in namespace " + ns
	if disabled, why := b.Disabled("#deadletters button.replay"), b.Text("replay-why"); !disabled || !strings.Contains(why, wantWhy) {
		t.Errorf("the viewer's Replay is disabled=%v and says %q, want disabled with %q", disabled, why, wantWhy)
	}

	// The dead letter: its hostile event and response are text.
	b.Do("the dead letter", chromedp.Navigate(b.Base+"/ns/"+ns+"/deadletters/"+tour.DeadLetter), chromedp.WaitVisible(chromedp.ID("event")))
	event, response := b.Text("event"), b.Text("response")
	if !strings.Contains(event, `<script>document.title=`) || !strings.Contains(event, `onerror=`) || !strings.Contains(response, Hostile) {
		t.Errorf("the hostile event and response are not shown as text: event %q, response %q", event, response)
	}
	if markup, title := b.Markup(), b.Title(); markup != 0 || title == "pwned" {
		t.Errorf("the dead letter's page has %d elements of markup in its main part and the title %q", markup, title)
	}
	if disabled := b.Disabled("#replay"); !disabled {
		t.Error("the viewer's Replay of the dead letter is enabled")
	}

	// The editor replays it and watches the replay complete.
	b.SignIn(tour.Editor)
	if who := b.Text("who"); !strings.Contains(who, tour.EditorName) {
		t.Errorf("signed in as %q, want %s", who, tour.EditorName)
	}
	b.Do("replaying the dead letter",
		chromedp.Navigate(b.Base+"/ns/"+ns+"/deadletters/"+tour.DeadLetter),
		chromedp.WaitVisible(chromedp.ID("replay")),
		chromedp.Click(chromedp.ID("replay")),
		chromedp.WaitVisible(chromedp.ID("replay-state")),
	)
	loc := Run(b, "the replay's address", chromedp.Location())
	replay = loc[strings.LastIndex(loc, "/")+1:]
	timeout := tour.ReplayTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	var state string
	testenv.Eventually(t, timeout, func() bool {
		b.Do("reloading the replay", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("replay-state")))
		state = b.Text("replay-state")
		return strings.HasPrefix(state, "Complete")
	}, "the replay page did not say Complete")
	if !strings.Contains(state, "1 selected, 1 replayed, 0 skipped, 0 failed") {
		t.Errorf("the replay page says %q", state)
	}
	return replay
}
