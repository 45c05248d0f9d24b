// Package cloudevent maps webhook-operator's events to and from CloudEvents 1.0
// (github.com/cloudevents/sdk-go/v2): how the ingress stores a CloudEvent's attributes on the
// event it publishes (Event.SetHeaders), how a dispatcher reads them back (FromMessage), and
// the request an endpoint of format CloudEvents gets (Encode, a pure function of the event and
// the content mode).
//
// An event's attributes live where the rest of the product already reads them: id is the
// Nats-Msg-Id, type the subject's last tokens, time the Webhook-Event-Time header,
// datacontenttype the Content-Type; source, subject, dataschema and extension attributes are
// ce-<name> headers, as the CloudEvents NATS binding's binary mode names them. An event
// published without a source (the ingress's JSON form, a NATS producer) gets DefaultSource of
// its namespace. In the HTTP binding's binary mode every ce-* value is percent-encoded on the
// way out (Encode, EncodeHeaderValue) and decoded once on the way in (DecodeBinaryHeaders), as
// its section 3.1.3.2 requires. The W3C trace context is the traceparent and tracestate headers, never an
// extension header: the dispatcher continues it into its delivery spans either way.
package cloudevent

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Mode is the content mode of a CloudEvents request.
type Mode string

// Content modes of the CloudEvents HTTP binding.
const (
	// Binary: the attributes are ce-* headers, the body is the event's data as is.
	Binary Mode = "Binary"
	// Structured: the body is the whole event as application/cloudevents+json.
	Structured Mode = "Structured"
)

// Headers of the stored attributes (see the package doc).
const (
	HeaderSource     = records.HeaderCEPrefix + "Source"
	HeaderSubject    = records.HeaderCEPrefix + "Subject"
	HeaderDataSchema = records.HeaderCEPrefix + "Dataschema"
	// HeaderPartitionKey is the partitioning extension (partitionkey): the ingress's ordering
	// key, which a PerKey endpoint reads with ordering.key.header: ce-partitionkey.
	HeaderPartitionKey = records.HeaderCEPrefix + "Partitionkey"
)

// PartitionKey is the CloudEvents partitioning extension's attribute.
const PartitionKey = "partitionkey"

// Bounds of the attributes an event may carry besides its data.
const (
	// MaxExtensions bounds the extension attributes (partitionkey included).
	MaxExtensions = 16
	// MaxAttributeBytes bounds one attribute's value (source, subject, dataschema, an
	// extension).
	MaxAttributeBytes = 1024
	// MaxAttributesBytes bounds the stored attributes together, names and values.
	MaxAttributesBytes = 4096
)

// Event is one event with its CloudEvents attributes.
type Event struct {
	ID, Type string
	// Source is a URI-reference; empty: DefaultSource of the namespace.
	Source     string
	Subject    string
	DataSchema string
	Time       time.Time
	// ContentType is the data's media type (datacontenttype); empty: application/json.
	ContentType string
	// Extensions are the extension attributes by name (lower-case letters and digits), as
	// strings (their binary-mode form).
	Extensions map[string]string
	Data       []byte
}

// DefaultSource is the source of the events of namespace that carry none: the path of the
// virtual resource producers are authorized on.
func DefaultSource(namespace string) string {
	return "/apis/webhook-operator.io/v1alpha1/namespaces/" + namespace + "/webhookevents"
}

// extensionName is a CloudEvents attribute name: lower-case letters and digits, at most 20.
var extensionName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// reserved are attribute names that are not extensions, or that travel elsewhere.
var reserved = map[string]bool{
	"specversion": true, "id": true, "source": true, "type": true, "subject": true, "time": true,
	"datacontenttype": true, "dataschema": true, "data": true, "data_base64": true,
	"traceparent": true, "tracestate": true,
}

