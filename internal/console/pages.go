package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/expr"
)

// Bounds of what a page lists.
const (
	maxNamespaces  = 100
	pageDeliveries = 50
	pageDeadLetter = 100
)

// Pages of the console. Every value from the cluster, the streams or a receiver reaches the
// page through html/template, as text: nothing a receiver answers or a producer publishes can
// become markup or script.

type namespacesView struct {
	Namespaces []string
	// Note says why the list may be incomplete (the user may not list namespaces).
	Note string
}

// namespacesPage lists the namespaces where the user may list endpoints: every namespace
// when they may list namespaces, else their ServiceAccount's own and the configured ones.
func (s *Server) namespacesPage(q *request) {
	ctx := q.r.Context()
	var candidates []string
	var note string
	var list metav1.PartialObjectMetadataList
	if err := q.kube.get(ctx, "/api/v1/namespaces", url.Values{"limit": {fmt.Sprint(maxNamespaces)}}, &list); err == nil {
		for _, n := range list.Items {
			candidates = append(candidates, n.Name)
		}
	} else {
		note = "You may not list namespaces, so this shows your own and the console's configured ones; open another by its name below."
		if ns := tokenNamespace(q.sess.Token); ns != "" {
			candidates = append(candidates, ns)
		}
		candidates = append(candidates, s.o.Namespaces...)
	}
	sort.Strings(candidates)
	candidates = slices.Compact(candidates)
	v := namespacesView{Note: note}
	decisions := make([]bool, len(candidates))
	type res struct {
		i  int
		ok bool
	}
	ch := make(chan res, len(candidates))
	for i, ns := range candidates {
		go func() { ch <- res{i, q.kube.review(ctx, ns, canListEndpoints).Allowed} }()
	}
	for range candidates {
		r := <-ch
		decisions[r.i] = r.ok
	}
	for i, ns := range candidates {
		if decisions[i] {
			v.Namespaces = append(v.Namespaces, ns)
		}
	}
	s.render(q.w, q.r, http.StatusOK, "namespaces", q.sess, v)
}

// openNamespace goes to the namespace typed in the form.
func (s *Server) openNamespace(q *request) {
	ns := strings.TrimSpace(q.r.URL.Query().Get("ns"))
	if ns == "" || len(ns) > 63 || strings.ContainsAny(ns, "/?#%") {
		http.Redirect(q.w, q.r, "/", http.StatusSeeOther)
		return
	}
	http.Redirect(q.w, q.r, "/ns/"+url.PathEscape(ns), http.StatusSeeOther)
}

// endpointRow is one endpoint at a glance.
type endpointRow struct {
	Name        string
	URL         string
	Ready       string
	Health      string
	SuccessRate string
	Circuit     string
	Pending     int64
	DeadLetters int64
	Disabled    bool
	LastFailure string
}

type namespaceView struct {
	NS        string
	Endpoints []endpointRow
	Chart     chartView
}

func (s *Server) namespacePage(q *request) {
	ns := q.r.PathValue("ns")
	var list v1alpha1.WebhookEndpointList
	if err := q.kube.get(q.r.Context(), nsPath(crdPath, ns, "webhookendpoints"), url.Values{"limit": {"500"}}, &list); err != nil {
		s.apiFailed(q, "Listing the endpoints of "+ns, err)
		return
	}
	v := namespaceView{NS: ns}
	for i := range list.Items {
		v.Endpoints = append(v.Endpoints, row(&list.Items[i]))
	}
	v.Chart = s.deliveryChart(q, ns, "")
	s.render(q.w, q.r, http.StatusOK, "namespace", q.sess, v)
}

