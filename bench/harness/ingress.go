package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// ingressBench compares, in one run, three ways a producer gets an event stored: a POST
// through the ingress (TokenReview and SubjectAccessReview cached, one acknowledged JetStream
// publish, 202), a raw HTTP POST to a loopback server that answers 202 at once (the HTTP hop
// alone), and a direct JetStream publish waiting for its acknowledgement (the publish alone).
// Each client and each server is a child process; each measurement is a closed loop (the
// highest rate) and an open loop paced at o.IngressRate (latency from the scheduled send to
// the answer, so queueing counts). The ingress's CPU per event is its process's CPU over the
// events it published.
func (b *bench) ingressBench(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Ingress"}
	ns, err := b.namespace(ctx, "ing")
	if err != nil {
		return nil, err
	}
	if err := b.cfg.Streams.For(ns).Ensure(ctx, b.js); err != nil {
		return nil, err
	}
	token, err := b.producerToken(ctx, ns)
	if err != nil {
		return nil, err
	}
	ing, err := startChild(b.dir, "ingress", []string{"KUBECONFIG=" + b.kubeconfig}, "ingress", "-nats", b.natsURL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ing.stop(30 * time.Second) }()
	ingAddr, err := ing.line("READY", time.Minute)
	if err != nil {
		return nil, err
	}
	sink, err := startChild(b.dir, "sink", nil, "sink")
	if err != nil {
		return nil, err
	}
	defer func() { _ = sink.stop(30 * time.Second) }()
	sinkAddr, err := sink.line("READY", time.Minute)
	if err != nil {
		return nil, err
	}
	ingURL := "http://" + ingAddr + "/v1/namespaces/" + ns + "/events"
	subject := b.cfg.Streams.Names.For(ns).EventSubject("bench.ingress")

	type client struct{ name, role string }
	clients := []client{{"raw HTTP POST (loopback, 202 at once)", "raw"}, {"ingress POST (auth cached, publish acknowledged, 202)", "ingress"}, {"direct JetStream publish (acknowledged)", "jetstream"}}
	run := func(c client, tag string, n, conc, rate int) (loadResult, float64, error) {
		args := []string{"load", "-n", strconv.Itoa(n), "-c", strconv.Itoa(conc), "-rate", strconv.Itoa(rate), "-tag", tag}
		switch c.role {
		case "raw":
			args = append(args, "-url", "http://"+sinkAddr+"/")
		case "ingress":
			args = append(args, "-url", ingURL, "-token", token)
		case "jetstream":
			args = append(args, "-nats", b.natsURL, "-subject", subject)
		}
		before, _ := sampleProc(ing.pid())
		p, err := startChild(b.dir, tag, nil, args...)
		if err != nil {
			return loadResult{}, 0, err
		}
		line, err := p.line("RESULT", 5*time.Minute)
		if err != nil {
			p.kill()
			return loadResult{}, 0, err
		}
		_ = p.stop(30 * time.Second)
		var res loadResult
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			return res, 0, err
		}
		after, _ := sampleProc(ing.pid())
		ingUS := 0.0
		if c.role == "ingress" && res.OK > 0 {
			ingUS = (after.CPU - before.CPU).Seconds() * 1e6 / float64(res.OK)
		}
		return res, ingUS, nil
	}

	// Warm-up: the ingress's authorization cache, connections, JIT of nothing.
	if _, _, err := run(clients[1], "ing-warm", 2000, 16, 0); err != nil {
		return nil, err
	}
	rates := map[string][]float64{}
	p99s := map[string][]float64{}
	cpu := []float64{}
	var rows [][]string
	for r := range o.Repeat {
		for _, c := range clients {
			tag := fmt.Sprintf("ing%d-%s-max", r, c.role)
			progress("ingress run %d/%d: %s, closed loop of %d events at concurrency %d", r+1, o.Repeat, c.role, o.IngressEvents, o.IngressConcurrency)
			res, ingUS, err := run(c, tag, o.IngressEvents, o.IngressConcurrency, 0)
			if err != nil {
				return nil, err
			}
			if res.Errors > 0 {
				return nil, fmt.Errorf("%s: %d of %d requests failed (first: %s)", tag, res.Errors, res.N, res.FirstError)
			}
			rates[c.role] = append(rates[c.role], res.Rate)
			if c.role == "ingress" {
				cpu = append(cpu, ingUS)
			}
			rows = append(rows, []string{c.name, strconv.Itoa(r + 1), "closed loop", num(res.Rate), ms(res.P50), ms(res.P99), ms(res.Max), us(res.CPU * 1e6 / float64(max(res.OK, 1))), cpuCell(c.role, ingUS)})
		}
		for _, c := range clients {
			tag := fmt.Sprintf("ing%d-%s-paced", r, c.role)
			n := o.IngressRate * int(o.IngressTime/time.Second)
			progress("ingress run %d/%d: %s, %d events/s for %s", r+1, o.Repeat, c.role, o.IngressRate, o.IngressTime)
			res, ingUS, err := run(c, tag, n, 256, o.IngressRate)
			if err != nil {
				return nil, err
			}
			if res.Errors > 0 {
				return nil, fmt.Errorf("%s: %d of %d requests failed (first: %s)", tag, res.Errors, res.N, res.FirstError)
			}
			p99s[c.role] = append(p99s[c.role], res.P99)
			rows = append(rows, []string{c.name, strconv.Itoa(r + 1), fmt.Sprintf("%d/s", o.IngressRate), num(res.Rate), ms(res.P50), ms(res.P99), ms(res.Max), us(res.CPU * 1e6 / float64(max(res.OK, 1))), cpuCell(c.role, ingUS)})
		}
	}
	s.printf("Three ways to store an event, measured in the same run: a POST of one JSON event through the ingress (bearer token, its TokenReview and SubjectAccessReview cached, one JetStream publish acknowledged, then 202), a raw HTTP POST of the same body to a loopback server that answers 202 at once, and a direct JetStream publish waiting for its acknowledgement. Clients and servers are child processes; latency is from the request's (scheduled) start to its answer. Closed loop: %d events at concurrency %d. Paced: an open loop at %d events/s for %s.",
		o.IngressEvents, o.IngressConcurrency, o.IngressRate, o.IngressTime)
	s.printf("")
	s.table([]string{"client", "run", "load", "events/s", "p50 (ms)", "p99 (ms)", "max (ms)", "client CPU/event", "ingress CPU/event"}, rows)
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		c := slices.Clone(v)
		slices.Sort(c)
		return c[len(c)/2]
	}
	ratio := med(rates["ingress"]) / max(med(rates["raw"]), 1)
	s.printf("")
	s.printf("**Ingress rate / raw HTTP POST rate: %.2f** (median of %d runs; goal at least 0.5). Direct JetStream publish: %s events/s.", ratio, o.Repeat, num(med(rates["jetstream"])))
	s.printf("")
	s.printf("**Ingress p99 at %d events/s: %s ms** (median of the runs' p99; goal under 10 ms); raw HTTP POST %s ms, JetStream publish %s ms.",
		o.IngressRate, ms(med(p99s["ingress"])), ms(med(p99s["raw"])), ms(med(p99s["jetstream"])))
	s.printf("")
	s.printf("**Ingress CPU per event: %s** (median over the closed-loop runs; the ingress process alone, 2 cores shared with the clients, nats-server and the sink).", us(med(cpu)))
	return s, nil
}

