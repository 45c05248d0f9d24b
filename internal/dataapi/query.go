package dataapi

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/selection"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// selector is a list's field selector, read: the exact values it asks for.
type selector map[string]string

// readSelector reads a list's field selector: only equality, each field once, and no label
// selector (these resources have no labels).
func readSelector(opts *metainternalversion.ListOptions) (selector, error) {
	sel := selector{}
	if opts == nil {
		return sel, nil
	}
	if opts.LabelSelector != nil && !opts.LabelSelector.Empty() {
		return nil, apierrors.NewBadRequest("label selectors are not supported: these resources have no labels; select with field selectors (spec.endpoint, status.state, spec.eventID, spec.eventType, since, until)")
	}
	if opts.FieldSelector == nil {
		return sel, nil
	}
	for _, r := range opts.FieldSelector.Requirements() {
		if r.Operator != selection.Equals && r.Operator != selection.DoubleEquals {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %s%s%s: only = is supported", r.Field, r.Operator, r.Value))
		}
		if v, dup := sel[r.Field]; dup && v != r.Value {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %s is given twice (%q and %q)", r.Field, v, r.Value))
		}
		sel[r.Field] = r.Value
	}
	return sel, nil
}

// selectorTime reads the value of since or until: an RFC 3339 time, or a duration back from
// now (1h, 30m).
func selectorTime(field, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, apierrors.NewBadRequest(fmt.Sprintf("field selector %s=%q: want an RFC 3339 time (2026-12-01T10:00:00Z) or a duration back from now (1h)", field, v))
}

// internalState is the reader's state for an API state.
func internalState(s string) (string, error) {
	switch datav1alpha1.DeliveryState(s) {
	case "":
		return "", nil
	case datav1alpha1.StateQueued:
		return records.StatePending, nil
	case datav1alpha1.StateInFlight:
		return records.StateAttempting, nil
	case datav1alpha1.StateRetryScheduled:
		return records.StateFailed, nil
	case datav1alpha1.StateSucceeded:
		return records.StateSucceeded, nil
	case datav1alpha1.StateDeadLettered:
		return records.StateDeadLetter, nil
	}
	return "", apierrors.NewBadRequest(fmt.Sprintf("field selector %s=%q: want one of %v", datav1alpha1.FieldState, s, datav1alpha1.States))
}

// continueToken is a list's continuation: the reader's cursor and a digest of the query it
// continues (namespace, resource, selector), so a token is refused by any other query.
type continueToken struct {
	V      int    `json:"v"`
	Query  string `json:"q"`
	Cursor string `json:"c"`
}

// queryDigest names a query: its namespace, resource and selector.
func queryDigest(resource, namespace string, sel selector) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(resource + "\x00" + namespace)
	for _, k := range keys {
		b.WriteString("\x00" + k + "=" + sel[k])
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:12])
}

// maxContinueLength bounds a continue token read.
const maxContinueLength = 512

func encodeContinue(digest, cursor string) string {
	b, _ := json.Marshal(continueToken{V: 1, Query: digest, Cursor: cursor})
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeContinue reads a continue token made for the query named digest.
func decodeContinue(s, digest string) (string, error) {
	if s == "" {
		return "", nil
	}
	bad := apierrors.NewBadRequest("the continue token is not one this server made: take it from the metadata.continue of the previous page of the same list")
	if len(s) > maxContinueLength {
		return "", bad
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", bad
	}
	var t continueToken
	if err := json.Unmarshal(b, &t); err != nil || t.V != 1 {
		return "", bad
	}
	if t.Query != digest {
		return "", apierrors.NewBadRequest("the continue token was made for another list (another namespace, resource or field selector): continue with the same query, or start again without it")
	}
	return t.Cursor, nil
}

// pageLimit is a list's page size: its limit, or the default; beyond the maximum, a 400.
func pageLimit(opts *metainternalversion.ListOptions, def, maxLimit int) (int, error) {
	if opts == nil || opts.Limit == 0 {
		return def, nil
	}
	if opts.Limit < 0 || opts.Limit > int64(maxLimit) {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("limit %d: a page holds 1 to %d items; continue with metadata.continue for more", opts.Limit, maxLimit))
	}
	return int(opts.Limit), nil
}