// row is an endpoint's health in a few words.
func row(ep *v1alpha1.WebhookEndpoint) endpointRow {
	r := endpointRow{Name: ep.Name, URL: ep.Spec.URL, Ready: "Unknown", Health: "ok"}
	if r.URL == "" && ep.Spec.URLFrom != nil {
		r.URL = "(from a Secret)"
	}
	if c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		r.Ready = string(c.Status)
		if c.Status != metav1.ConditionTrue {
			r.Ready += ": " + c.Reason
			r.Health = "warn"
		}
	}
	if c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionDisabled); c != nil && c.Status == metav1.ConditionTrue {
		r.Disabled, r.Health = true, "bad"
	}
	if h := ep.Status.Health; h != nil {
		r.SuccessRate, r.Circuit, r.Pending, r.DeadLetters = h.SuccessRate, string(h.CircuitState), h.Pending, h.DeadLettered
		if h.CircuitState != "" && h.CircuitState != v1alpha1.CircuitState("Closed") {
			r.Health = "bad"
		}
		if f := h.LastFailure; f != nil {
			b, _ := json.Marshal(f)
			r.LastFailure = bounded(string(b), 300)
		}
	}
	if ep.Spec.Suspend {
		r.Health = "warn"
	}
	return r
}

// actionView is a button: allowed, or why not.
type actionView struct {
	Allowed bool
	Why     string
}

func action(d decision) actionView { return actionView{Allowed: d.Allowed, Why: d.Why} }

type conditionView struct {
	Type, Status, Reason, Message string
}

type endpointView struct {
	NS, Name   string
	Spec       string
	Row        endpointRow
	Conditions []conditionView
	Deliveries []datav1alpha1.WebhookDelivery
	DelivNote  string
	State      string
	EventType  string
	// EventID, Since and Until filter the deliveries too (since and until as typed).
	EventID, Since, Until string
	// TestEventID is the test event just published, whose deliveries the page links to.
	TestEventID string
	// TestType is a type the endpoint receives, for a test event: its first pattern with
	// wildcards made "test".
	TestType string
	Enable   actionView
	Test     actionView
	Eval     actionView
	Filter   string
	// Flash is the outcome of the action just taken.
	Flash      string
	FlashError bool
	EvalResult string
	// Signing is the signing secret, its rotation, and the action that rotates it.
	Signing signingView
	Chart   chartView
	// Words is the spec in sentences.
	Words []string
}

func (s *Server) endpointPage(q *request) { s.showEndpoint(q, http.StatusOK, "", false, "") }

// showEndpoint renders an endpoint with the outcome of an action.
func (s *Server) showEndpoint(q *request, code int, flash string, flashErr bool, evalResult string) {
	s.showEndpointWith(q, code, flash, flashErr, evalResult, "")
}

// showEndpointWith is showEndpoint with a signing secret just generated, shown once.
func (s *Server) showEndpointWith(q *request, code int, flash string, flashErr bool, evalResult, newSecret string) {
	ctx := q.r.Context()
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	var ep v1alpha1.WebhookEndpoint
	if err := q.kube.get(ctx, nsPath(crdPath, ns, "webhookendpoints", name), nil, &ep); err != nil {
		s.apiFailed(q, "Reading endpoint "+ns+"/"+name, err)
		return
	}
	v := endpointView{NS: ns, Name: name, Spec: indentJSON(ep.Spec), Words: specInWords(&ep), Row: row(&ep), Flash: flash, FlashError: flashErr, EvalResult: evalResult,
		Filter: ep.Spec.Filter, State: q.r.URL.Query().Get("state"), EventType: q.r.URL.Query().Get("type")}
	for _, c := range ep.Status.Conditions {
		v.Conditions = append(v.Conditions, conditionView{c.Type, string(c.Status), c.Reason, c.Message})
	}
	if len(ep.Spec.EventTypes) > 0 {
		v.TestType = strings.NewReplacer("*", "test", ">", "test").Replace(string(ep.Spec.EventTypes[0]))
	}
	query := q.r.URL.Query()
	v.EventID, v.Since, v.Until = query.Get("id"), query.Get("since"), query.Get("until")
	sel, ferr := s.deliveryFilter(name, v.State, v.EventType, v.EventID, v.Since, v.Until)
	var dl datav1alpha1.WebhookDeliveryList
	if ferr != nil {
		v.DelivNote = "The filter is not valid: " + ferr.Error()
	} else if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries), url.Values{"fieldSelector": {sel}, "limit": {fmt.Sprint(pageDeliveries)}}, &dl); err != nil {
		v.DelivNote = "The deliveries cannot be shown: " + err.Error()
	} else {
		v.Deliveries = dl.Items
	}
	d := q.kube.can(ctx, ns, canPatchEndpoints, canPublish, canDeliveryPayload, canCreateSecrets)
	v.Enable, v.Test = action(d[canPatchEndpoints]), action(d[canPublish])
	v.Eval = action(d[canDeliveryPayload])
	rotate := d[canCreateSecrets]
	if !d[canPatchEndpoints].Allowed {
		rotate = d[canPatchEndpoints]
	}
	v.Signing = signingOf(&ep, s.o.Now(), rotate)
	v.Chart = s.deliveryChart(q, ns, name)
	v.TestEventID = q.testEventID
	v.Signing.NewSecret = newSecret
	s.render(q.w, q.r, code, "endpoint", q.sess, v)
}

