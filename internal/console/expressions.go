package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Editing an endpoint's filter and transformation: the expressions typed are compiled and
// evaluated here, by internal/expr with the dispatcher's own limits (cost estimated before,
// metered while it runs, a deadline), on a sample event (a recent delivery's event, read
// through the payload subresource under its own RBAC, or one typed in the form), and saved
// by a patch of the endpoint as the user, only once they compile.

// Bounds of the editor.
const (
	// sampleDeliveries is how many recent deliveries the form offers as the sample.
	sampleDeliveries = 20
	// maxSampleBytes bounds a sample event typed in the form.
	maxSampleBytes = 64 << 10
	// maxShownOutput bounds the transformed body shown.
	maxShownOutput = 64 << 10
)

// expressionsView is the editor.
type expressionsView struct {
	NS, Name string
	// ResourceVersion is the endpoint's as the form was made: a save patches that version.
	ResourceVersion string
	Filter          string
	Body            string
	// Headers are the transformation's headers, one "Name: expression" a line.
	Headers string
	// Sample is the sample chosen: a delivery's name, or "custom" for the typed event.
	Sample     string
	Samples    []datav1alpha1.WebhookDelivery
	SampleNote string
	SampleType string
	SampleData string
	Format     string
	Save       actionView
	Payload    actionView
	Flash      string
	FlashError bool
	// Result is the evaluation's outcome, when there is one.
	Result *evalResult
}

// evalResult is what the expressions make of the sample event.
type evalResult struct {
	// On says which event they were evaluated on.
	On            string
	PayloadIsJSON bool
	// Filter is the verdict in words; FilterError is true when the filter failed.
	Filter      string
	FilterError bool
	// Transform is the transformation's outcome.
	Transform        bool
	TransformError   string
	BodyUnchanged    bool
	Body             string
	ContentType      string
	TransformHeaders [][2]string
}

// expressionsForm is the editor's form as typed.
type expressionsForm struct {
	filter, body, headers string
	parsed                []v1alpha1.TransformHeader
}

func readExpressionsForm(q *request) (expressionsForm, error) {
	f := expressionsForm{filter: strings.TrimSpace(q.r.PostFormValue("filter")), body: strings.TrimSpace(q.r.PostFormValue("body")),
		headers: strings.TrimSpace(q.r.PostFormValue("headers"))}
	if len(f.filter) > expr.MaxSourceLength || len(f.body) > expr.MaxSourceLength {
		return f, fmt.Errorf("an expression is longer than %d characters", expr.MaxSourceLength)
	}
	if len(f.headers) > expr.MaxTransformHeaders*(128+2+expr.MaxHeaderSourceLength+2) {
		return f, errors.New("the headers are longer than 16 headers can be")
	}
	var err error
	f.parsed, err = parseHeaderLines(f.headers)
	return f, err
}

// parseHeaderLines reads "Name: expression" lines (blank ones skipped).
func parseHeaderLines(s string) ([]v1alpha1.TransformHeader, error) {
	var out []v1alpha1.TransformHeader
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, src, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "" || strings.TrimSpace(src) == "" {
			return nil, fmt.Errorf("header line %d: write Name: expression, e.g. X-Order-Id: payload.order_id", i+1)
		}
		out = append(out, v1alpha1.TransformHeader{Name: strings.TrimSpace(name), Expression: strings.TrimSpace(src)})
		if len(out) > expr.MaxTransformHeaders {
			return nil, fmt.Errorf("more than %d headers", expr.MaxTransformHeaders)
		}
	}
	return out, nil
}

// spec is the filter and transformation the form says.
func (f expressionsForm) spec() v1alpha1.WebhookEndpointSpec {
	var spec v1alpha1.WebhookEndpointSpec
	spec.Filter = f.filter
	if f.body != "" || len(f.parsed) > 0 {
		spec.Transform = &v1alpha1.TransformSpec{Body: f.body, Headers: f.parsed}
	}
	return spec
}