// FromMessage is the event a delivery carries: its id, type and time as the dispatcher read
// them, the attributes the stored headers h hold, its content type and data. namespace names
// the default source.
func FromMessage(id, eventType, namespace string, t time.Time, h nats.Header, contentType string, data []byte) Event {
	e := Event{ID: id, Type: eventType, Time: t, ContentType: contentType, Data: data}
	// NATS headers are case-sensitive; a producer on NATS may write ce-source or Ce-Source.
	for k, v := range h {
		name, ok := cutPrefixFold(k, records.HeaderCEPrefix)
		if !ok || len(v) == 0 {
			continue
		}
		switch name = strings.ToLower(name); name {
		case "source":
			e.Source = v[0]
		case "subject":
			e.Subject = v[0]
		case "dataschema":
			e.DataSchema = v[0]
		default:
			if reserved[name] || !extensionName.MatchString(name) || len(e.Extensions) == MaxExtensions {
				continue
			}
			if e.Extensions == nil {
				e.Extensions = make(map[string]string, 4)
			}
			e.Extensions[name] = v[0]
		}
	}
	if e.Source == "" {
		e.Source = DefaultSource(namespace)
	}
	return e
}

// SetHeaders writes e's stored attributes into h: source, subject, dataschema and the
// extensions as ce-* headers, the time as Webhook-Event-Time and the content type. The id
// (Nats-Msg-Id) and type (the subject) are the publisher's to set.
func (e Event) SetHeaders(h nats.Header) {
	if e.Source != "" {
		h.Set(HeaderSource, e.Source)
	}
	if e.Subject != "" {
		h.Set(HeaderSubject, e.Subject)
	}
	if e.DataSchema != "" {
		h.Set(HeaderDataSchema, e.DataSchema)
	}
	for name, v := range e.Extensions {
		h.Set(http.CanonicalHeaderKey(records.HeaderCEPrefix+name), v)
	}
	if !e.Time.IsZero() {
		h.Set(records.HeaderEventTime, e.Time.UTC().Format(time.RFC3339Nano))
	}
	if e.ContentType != "" {
		h.Set(records.HeaderContentType, e.ContentType)
	}
}

// Validate says what of e's attributes cannot be stored and delivered: a source that is no
// URI-reference, a value that is too long or holds a control character, an extension name
// that is not one, too many or too large extensions.
func (e Event) Validate() error {
	var errs []error
	size := 0
	check := func(name, v string) {
		size += len(name) + len(v)
		switch {
		case len(v) > MaxAttributeBytes:
			errs = append(errs, fmt.Errorf("attribute %s is %d bytes; at most %d are allowed", name, len(v), MaxAttributeBytes))
		case !validValue(v):
			errs = append(errs, fmt.Errorf("attribute %s holds a control character or invalid UTF-8", name))
		}
	}
	check("source", e.Source)
	if e.Source != "" {
		if _, err := url.Parse(e.Source); err != nil {
			errs = append(errs, fmt.Errorf("attribute source %q is not a URI-reference", bound(e.Source)))
		}
	}
	check("subject", e.Subject)
	check("dataschema", e.DataSchema)
	if e.DataSchema != "" {
		if u, err := url.Parse(e.DataSchema); err != nil || !u.IsAbs() {
			errs = append(errs, fmt.Errorf("attribute dataschema %q is not an absolute URI", bound(e.DataSchema)))
		}
	}
	if len(e.Extensions) > MaxExtensions {
		errs = append(errs, fmt.Errorf("%d extension attributes; at most %d are allowed", len(e.Extensions), MaxExtensions))
	}
	names := make([]string, 0, len(e.Extensions))
	for name := range e.Extensions {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !extensionName.MatchString(name) || reserved[name] {
			errs = append(errs, fmt.Errorf("%q is not an extension attribute name (lower-case letters and digits, at most 20, none of the spec's own)", bound(name)))
			continue
		}
		check(name, e.Extensions[name])
	}
	if size > MaxAttributesBytes {
		errs = append(errs, fmt.Errorf("the attributes take %d bytes; at most %d are allowed", size, MaxAttributesBytes))
	}
	if e.ContentType != "" && e.ContentType != "application/json" {
		if _, _, err := mime.ParseMediaType(e.ContentType); err != nil || !validValue(e.ContentType) || len(e.ContentType) > 256 {
			errs = append(errs, fmt.Errorf("datacontenttype %q is not a media type", bound(e.ContentType)))
		}
	}
	return errors.Join(errs...)
}