// deliveryFilter is the field selector of an endpoint's deliveries filtered by state, event
// type, event id and time (since, until: as parseWhen reads them); each value bounded and
// never able to add a selector of its own.
func (s *Server) deliveryFilter(endpoint, state, eventType, eventID, since, until string) (string, error) {
	sel := []string{datav1alpha1.FieldEndpoint + "=" + endpoint}
	for _, f := range []struct{ field, value, what string }{
		{datav1alpha1.FieldState, state, "state"}, {datav1alpha1.FieldEventType, eventType, "event type"}, {datav1alpha1.FieldEventID, eventID, "event id"},
	} {
		if f.value == "" {
			continue
		}
		if len(f.value) > 255 || strings.ContainsAny(f.value, ",=!") {
			return "", fmt.Errorf("the %s %q is not one (at most 255 characters, no , = or !)", f.what, bounded(f.value, 64))
		}
		sel = append(sel, f.field+"="+f.value)
	}
	now := s.o.Now()
	from, err := parseWhen(since, now)
	if err != nil {
		return "", fmt.Errorf("since: %w", err)
	}
	to, err := parseWhen(until, now)
	if err != nil {
		return "", fmt.Errorf("until: %w", err)
	}
	if !from.IsZero() {
		sel = append(sel, datav1alpha1.FieldSince+"="+from.Format(time.RFC3339Nano))
	}
	if !to.IsZero() {
		sel = append(sel, datav1alpha1.FieldUntil+"="+to.Format(time.RFC3339Nano))
	}
	return strings.Join(sel, ","), nil
}

// enable re-enables an endpoint as `kubectl webhooks enable` does: the enabled-at annotation.
func (s *Server) enable(q *request) {
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationEnable: s.o.Now().UTC().Format(time.RFC3339Nano)}}}
	if err := q.kube.mergePatch(q.r.Context(), nsPath(crdPath, ns, "webhookendpoints", name), patch, nil); err != nil {
		s.refused(q, "Enable", err)
		return
	}
	s.showEndpoint(q, http.StatusOK, "Enabled: the dispatcher resets the endpoint's failures and closes its circuit.", false, "")
}

// refused shows an action's failure on the endpoint page, with what the API server said
// (RBAC's refusal names the verb and resource).
func (s *Server) refused(q *request, what string, err error) {
	code := errCode(err)
	msg := what + " failed: " + err.Error()
	if code == http.StatusForbidden {
		msg = what + " refused: " + err.Error()
	}
	if code == 0 {
		code = http.StatusBadGateway
	}
	s.showEndpoint(q, code, msg, true, "")
}