func cpuCell(role string, v float64) string {
	if role != "ingress" {
		return "–"
	}
	return us(v)
}

func us(v float64) string { return fmt.Sprintf("%.0f µs", v) }

// producerToken makes a ServiceAccount allowed to publish in ns and returns a token of it for
// the ingress's audience.
func (b *bench) producerToken(ctx context.Context, ns string) (string, error) {
	cs, err := kubernetes.NewForConfig(b.cp.Config)
	if err != nil {
		return "", err
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "producer"}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "producer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"webhook-operator.io"}, Resources: []string{kubeauth.ResourceEvents}, Verbs: []string{"create"}}}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "producer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "producer"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "producer", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	seconds := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "producer", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{ingress.DefaultAudience}, ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// childIngress runs the ingress's handler and server as `webhook-operator ingress` does (its
// defaults; the API server through $KUBECONFIG; a plain NATS connection) until stdin closes.
func childIngress(args []string) error {
	fs := flag.NewFlagSet("ingress", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := parentGone()
	defer cancel()
	ingress.SetMemoryLimit()
	rc, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	h := ingress.NewHandler(ingress.Options{JS: js, MaxPayload: nc.MaxPayload, Names: streams.DefaultNames(),
		Auth: &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: cs}}, Log: logr.Discard()})
	// Every client of the bench is one address (loopback): no bound per client.
	return ingress.Serve(ctx, h, ingress.ServerOptions{Addr: "127.0.0.1:0", MaxConnectionsPerClient: -1}, func(a net.Addr) { fmt.Println("READY", a.String()) })
}

