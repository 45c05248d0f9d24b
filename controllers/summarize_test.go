package controllers

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
)

// One rule for which problem a status reports, the same for every reconciler: a stalling
// problem wins over one that is not, and between two of the same kind the first found wins.
func TestProblemsKeepTheOneThatWins(t *testing.T) {
	type found struct {
		reason  string
		stalled bool
	}
	for _, tc := range []struct {
		name  string
		found []found
		want  string // reason of the winner; "" for none
	}{
		{"none", nil, ""},
		{"one that waits", []found{{"SecretNotFound", false}}, "SecretNotFound"},
		{"one that stalls", []found{{"InvalidURL", true}}, "InvalidURL"},
		{"two that wait: the first", []found{{"SecretNotFound", false}, {"RetryPolicyNotFound", false}}, "SecretNotFound"},
		{"two that stall: the first", []found{{"InvalidURL", true}, {"SecretNotAllowed", true}}, "InvalidURL"},
		{"a stall after a wait wins", []found{{"SecretNotFound", false}, {"SecretNotAllowed", true}}, "SecretNotAllowed"},
		{"a wait after a stall loses", []found{{"SecretNotAllowed", true}, {"NATSUnavailable", false}}, "SecretNotAllowed"},
		{"the first stall among waits", []found{{"A", false}, {"B", true}, {"C", false}, {"D", true}}, "B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p problems
			for _, f := range tc.found {
				if f.stalled {
					p.stall(f.reason, "%s found", f.reason)
				} else {
					p.block(f.reason, "%s found", f.reason)
				}
			}
			got := p.found()
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("got %+v, want none", got)
			case tc.want == "":
			case got == nil || got.reason != tc.want || got.message != tc.want+" found":
				t.Errorf("got %+v, want %s", got, tc.want)
			}
		})
	}
}

// summarize gives every reconciler the same kstatus conditions: an error over a problem over
// the reconciler's own account of a healthy reconcile.
func TestSummarize(t *testing.T) {
	healthy := func() verdict {
		return verdict{ready: conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReady, "fine")}
	}
	show := func(c *metav1.Condition) string {
		if c == nil {
			return "-"
		}
		return string(c.Status) + "/" + c.Reason + ": " + c.Message
	}
	for _, tc := range []struct {
		name                        string
		err                         error
		problem                     *problem
		ready, reconciling, stalled string
	}{
		{"healthy", nil, nil, "True/Ready: fine", "-", "-"},
		{"waiting", nil, &problem{reason: "SecretNotFound", message: "Secret s not found"},
			"False/SecretNotFound: Secret s not found", "True/SecretNotFound: Secret s not found", "-"},
		{"stalled", nil, &problem{reason: "InvalidURL", message: "spec.url is refused", stalled: true},
			"False/InvalidURL: spec.url is refused", "-", "True/InvalidURL: spec.url is refused"},
		{"an error wins over a problem", errors.New("boom"), &problem{reason: "InvalidURL", message: "m", stalled: true},
			"False/Reconciling: reconcile failed, retrying: boom", "True/Reconciling: reconcile failed, retrying: boom", "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := summarize(tc.err, tc.problem, healthy)
			if got := show(v.ready); got != tc.ready {
				t.Errorf("Ready %s, want %s", got, tc.ready)
			}
			if got := show(v.reconciling); got != tc.reconciling {
				t.Errorf("Reconciling %s, want %s", got, tc.reconciling)
			}
			if got := show(v.stalled); got != tc.stalled {
				t.Errorf("Stalled %s, want %s", got, tc.stalled)
			}
		})
	}
}