// sendTest publishes a test event of a type the user names (one the endpoint receives)
// through the data API's webhookevents, as a producer with RBAC to create them would.
func (s *Server) sendTest(q *request) {
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	typ := strings.TrimSpace(q.r.PostFormValue("type"))
	data := q.r.PostFormValue("data")
	if data == "" {
		data = `{"test":true}`
	}
	if !json.Valid([]byte(data)) {
		s.showEndpoint(q, http.StatusBadRequest, "The test event's data must be JSON.", true, "")
		return
	}
	ev := &datav1alpha1.WebhookEvent{
		TypeMeta:   metav1.TypeMeta{APIVersion: datav1alpha1.SchemeGroupVersion.String(), Kind: "WebhookEvent"},
		ObjectMeta: metav1.ObjectMeta{Name: "console-test-" + strings.ToLower(randomToken()[:16])},
		Spec:       datav1alpha1.WebhookEventSpec{Type: typ, Data: runtime.RawExtension{Raw: []byte(data)}},
	}
	var out datav1alpha1.WebhookEvent
	if err := q.kube.create(q.r.Context(), nsPath(dataPath, ns, datav1alpha1.ResourceEvents), ev, &out); err != nil {
		s.refused(q, "Sending a test event", err)
		return
	}
	q.testEventID = out.Name
	s.showEndpoint(q, http.StatusOK, fmt.Sprintf("Test event %s of type %s published (sequence %d): every endpoint of %s that receives %s gets it; follow its delivery to %s with the link below.",
		out.Name, typ, out.Status.Sequence, ns, typ, name), false, "")
}

// evaluate runs a filter expression against the payload of the endpoint's latest delivery
// (read through the payload subresource, under its own RBAC), as `kubectl webhooks eval`.
func (s *Server) evaluate(q *request) {
	ctx := q.r.Context()
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	source := q.r.PostFormValue("filter")
	f, err := expr.CompileFilter(source)
	if err != nil {
		s.showEndpoint(q, http.StatusOK, "", false, "The filter does not compile: "+err.Error())
		return
	}
	var dl datav1alpha1.WebhookDeliveryList
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries), url.Values{"fieldSelector": {datav1alpha1.FieldEndpoint + "=" + name}, "limit": {"1"}}, &dl); err != nil {
		s.refused(q, "Reading the latest delivery", err)
		return
	}
	if len(dl.Items) == 0 {
		s.showEndpoint(q, http.StatusOK, "", false, "There is no delivery to evaluate the filter against yet.")
		return
	}
	d := dl.Items[0]
	var p datav1alpha1.DeliveryPayload
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries, d.Name, "payload"), nil, &p); err != nil {
		s.refused(q, "Reading the latest delivery's payload", err)
		return
	}
	ev := &expr.Event{ID: d.Spec.EventID, Type: d.Spec.EventType, Namespace: ns, Time: d.CreationTimestamp.Time, Headers: p.EventHeaders, Data: bodyBytes(p.Event)}
	ok, err := f.Match(ctx, expr.NewInput(ev))
	res := fmt.Sprintf("On delivery %s (event %s, %s): ", d.Name, d.Spec.EventID, d.Spec.EventType)
	switch {
	case err != nil:
		res += "the filter cannot decide, so the dispatcher would dead-letter it as filter_failed: " + err.Error()
	case ok:
		res += "true, the endpoint gets the event."
	default:
		res += "false, the endpoint does not get the event."
	}
	s.showEndpoint(q, http.StatusOK, "", false, res)
}

func bodyBytes(b *datav1alpha1.Body) []byte {
	if b == nil {
		return nil
	}
	if b.JSON != nil {
		return b.JSON.Raw
	}
	return []byte(b.Text)
}

type deliveryView struct {
	NS          string
	D           datav1alpha1.WebhookDelivery
	Payload     *datav1alpha1.DeliveryPayload
	Event       string
	Response    string
	PayloadNote string
}

func (s *Server) deliveryPage(q *request) {
	ctx := q.r.Context()
	ns, id := q.r.PathValue("ns"), q.r.PathValue("id")
	v := deliveryView{NS: ns}
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries, id), nil, &v.D); err != nil {
		s.apiFailed(q, "Reading delivery "+id, err)
		return
	}
	var p datav1alpha1.DeliveryPayload
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries, id, "payload"), nil, &p); err != nil {
		v.PayloadNote = "The payload is not shown: " + err.Error()
	} else {
		v.Payload, v.Event, v.Response = &p, bodyText(p.Event), bodyText(p.Response)
	}
	s.render(q.w, q.r, http.StatusOK, "delivery", q.sess, v)
}