// childSink answers every POST 202 after reading its body: the raw HTTP hop.
func childSink([]string) error {
	ctx, cancel := parentGone()
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"status":202}` + "\n"))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	fmt.Println("READY", ln.Addr().String())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// loadResult is what a load child reports: latencies in milliseconds.
type loadResult struct {
	N, OK, Errors      int
	FirstError         string
	Seconds, Rate, CPU float64
	P50, P99, Max      float64
}

// childLoad sends n events from c goroutines, as fast as it can (rate 0) or on a schedule of
// rate per second (an open loop: each event's latency runs from its scheduled time), either
// as HTTP POSTs of one JSON event (with a bearer token) or as JetStream publishes waiting for
// their acknowledgement, and prints a loadResult.
func childLoad(args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	url := fs.String("url", "", "POST here")
	token := fs.String("token", "", "bearer token")
	natsURL := fs.String("nats", "", "publish on JetStream instead")
	subject := fs.String("subject", "", "JetStream subject")
	n := fs.Int("n", 10000, "events")
	c := fs.Int("c", 64, "concurrency")
	rate := fs.Int("rate", 0, "events per second (0: as fast as possible)")
	tag := fs.String("tag", "load", "event id prefix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	data := `{"order_id":"ord_1001","total":42.5,"currency":"EUR","items":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}],"note":"` + strings.Repeat("x", 800) + `"}`
	var send func(i int) error
	if *natsURL != "" {
		nc, err := nats.Connect(*natsURL)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		send = func(i int) error {
			m := &nats.Msg{Subject: *subject, Header: nats.Header{records.HeaderMsgID: {*tag + "-" + strconv.Itoa(i)}, records.HeaderContentType: {"application/json"}}, Data: []byte(data)}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := js.PublishMsg(ctx, m)
			return err
		}
	} else {
		cl := plainClient(*c)
		defer cl.CloseIdleConnections()
		send = func(i int) error {
			body := `{"id":"` + *tag + "-" + strconv.Itoa(i) + `","type":"bench.ingress","data":` + data + `}`
			req, err := http.NewRequest(http.MethodPost, *url, bytes.NewReader([]byte(body)))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			if *token != "" {
				req.Header.Set("Authorization", "Bearer "+*token)
			}
			resp, err := cl.Do(req)
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				return fmt.Errorf("status %d: %s", resp.StatusCode, b)
			}
			return nil
		}
	}
	lat := make([]float64, *n)
	var next, errs atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), selfCPU()
	for range *c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= *n {
					return
				}
				t0 := time.Now()
				if *rate > 0 {
					t0 = start.Add(time.Duration(i) * time.Second / time.Duration(*rate))
					if d := time.Until(t0); d > 0 {
						time.Sleep(d)
					}
				}
				if err := send(i); err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err.Error())
					lat[i] = -1
					continue
				}
				lat[i] = float64(time.Since(t0)) / 1e6
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	ok := slices.DeleteFunc(lat, func(v float64) bool { return v < 0 })
	slices.Sort(ok)
	res := loadResult{N: *n, OK: len(ok), Errors: int(errs.Load()), Seconds: secs, Rate: float64(len(ok)) / secs, CPU: (selfCPU() - cpu0).Seconds(),
		P50: percentile(ok, 50), P99: percentile(ok, 99), Max: percentile(ok, 100)}
	if f, _ := first.Load().(string); f != "" {
		res.FirstError = records.Bound(f, 300)
	}
	b, _ := json.Marshal(res)
	fmt.Println("RESULT", string(b))
	return nil
}