// compile compiles the form's expressions as the controller and the dispatcher do.
func (f expressionsForm) compile() (*expr.Filter, *expr.Transform, error) {
	spec := f.spec()
	filter, err := expr.FilterOf(&spec)
	if err != nil {
		return nil, nil, compileError(err)
	}
	transform, err := expr.TransformOf(&spec)
	if err != nil {
		return nil, nil, compileError(err)
	}
	return filter, transform, nil
}

// compileError is CEL's report with the error, as kubectl webhooks eval prints it.
func compileError(err error) error {
	var ee *expr.Error
	if errors.As(err, &ee) && ee.Report != "" {
		return fmt.Errorf("%w\n%s", err, ee.Report)
	}
	return err
}

func headerLines(hs []v1alpha1.TransformHeader) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.Name + ": " + h.Expression + "\n")
	}
	return b.String()
}

// expressionsPage shows the editor with the endpoint's own expressions.
func (s *Server) expressionsPage(q *request) {
	s.showExpressions(q, http.StatusOK, nil, "", false, nil)
}

// showExpressions renders the editor: with the form as typed (form not nil) or the endpoint's
// own expressions, an outcome and an evaluation.
func (s *Server) showExpressions(q *request, code int, form *expressionsForm, flash string, flashErr bool, res *evalResult) {
	ctx := q.r.Context()
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	var ep v1alpha1.WebhookEndpoint
	if err := q.kube.get(ctx, nsPath(crdPath, ns, "webhookendpoints", name), nil, &ep); err != nil {
		s.apiFailed(q, "Reading endpoint "+ns+"/"+name, err)
		return
	}
	v := expressionsView{NS: ns, Name: name, ResourceVersion: ep.ResourceVersion, Flash: flash, FlashError: flashErr, Result: res,
		Sample: q.r.FormValue("sample"), SampleType: q.r.FormValue("sample_type"), SampleData: q.r.FormValue("sample_data")}
	if f := ep.Spec.Format; f != nil {
		v.Format = string(f.Type)
	}
	if form != nil {
		v.Filter, v.Body, v.Headers = form.filter, form.body, form.headers
		// The version the user edits stays the one their form was made from, so a save
		// after an evaluation still notices a change made meanwhile.
		if rv := q.r.PostFormValue("resourceVersion"); rv != "" {
			v.ResourceVersion = rv
		}
	} else {
		v.Filter = ep.Spec.Filter
		if t := ep.Spec.Transform; t != nil {
			v.Body, v.Headers = t.Body, headerLines(t.Headers)
		}
	}
	if v.SampleType == "" && len(ep.Spec.EventTypes) > 0 {
		v.SampleType = strings.NewReplacer("*", "test", ">", "test").Replace(string(ep.Spec.EventTypes[0]))
	}
	if v.SampleData == "" {
		v.SampleData = `{"test":true}`
	}
	var dl datav1alpha1.WebhookDeliveryList
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries), url.Values{"fieldSelector": {datav1alpha1.FieldEndpoint + "=" + name},
		"limit": {fmt.Sprint(sampleDeliveries)}}, &dl); err != nil {
		v.SampleNote = "Recent deliveries cannot be offered as samples: " + err.Error()
	} else {
		v.Samples = dl.Items
	}
	if v.Sample == "" {
		v.Sample = "custom"
		if len(v.Samples) > 0 {
			v.Sample = v.Samples[0].Name
		}
	}
	d := q.kube.can(ctx, ns, canPatchEndpoints, canDeliveryPayload)
	v.Save, v.Payload = action(d[canPatchEndpoints]), action(d[canDeliveryPayload])
	s.render(q.w, q.r, code, "expressions", q.sess, v)
}

// evaluateExpressions evaluates the form's expressions on the sample event, without saving.
func (s *Server) evaluateExpressions(q *request) {
	form, err := readExpressionsForm(q)
	if err != nil {
		s.showExpressions(q, http.StatusBadRequest, &form, "Not evaluated: "+err.Error(), true, nil)
		return
	}
	res, code, err := s.evaluateForm(q, form)
	if err != nil {
		s.showExpressions(q, code, &form, err.Error(), true, nil)
		return
	}
	s.showExpressions(q, http.StatusOK, &form, "", false, res)
}