// indentJSON is v as indented JSON for a <pre>, without escaping <, > and & (the page
// escapes them as text), so an expression reads as it was written.
func indentJSON(v any) string {
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err.Error()
	}
	return strings.TrimRight(out.String(), "\n")
}

// bodyText is a body for a <pre>: JSON indented, text as it is.
func bodyText(b *datav1alpha1.Body) string {
	if b == nil {
		return ""
	}
	t := b.Text
	if b.JSON != nil {
		// Indented as it came, without escaping <, > and & (the page escapes them as text).
		var v any
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if json.Unmarshal(b.JSON.Raw, &v) == nil && enc.Encode(v) == nil {
			t = strings.TrimRight(out.String(), "\n")
		}
	}
	if b.Truncated {
		t += "\n… (truncated)"
	}
	return t
}

type deadLettersView struct {
	NS string
	// The filter: endpoint, reason, and the time range dead-lettered (since, until).
	Endpoint, Reason, Since, Until string
	Reasons                        []string
	Items                          []datav1alpha1.WebhookDeadLetter
	// More is true when the page holds the newest pageDeadLetter dead letters of more.
	More     bool
	Replay   actionView
	Purge    actionView
	Flash    string
	FlashErr bool
	// Created are the WebhookReplays an action just created.
	Created []string
}

// deadLetterReasons are the reasons a dead letter may have, for the filter.
var deadLetterReasons = []string{"exhausted", "retry_duration_exceeded", "endpoint_disabled", "endpoint_deleted", "payload_too_large",
	"invalid_event", "test_failed", "filter_failed", "transform_failed"}

// deadLetterFilter is the dead letters a form selects: an endpoint, a reason, and when they
// were dead-lettered (since, until).
type deadLetterFilter struct {
	Endpoint, Reason string
	Since, Until     time.Time
	// The fields as typed, to show them again.
	SinceText, UntilText string
}

