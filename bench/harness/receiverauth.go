package harness

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// oauth2Tag starts the tags of the runs with spec.auth: the receiver wants their token.
const oauth2Tag = "oa"

// receiverAuth measures what spec.auth's OAuth2 client-credentials grant costs once the token
// is cached (issue 35): the throughput scenario's dispatcher delivering to the same endpoint
// without auth and with OAuth2 against a token server on loopback (tokens an hour long), whose
// receiver checks each token with the token server and answers 401 to one it did not issue,
// alternating in the same run over the same backlog size. Goal: at least 0.95 of without.
func (b *bench) receiverAuth(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Receiver authentication cost"}
	const clientID, clientSecret = "bench-dispatcher", "bench-client-secret-0123456789"
	ts, err := testenv.NewTokenServer(testenv.TokenServerOptions{ClientID: clientID, ClientSecret: clientSecret})
	if err != nil {
		return nil, err
	}
	defer ts.Close()
	rcv, err := newReceiver("receiver-auth", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	rcv.authorize = func(tag string, r testenv.Request) bool {
		return !strings.HasPrefix(tag, oauth2Tag) || ts.Valid(r.Header.Get("Authorization"))
	}
	defer func() { b.sinkSetup = nil }()
	withOAuth2 := func(ctx context.Context, ns string, spec *v1alpha1.WebhookEndpointSpec) error {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "oauth", Annotations: map[string]string{consent.AllowedEndpoints: "sink"}},
			StringData: map[string]string{"client-id": clientID, "client-secret": clientSecret}}
		if err := b.k8s.Create(ctx, sec); err != nil {
			return err
		}
		spec.Auth = &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{TokenURL: ts.URL(),
			ClientIDRef:     v1alpha1.SecretKeySelector{Name: "oauth", Key: "client-id"},
			ClientSecretRef: &v1alpha1.SecretKeySelector{Name: "oauth", Key: "client-secret"}, Scopes: []string{"webhooks"}}}
		return nil
	}
	n, c := o.Events, o.InFlight
	names := []string{"without spec.auth", "spec.auth: OAuth2 client credentials (token cached)"}
	runs := make([][]tpRun, 2)
	var fetches []int
	for r := range o.Repeat {
		progress("receiver-auth run %d/%d: %d events, concurrency %d", r+1, o.Repeat, n, c)
		for k := range 2 {
			i := (k + r) % 2
			tag := fmt.Sprintf("pl%d", r)
			b.sinkSetup = nil
			if i == 1 {
				tag, b.sinkSetup = fmt.Sprintf("%s%d", oauth2Tag, r), withOAuth2
			}
			f0 := ts.Fetches()
			run, _, err := b.dispatcherRun(ctx, rcv, tag, n, c, 1, "")
			if err != nil {
				return nil, err
			}
			if _, _, refused := rcv.counts(tag); refused > 0 {
				return nil, fmt.Errorf("%s: the receiver refused %d requests", tag, refused)
			}
			if i == 1 {
				fetches = append(fetches, ts.Fetches()-f0)
			}
			runs[i] = append(runs[i], run)
			progress("  %-55s %s/s", names[i], num(run.rate))
		}
	}
	var rows [][]string
	var rs, cpu []float64
	for j := range runs[0] {
		rs = append(rs, runs[1][j].rate/runs[0][j].rate)
		if runs[0][j].clientUS > 0 {
			cpu = append(cpu, runs[1][j].clientUS/runs[0][j].clientUS)
		}
	}
	for i, name := range names {
		var rates, cpu []float64
		for _, r := range runs[i] {
			rates, cpu = append(rates, r.rate), append(cpu, r.clientUS)
		}
		rows = append(rows, []string{name, nums(rates), "**" + num(median(rates)) + "**", fmt.Sprintf("%.1f", median(cpu))})
	}
	s.printf("The throughput scenario's dispatcher (%d events of 1 KB, concurrency %d), %d runs, without and with spec.auth in turn (each run starting with the other), to one receiver that checks every token with the token server (on loopback, tokens an hour long) and answers 401 to one it did not issue.", n, c, o.Repeat)
	s.table([]string{"endpoint", "runs (deliveries/s)", "median /s", "dispatcher CPU µs/delivery (median)"}, rows)
	s.printf("Dispatcher CPU per delivery with OAuth2, relative to without in the same run: %s (median **%s**); less sensitive than the rates to what else the machine runs.", ratios(cpu), ratio(median(cpu)))
	s.printf("Token requests per run with OAuth2: %s (each run a fresh dispatcher: one token, cached).", strings.Trim(fmt.Sprint(fetches), "[]"))
	b.rep.goal(s, median(rs) >= 0.95, "issue 35", "OAuth2 on costs at most 5%% of throughput against the same endpoint without it, tokens cached (ratio at least 0.95): %%GOAL%% (median ratio %s; per run %s).",
		ratio(median(rs)), strings.Join(ratioList(rs), ", "))
	s.printf("The attempt path alone, in one process: `go test ./dispatcher/deliver -run '^$' -bench BenchmarkOAuth2Cost -benchtime 40000x` (its `oauth2/plain`).")
	return s, nil
}