// evaluateForm compiles the form's expressions and evaluates them on its sample event.
func (s *Server) evaluateForm(q *request, form expressionsForm) (*evalResult, int, error) {
	filter, transform, err := form.compile()
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("Does not compile: %w", err)
	}
	ev, on, code, err := s.sampleEvent(q)
	if err != nil {
		return nil, code, err
	}
	ctx := q.r.Context()
	in := expr.NewInput(ev)
	res := &evalResult{On: on, PayloadIsJSON: in.IsJSON()}
	if filter == nil {
		res.Filter = "No filter: the endpoint gets every event of its types."
	} else {
		ok, err := filter.Match(ctx, in)
		switch {
		case err != nil:
			res.Filter, res.FilterError = "The filter cannot decide, so the dispatcher would dead-letter the delivery as filter_failed: "+err.Error(), true
		case ok:
			res.Filter = "true: the endpoint gets the event."
		default:
			res.Filter = "false: the endpoint does not get the event (and it is not in the delivery log)."
		}
	}
	if transform != nil {
		res.Transform = true
		out, err := transform.Apply(ctx, in)
		if err != nil {
			res.TransformError = "The transformation fails, so the dispatcher would dead-letter the delivery as transform_failed: " + err.Error()
		} else {
			res.BodyUnchanged, res.ContentType = out.Body == nil, out.ContentType
			res.Body = string(out.Body)
			if len(res.Body) > maxShownOutput {
				res.Body = strings.ToValidUTF8(res.Body[:maxShownOutput], "") + "\n… (the first 64 KiB of " + fmt.Sprint(len(out.Body)) + " bytes)"
			} else if !utf8.ValidString(res.Body) {
				res.Body = fmt.Sprintf("(%d bytes that are not text)", len(out.Body))
			}
			for k, vs := range out.Headers {
				res.TransformHeaders = append(res.TransformHeaders, [2]string{k, vs[0]})
			}
			slices.SortFunc(res.TransformHeaders, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
		}
	}
	return res, http.StatusOK, nil
}

// sampleEvent is the event the form chose: a recent delivery's (its payload read as the user)
// or the one typed.
func (s *Server) sampleEvent(q *request) (*expr.Event, string, int, error) {
	ctx := q.r.Context()
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	sample := q.r.PostFormValue("sample")
	if sample == "custom" || sample == "" {
		typ := strings.TrimSpace(q.r.PostFormValue("sample_type"))
		data := q.r.PostFormValue("sample_data")
		if typ == "" || len(typ) > 255 {
			return nil, "", http.StatusBadRequest, errors.New("The sample event needs a type (at most 255 characters).")
		}
		if len(data) > maxSampleBytes {
			return nil, "", http.StatusBadRequest, fmt.Errorf("The sample event's data is larger than %d KiB.", maxSampleBytes>>10)
		}
		h := map[string][]string{records.HeaderContentType: {"application/json"}}
		if !json.Valid([]byte(data)) {
			h = map[string][]string{records.HeaderContentType: {"text/plain"}}
		}
		return &expr.Event{ID: "evt_console_sample", Type: typ, Namespace: ns, Time: s.o.Now().UTC(), Headers: h, Data: []byte(data)},
			"the sample event typed below (type " + typ + ")", http.StatusOK, nil
	}
	if len(sample) > 64 || strings.ContainsAny(sample, "/?#") {
		return nil, "", http.StatusBadRequest, errors.New("The sample is not a delivery's name.")
	}
	var d datav1alpha1.WebhookDelivery
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries, sample), nil, &d); err != nil {
		return nil, "", apiStatus(err), fmt.Errorf("Reading the sample delivery %s: %w", sample, err)
	}
	if d.Spec.Endpoint != name {
		return nil, "", http.StatusBadRequest, fmt.Errorf("Delivery %s is not one of %s's.", sample, name)
	}
	var p datav1alpha1.DeliveryPayload
	if err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries, sample, "payload"), nil, &p); err != nil {
		what := "Reading the sample delivery's event failed: "
		if errCode(err) == http.StatusForbidden {
			what = "Reading the sample delivery's event refused: "
		}
		return nil, "", apiStatus(err), errors.New(what + err.Error() + " Choose the sample event typed below instead.")
	}
	if p.Event == nil {
		return nil, "", http.StatusConflict, fmt.Errorf("Delivery %s's event is no longer stored%s: choose another sample.", sample, removedText(p.Removed))
	}
	if p.Event.Truncated {
		return nil, "", http.StatusConflict, fmt.Errorf("Delivery %s's stored event is cut short: choose another sample.", sample)
	}
	return &expr.Event{ID: d.Spec.EventID, Type: d.Spec.EventType, Namespace: ns, Time: d.CreationTimestamp.Time, Headers: p.EventHeaders, Data: bodyBytes(p.Event)},
		"delivery " + d.Name + " (event " + d.Spec.EventID + ", " + d.Spec.EventType + ")", http.StatusOK, nil
}