// readDeadLetterFilter reads a dead-letter filter from the request's form, bounded.
func (s *Server) readDeadLetterFilter(q *request) (deadLetterFilter, error) {
	f := deadLetterFilter{
		Endpoint:  strings.TrimSpace(q.r.FormValue("endpoint")),
		Reason:    strings.TrimSpace(q.r.FormValue("reason")),
		SinceText: strings.TrimSpace(q.r.FormValue("since")),
		UntilText: strings.TrimSpace(q.r.FormValue("until")),
	}
	if len(f.Endpoint) > maxNameLength || strings.ContainsAny(f.Endpoint, ",=/ ") {
		return f, fmt.Errorf("the endpoint %q is not an endpoint's name", bounded(f.Endpoint, 64))
	}
	if f.Reason != "" && !slices.Contains(deadLetterReasons, f.Reason) {
		return f, fmt.Errorf("the reason %q is not one of %s", bounded(f.Reason, 64), strings.Join(deadLetterReasons, ", "))
	}
	var err error
	if f.Since, err = parseWhen(f.SinceText, s.o.Now()); err != nil {
		return f, fmt.Errorf("since: %w", err)
	}
	if f.Until, err = parseWhen(f.UntilText, s.o.Now()); err != nil {
		return f, fmt.Errorf("until: %w", err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, errors.New("until must be later than since")
	}
	return f, nil
}

// maxNameLength bounds a Kubernetes name typed in a form.
const maxNameLength = 253

// parseWhen reads a time typed in a form: empty (none), an RFC 3339 time, a browser's
// datetime-local value (2006-01-02T15:04, read as UTC), or a duration back from now (2h).
func parseWhen(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if len(v) > 64 {
		return time.Time{}, errors.New("too long for a time")
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return t, nil
		}
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time: write 2026-01-02T15:04 (UTC), an RFC 3339 time, or a duration back from now such as 2h", bounded(v, 64))
}

func (s *Server) deadLettersPage(q *request) { s.showDeadLetters(q, http.StatusOK, "", false, nil) }

func (s *Server) showDeadLetters(q *request, code int, flash string, flashErr bool, created []string) {
	ctx := q.r.Context()
	ns := q.r.PathValue("ns")
	f, ferr := s.readDeadLetterFilter(q)
	if ferr != nil && flash == "" {
		flash, flashErr, code = "The filter is not valid: "+ferr.Error(), true, http.StatusBadRequest
	}
	v := deadLettersView{NS: ns, Endpoint: f.Endpoint, Reason: f.Reason, Since: f.SinceText, Until: f.UntilText, Reasons: deadLetterReasons,
		Flash: flash, FlashErr: flashErr, Created: created}
	query := url.Values{"limit": {fmt.Sprint(pageDeadLetter)}}
	if ferr == nil {
		var sel []string
		if f.Endpoint != "" {
			sel = append(sel, datav1alpha1.FieldEndpoint+"="+f.Endpoint)
		}
		if f.Reason != "" {
			sel = append(sel, datav1alpha1.FieldReason+"="+f.Reason)
		}
		if !f.Until.IsZero() {
			sel = append(sel, datav1alpha1.FieldUntil+"="+f.Until.Format(time.RFC3339Nano))
		}
		if len(sel) > 0 {
			query.Set("fieldSelector", strings.Join(sel, ","))
		}
	}
	var list datav1alpha1.WebhookDeadLetterList
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeadLetters), query, &list); err != nil {
		s.apiFailed(q, "Listing the dead letters of "+ns, err)
		return
	}
	// The list is newest first; since is the page's own filter (the API bounds dead letters
	// by until only).
	for _, d := range list.Items {
		if ferr == nil && !f.Since.IsZero() && d.Status.DeadLetteredTime.Time.Before(f.Since) {
			break
		}
		v.Items = append(v.Items, d)
	}
	v.More = list.Continue != ""
	d := q.kube.can(ctx, ns, canCreateReplays, canPurge)
	v.Replay, v.Purge = action(d[canCreateReplays]), action(d[canPurge])
	s.render(q.w, q.r, code, "deadletters", q.sess, v)
}

// replay creates a WebhookReplay of one dead letter (its endpoint, its delivery id): the
// controller replays it and reports progress on the WebhookReplay.
func (s *Server) replay(q *request) {
	ns := q.r.PathValue("ns")
	id, ep := q.r.PostFormValue("id"), q.r.PostFormValue("endpoint")
	names, err := s.createReplays(q, ns, []v1alpha1.WebhookReplaySpec{{EndpointRef: v1alpha1.LocalObjectReference{Name: ep}, Source: v1alpha1.ReplayDeadLetters, DeliveryIDs: []string{id}}})
	if err != nil {
		s.replayRefused(q, err)
		return
	}
	http.Redirect(q.w, q.r, "/ns/"+url.PathEscape(ns)+"/replays/"+url.PathEscape(names[0]), http.StatusSeeOther)
}

// Bounds of replaying many dead letters at once.
const (
	// maxSelected bounds the dead letters one form may select.
	maxSelected = 500
	// maxIDsPerReplay is what one WebhookReplay may name (spec.deliveryIDs).
	maxIDsPerReplay = 100
)

