package console

import (
	"fmt"
	"strings"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// specInWords says what an endpoint's spec does, a sentence a concern, for the people who own
// the receiver and do not read YAML. Everything in it is the spec's own text, rendered by the
// page as text; secrets are named, never read.
func specInWords(ep *v1alpha1.WebhookEndpoint) []string {
	s := &ep.Spec
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	types := make([]string, 0, len(s.EventTypes))
	for _, t := range s.EventTypes {
		types = append(types, string(t))
	}
	where := s.URL
	if where == "" && s.URLFrom != nil {
		where = fmt.Sprintf("the URL in Secret %s (key %s)", s.URLFrom.SecretKeyRef.Name, s.URLFrom.SecretKeyRef.Key)
	}
	from := "this namespace"
	if len(s.SourceNamespaces) > 0 {
		from = "this namespace and " + strings.Join(s.SourceNamespaces, ", ")
	}
	add("Delivers the events of type %s published in %s to %s.", strings.Join(types, ", "), from, where)
	if s.Filter != "" {
		add("Only the events its filter accepts: %s", s.Filter)
	}
	if f := s.Format; f != nil && f.Type != "" && f.Type != v1alpha1.FormatRaw {
		mode := ""
		if f.Type == v1alpha1.FormatCloudEvents && f.CloudEventsMode != "" {
			mode = " (" + string(f.CloudEventsMode) + " mode)"
		}
		add("Each request is written as a %s message%s.", f.Type, mode)
	}
	if t := s.Transform; t != nil {
		if t.Body != "" {
			add("The request body is built by: %s", t.Body)
		}
		for _, h := range t.Headers {
			add("Header %s is set to: %s", h.Name, h.Expression)
		}
	}
	for _, h := range s.Headers {
		add("Header %s: %s.", h.Name, h.Value)
	}
	for _, h := range s.HeadersFrom {
		add("Header %s comes from Secret %s (key %s).", h.Name, h.SecretKeyRef.Name, h.SecretKeyRef.Key)
	}
	if a := s.Auth; a != nil {
		switch {
		case a.OAuth2ClientCredentials != nil:
			add("Requests carry an OAuth2 access token (client credentials from %s).", a.OAuth2ClientCredentials.TokenURL)
		case a.SignedJWT != nil:
			add("Requests carry a JWT the dispatcher signs.")
		}
	}
	if p := s.Proxy; p != nil {
		add("Requests go through the proxy %s.", p.URL)
	}
	success := "any 2xx answer"
	if len(s.SuccessStatusCodes) > 0 {
		codes := make([]string, len(s.SuccessStatusCodes))
		for i, c := range s.SuccessStatusCodes {
			codes[i] = fmt.Sprint(c)
		}
		success = "an answer of " + strings.Join(codes, ", ")
	}
	timeout := "the default timeout"
	if s.Timeout != nil {
		timeout = "a timeout of " + s.Timeout.Duration.String()
	}
	add("A delivery succeeds on %s within %s; redirects are failures.", success, timeout)
	if s.RetryPolicyRef != nil {
		add("Failures are retried as RetryPolicy %s says, then dead-lettered.", s.RetryPolicyRef.Name)
	} else {
		add("Failures are retried with the installation's default retry policy, then dead-lettered.")
	}
	limits := []string{}
	if s.MaxInFlight != nil {
		limits = append(limits, fmt.Sprintf("at most %d requests at once", *s.MaxInFlight))
	}
	if r := s.RateLimit; r != nil {
		limits = append(limits, fmt.Sprintf("at most %d requests a second", r.RequestsPerSecond))
	}
	if len(limits) > 0 {
		add("Sends %s.", strings.Join(limits, " and "))
	}
	if o := s.Ordering; o != nil && o.Mode == v1alpha1.OrderingPerKey {
		key := "a key"
		if k := o.Key; k != nil && k.Header != "" {
			key = "the header " + k.Header
		} else if k != nil && k.JSONField != "" {
			key = "the field " + k.JSONField
		}
		add("Keeps the order of the events of one key (%s): no two of a key in flight.", key)
	}
	if d := s.Dispatcher; d != nil && d.Dedicated {
		add("Has a dispatcher of its own.")
	}
	if s.Suspend {
		add("Suspended: deliveries are held in the stream until it is resumed.")
	}
	return out
}