// apiStatus is the status of an API error to answer with: the API server's, else 502.
func apiStatus(err error) int {
	if c := errCode(err); c != 0 {
		return c
	}
	return http.StatusBadGateway
}

func removedText(why string) string {
	if why == "" {
		return ""
	}
	return " (" + why + ")"
}

// saveExpressions saves the form's filter and transformation into the endpoint, as the
// user, at the version the form was made from; they are compiled and evaluated on the sample
// first, and nothing is saved when they do not compile.
func (s *Server) saveExpressions(q *request) {
	ns, name := q.r.PathValue("ns"), q.r.PathValue("name")
	form, err := readExpressionsForm(q)
	if err != nil {
		s.showExpressions(q, http.StatusBadRequest, &form, "Not saved: "+err.Error(), true, nil)
		return
	}
	if _, _, err := form.compile(); err != nil {
		s.showExpressions(q, http.StatusBadRequest, &form, "Not saved: does not compile: "+err.Error(), true, nil)
		return
	}
	rv := q.r.PostFormValue("resourceVersion")
	if rv == "" || len(rv) > 64 {
		s.showExpressions(q, http.StatusBadRequest, &form, "Not saved: the form has no resourceVersion; reload the page.", true, nil)
		return
	}
	spec := form.spec()
	patch := map[string]any{"metadata": map[string]any{"resourceVersion": rv}, "spec": map[string]any{"filter": nil, "transform": nil}}
	if spec.Filter != "" {
		patch["spec"].(map[string]any)["filter"] = spec.Filter
	}
	if spec.Transform != nil {
		// The whole transformation, replacing the one stored (a merge patch would merge
		// the headers' list otherwise: lists are replaced, but an emptied body must go).
		t := map[string]any{"body": nil, "headers": nil}
		if spec.Transform.Body != "" {
			t["body"] = spec.Transform.Body
		}
		if len(spec.Transform.Headers) > 0 {
			t["headers"] = spec.Transform.Headers
		}
		patch["spec"].(map[string]any)["transform"] = t
	}
	if err := q.kube.mergePatch(q.r.Context(), nsPath(crdPath, ns, "webhookendpoints", name), patch, nil); err != nil {
		msg := "Not saved: " + err.Error()
		switch errCode(err) {
		case http.StatusForbidden:
			msg = "Save refused: " + err.Error()
		case http.StatusConflict:
			msg = "Not saved: the endpoint changed since this form was made (" + err.Error() + "). Reload the page to edit the current version."
		}
		s.showExpressions(q, max(errCode(err), http.StatusBadRequest), &form, msg, true, nil)
		return
	}
	res, _, evalErr := s.evaluateForm(q, form)
	msg := "Saved: the controller checks the expressions again and the dispatchers use them from the next event."
	if evalErr != nil {
		msg += " (Not evaluated on the sample: " + evalErr.Error() + ")"
	}
	// The form shows the endpoint as it is now, at its new version.
	q.r.PostForm.Del("resourceVersion")
	s.showExpressions(q, http.StatusOK, &form, msg, false, res)
}