// FromSDK takes an SDK event's attributes and data; extension values become their string
// (binary-mode) form, and the trace context extension is returned apart, for the publisher's
// traceparent and tracestate headers.
func FromSDK(ce *event.Event) (e Event, traceparent, tracestate string, err error) {
	e = Event{ID: ce.ID(), Type: ce.Type(), Source: ce.Source(), Subject: ce.Subject(), Time: ce.Time(),
		ContentType: ce.DataContentType(), Data: ce.Data()}
	if s := ce.DataSchema(); s != "" {
		e.DataSchema = s
	}
	for name, v := range ce.Extensions() {
		s, cerr := types.Format(v)
		if cerr != nil {
			return e, "", "", fmt.Errorf("extension %s: %w", bound(name), cerr)
		}
		switch name {
		case "traceparent":
			traceparent = s
		case "tracestate":
			tracestate = s
		default:
			if e.Extensions == nil {
				e.Extensions = map[string]string{}
			}
			e.Extensions[name] = s
		}
	}
	return e, traceparent, tracestate, nil
}

// Encode builds the request of e in mode: the headers to set (the ce-* attributes in binary
// mode; Content-Type in both) and the body (e's data in binary mode, the event as
// application/cloudevents+json in structured mode, with its data inline when it is JSON or
// UTF-8 text, else as data_base64). The Standard Webhooks signature is made over the body it
// returns.
func Encode(e Event, mode Mode) (http.Header, []byte, error) {
	ct := e.ContentType
	if ct == "" {
		ct = "application/json"
	}
	if mode == Structured {
		ev := event.New()
		ev.SetID(e.ID)
		ev.SetType(e.Type)
		ev.SetSource(e.Source)
		if e.Subject != "" {
			ev.SetSubject(e.Subject)
		}
		if e.DataSchema != "" {
			ev.SetDataSchema(e.DataSchema)
		}
		if !e.Time.IsZero() {
			ev.SetTime(e.Time)
		}
		for name, v := range e.Extensions {
			ev.SetExtension(name, v)
		}
		ev.SetDataContentType(ct)
		if len(e.Data) > 0 {
			ev.DataEncoded = e.Data
			ev.DataBase64 = !inline(ct, e.Data)
		}
		if err := ev.Validate(); err != nil {
			return nil, nil, err
		}
		body, err := json.Marshal(ev)
		if err != nil {
			return nil, nil, err
		}
		return http.Header{"Content-Type": {event.ApplicationCloudEventsJSON + "; charset=utf-8"}}, body, nil
	}
	if e.ID == "" || e.Type == "" || e.Source == "" {
		return nil, nil, errors.New("a CloudEvent needs an id, a type and a source")
	}
	// Every ce-* value is percent-encoded (the HTTP binding, 3.1.3.2); Content-Type is not
	// an attribute header.
	h := make(http.Header, 8+len(e.Extensions))
	h["Content-Type"] = []string{ct}
	h["Ce-Specversion"] = []string{event.CloudEventsVersionV1}
	h["Ce-Id"] = []string{EncodeHeaderValue(e.ID)}
	h["Ce-Source"] = []string{EncodeHeaderValue(e.Source)}
	h["Ce-Type"] = []string{EncodeHeaderValue(e.Type)}
	if !e.Time.IsZero() {
		h["Ce-Time"] = []string{e.Time.UTC().Format(time.RFC3339Nano)}
	}
	if e.Subject != "" {
		h["Ce-Subject"] = []string{EncodeHeaderValue(e.Subject)}
	}
	if e.DataSchema != "" {
		h["Ce-Dataschema"] = []string{EncodeHeaderValue(e.DataSchema)}
	}
	for name, v := range e.Extensions {
		h[http.CanonicalHeaderKey("ce-"+name)] = []string{EncodeHeaderValue(v)}
	}
	return h, e.Data, nil
}