// replayMany replays several dead letters in one action: those selected on the page (one
// WebhookReplay per endpoint, of at most 100 delivery ids each), or every dead letter a filter
// selects (one WebhookReplay of the endpoint, with its reason and time range), which the
// controller reads from the stream itself, however many there are.
func (s *Server) replayMany(q *request) {
	ns := q.r.PathValue("ns")
	var specs []v1alpha1.WebhookReplaySpec
	switch q.r.PostFormValue("mode") {
	case "filter":
		f, err := s.readDeadLetterFilter(q)
		if err != nil {
			s.showDeadLetters(q, http.StatusBadRequest, "Replay refused: the filter is not valid: "+err.Error(), true, nil)
			return
		}
		if f.Endpoint == "" {
			s.showDeadLetters(q, http.StatusBadRequest, "Replay refused: choose an endpoint in the filter first: a replay is of one endpoint's dead letters.", true, nil)
			return
		}
		spec := v1alpha1.WebhookReplaySpec{EndpointRef: v1alpha1.LocalObjectReference{Name: f.Endpoint}, Source: v1alpha1.ReplayDeadLetters}
		if f.Reason != "" {
			spec.Reasons = []v1alpha1.DeadLetterReason{v1alpha1.DeadLetterReason(f.Reason)}
		}
		if !f.Since.IsZero() {
			spec.Since = &metav1.Time{Time: f.Since}
		}
		if !f.Until.IsZero() {
			spec.Until = &metav1.Time{Time: f.Until}
		}
		specs = append(specs, spec)
	default:
		selected := q.r.PostForm["select"]
		if len(selected) == 0 {
			s.showDeadLetters(q, http.StatusBadRequest, "Replay: no dead letter selected. Tick the ones to replay first.", true, nil)
			return
		}
		if len(selected) > maxSelected {
			s.showDeadLetters(q, http.StatusBadRequest, fmt.Sprintf("Replay refused: %d dead letters selected, at most %d at once; replay by filter instead.", len(selected), maxSelected), true, nil)
			return
		}
		byEndpoint := map[string][]string{}
		var order []string
		for _, sel := range selected {
			ep, id, ok := strings.Cut(sel, "/")
			if !ok || ep == "" || id == "" || len(ep) > maxNameLength || len(id) > 64 {
				s.showDeadLetters(q, http.StatusBadRequest, "Replay refused: a selection is not endpoint/delivery id.", true, nil)
				return
			}
			if _, seen := byEndpoint[ep]; !seen {
				order = append(order, ep)
			}
			if !slices.Contains(byEndpoint[ep], id) {
				byEndpoint[ep] = append(byEndpoint[ep], id)
			}
		}
		for _, ep := range order {
			for ids := range slices.Chunk(byEndpoint[ep], maxIDsPerReplay) {
				specs = append(specs, v1alpha1.WebhookReplaySpec{EndpointRef: v1alpha1.LocalObjectReference{Name: ep}, Source: v1alpha1.ReplayDeadLetters, DeliveryIDs: ids})
			}
		}
	}
	names, err := s.createReplays(q, ns, specs)
	if err != nil {
		if len(names) > 0 {
			err = fmt.Errorf("%w (created before it: %s)", err, strings.Join(names, ", "))
		}
		s.replayRefused(q, err)
		return
	}
	if len(names) == 1 {
		http.Redirect(q.w, q.r, "/ns/"+url.PathEscape(ns)+"/replays/"+url.PathEscape(names[0]), http.StatusSeeOther)
		return
	}
	s.showDeadLetters(q, http.StatusOK, fmt.Sprintf("Created %d WebhookReplays, one per endpoint (at most %d dead letters each): follow each below.", len(names), maxIDsPerReplay), false, names)
}

// createReplays creates a WebhookReplay of each spec, as the user, and returns their names;
// it stops at the first the API server refuses.
func (s *Server) createReplays(q *request, ns string, specs []v1alpha1.WebhookReplaySpec) ([]string, error) {
	var names []string
	for _, spec := range specs {
		wr := &v1alpha1.WebhookReplay{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "WebhookReplay"},
			ObjectMeta: metav1.ObjectMeta{GenerateName: "console-"},
			Spec:       spec,
		}
		var out v1alpha1.WebhookReplay
		if err := q.kube.create(q.r.Context(), nsPath(crdPath, ns, "webhookreplays"), wr, &out); err != nil {
			return names, err
		}
		names = append(names, out.Name)
	}
	return names, nil
}

// replayRefused shows why a replay was not created, with what the API server said.
func (s *Server) replayRefused(q *request, err error) {
	msg := "Replay failed: " + err.Error()
	if errCode(err) == http.StatusForbidden {
		msg = "Replay refused: " + err.Error()
	}
	s.showDeadLetters(q, max(errCode(err), http.StatusBadRequest), msg, true, nil)
}

// purge deletes one dead letter.
func (s *Server) purge(q *request) {
	ns, id := q.r.PathValue("ns"), q.r.PostFormValue("id")
	if id == "" {
		s.showDeadLetters(q, http.StatusBadRequest, "Purge: no dead letter named.", true, nil)
		return
	}
	if err := q.kube.delete(q.r.Context(), nsPath(dataPath, ns, datav1alpha1.ResourceDeadLetters, id), nil, nil); err != nil {
		msg := "Purge failed: " + err.Error()
		if errCode(err) == http.StatusForbidden {
			msg = "Purge refused: " + err.Error()
		}
		s.showDeadLetters(q, max(errCode(err), http.StatusBadRequest), msg, true, nil)
		return
	}
	s.showDeadLetters(q, http.StatusOK, "Purged dead letter "+id+".", false, nil)
}

type deadLetterView struct {
	NS          string
	D           datav1alpha1.WebhookDeadLetter
	Payload     *datav1alpha1.DeliveryPayload
	Event       string
	Response    string
	PayloadNote string
	Replay      actionView
	Purge       actionView
}

// deadLetterPage shows one dead letter: why, every attempt, the event and the last response
// (under the payload subresource's own RBAC), with replay and purge.
func (s *Server) deadLetterPage(q *request) {
	ctx := q.r.Context()
	ns, id := q.r.PathValue("ns"), q.r.PathValue("id")
	v := deadLetterView{NS: ns}
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeadLetters, id), nil, &v.D); err != nil {
		s.apiFailed(q, "Reading dead letter "+id, err)
		return
	}
	var p datav1alpha1.DeliveryPayload
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeadLetters, id, "payload"), nil, &p); err != nil {
		v.PayloadNote = "The payload is not shown: " + err.Error()
	} else {
		v.Payload, v.Event, v.Response = &p, bodyText(p.Event), bodyText(p.Response)
	}
	d := q.kube.can(ctx, ns, canCreateReplays, canPurge)
	v.Replay, v.Purge = action(d[canCreateReplays]), action(d[canPurge])
	s.render(q.w, q.r, http.StatusOK, "deadletter", q.sess, v)
}

type replayView struct {
	NS         string
	R          v1alpha1.WebhookReplay
	Complete   bool
	Conditions []conditionView
}

func (s *Server) replayPage(q *request) {
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	v := replayView{NS: ns}
	if err := q.kube.get(q.r.Context(), nsPath(crdPath, ns, "webhookreplays", name), nil, &v.R); err != nil {
		s.apiFailed(q, "Reading replay "+name, err)
		return
	}
	v.Complete = meta.IsStatusConditionTrue(v.R.Status.Conditions, v1alpha1.ConditionComplete)
	for _, c := range v.R.Status.Conditions {
		v.Conditions = append(v.Conditions, conditionView{c.Type, string(c.Status), c.Reason, c.Message})
	}
	s.render(q.w, q.r, http.StatusOK, "replay", q.sess, v)
}

type quotaView struct {
	NS     string
	Quotas []quotaItem
	Note   string
}

type quotaItem struct{ Name, Spec, Status string }

// quotaPage shows the namespace's WebhookQuotas, read-only.
func (s *Server) quotaPage(q *request) {
	ns := q.r.PathValue("ns")
	var list v1alpha1.WebhookQuotaList
	v := quotaView{NS: ns}
	if err := q.kube.get(q.r.Context(), nsPath(crdPath, ns, "webhookquotas"), nil, &list); err != nil {
		if errCode(err) != http.StatusForbidden {
			s.apiFailed(q, "Listing the quotas of "+ns, err)
			return
		}
		v.Note = "The quotas are not shown: " + err.Error()
	}
	for _, wq := range list.Items {
		v.Quotas = append(v.Quotas, quotaItem{wq.Name, indentJSON(wq.Spec), indentJSON(wq.Status)})
	}
	if len(list.Items) == 0 && v.Note == "" {
		v.Note = "No WebhookQuota in this namespace: the installation's defaults apply."
	}
	s.render(q.w, q.r, http.StatusOK, "quota", q.sess, v)
}