// EncodeHeaderValue is an attribute's value as a binary-mode ce-* header carries it
// (the CloudEvents HTTP binding, 3.1.3.2): space, double quote, percent and every byte
// outside printable ASCII (U+0021 to U+007E) become %XX of their UTF-8 bytes; the rest is
// kept as it is.
func EncodeHeaderValue(v string) string {
	n := 0
	for i := 0; i < len(v); i++ {
		if mustEscape(v[i]) {
			n++
		}
	}
	if n == 0 {
		return v
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+2*n)
	for i := 0; i < len(v); i++ {
		c := v[i]
		if mustEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func mustEscape(c byte) bool { return c <= 0x20 || c == '"' || c == '%' || c >= 0x7f }

// DecodeHeaderValue is the one round of percent-decoding a binary-mode ce-* header value
// gets (3.1.3.2): each %XX of two hex digits becomes its byte, an escape where none was needed
// included. A '%' not followed by two hex digits is kept as it is, so the values of a sender
// that does not encode (the Go SDK, cloudevents/sdk-go#1331) read as they were sent unless
// they hold %XX themselves. A value that decodes to invalid UTF-8 is an error, as the binding
// requires.
func DecodeHeaderValue(v string) (string, error) {
	if strings.IndexByte(v, '%') < 0 {
		return v, nil
	}
	b := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] == '%' && i+2 < len(v) && isHex(v[i+1]) && isHex(v[i+2]) {
			b = append(b, unhex(v[i+1])<<4|unhex(v[i+2]))
			i += 2
			continue
		}
		b = append(b, v[i])
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%q percent-decodes to bytes that are not UTF-8", bound(v))
	}
	return string(b), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// DecodeBinaryHeaders percent-decodes the ce-* headers of a binary-mode request in place
// (DecodeHeaderValue), before the SDK reads them as attributes. A structured or batched
// request carries its attributes in the body and is left alone.
func DecodeBinaryHeaders(h http.Header) error {
	for k, vs := range h {
		if _, ok := cutPrefixFold(k, "ce-"); !ok {
			continue
		}
		for i, v := range vs {
			d, err := DecodeHeaderValue(v)
			if err != nil {
				return fmt.Errorf("header %s: %w", bound(k), err)
			}
			vs[i] = d
		}
	}
	return nil
}

// inline says whether data goes in a structured event's "data" member as it is: JSON data
// that parses, or UTF-8 text.
func inline(contentType string, data []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json"):
		return json.Valid(data)
	case strings.HasPrefix(mt, "text/"):
		// Written as a JSON string (the SDK escapes it).
		return utf8.Valid(data)
	}
	return false
}

// validValue is valid UTF-8 without control characters (a stored header value).
func validValue(v string) bool {
	if !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func bound(s string) string { return records.Bound(s, 64) }

// cutPrefixFold is strings.CutPrefix ignoring ASCII case.
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

// present records that a JSON member is there, without keeping its value.
type present bool

func (p *present) UnmarshalJSON([]byte) error { *p = true; return nil }

// CheckStructured checks what the SDK does not of a structured-mode body (one event, or a
// batch when batch): that no event holds both data and data_base64, which CloudEvents 1.0
// makes exclusive (the SDK would keep data_base64 and drop data without a word). It returns
// one error per event, nil where the event is fine; a body that is no JSON object (or array of
// them) is left to the SDK to refuse.
func CheckStructured(body []byte, batch bool) []error {
	var members []map[string]present
	if batch {
		if json.Unmarshal(body, &members) != nil {
			return nil
		}
	} else {
		var one map[string]present
		if json.Unmarshal(body, &one) != nil {
			return nil
		}
		members = []map[string]present{one}
	}
	var errs []error
	for i, m := range members {
		if m["data"] && m["data_base64"] {
			if errs == nil {
				errs = make([]error, len(members))
			}
			errs[i] = errors.New("the event holds both data and data_base64, which CloudEvents makes exclusive: JSON data goes in data, binary data base64-encoded in data_base64")
		}
	}
	return errs
}
