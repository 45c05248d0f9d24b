// Command producer is the real cluster's producer pod: it connects to NATS with its own
// ServiceAccount's projected token through the operator's auth callout (opconfig's
// connection, as a dispatcher's), publishes -count events with ids <prefix>-<n> to its
// namespace's events subject at -rate per second, each with Nats-Msg-Id, retrying one that
// is not acknowledged (JetStream de-duplicates), and prints one JSON line at the end:
//
//	{"published": 500, "unacked": [], "retries": 3}
//
// then exits 0 when every event was acknowledged.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func main() {
	var cfg opconfig.Config
	flag.StringVar(&cfg.NATS.URL, "nats-url", "tls://nats.nats.svc:4222", "NATS")
	flag.StringVar(&cfg.NATS.TokenFile, "token-file", "/var/run/secrets/nats/token", "the projected ServiceAccount token")
	flag.StringVar(&cfg.NATS.CAFile, "ca-file", "/nats-tls/ca.crt", "CA of the NATS servers")
	flag.StringVar(&cfg.NATS.CertFile, "cert-file", "/nats-tls/tls.crt", "client certificate")
	flag.StringVar(&cfg.NATS.KeyFile, "key-file", "/nats-tls/tls.key", "client key")
	flag.StringVar(&cfg.NATS.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the namespace (whose events it publishes)")
	eventType := flag.String("type", "order.created", "event type")
	count := flag.Int("count", 100, "events to publish")
	rate := flag.Float64("rate", 50, "events per second")
	prefix := flag.String("prefix", "evt", "event id prefix")
	flag.Parse()
	if err := run(cfg, *eventType, *prefix, *count, *rate); err != nil {
		log.Fatal(err)
	}
}

type summary struct {
	Published int      `json:"published"`
	Unacked   []string `json:"unacked"`
	Retries   int      `json:"retries"`
}

func run(cfg opconfig.Config, eventType, prefix string, count int, rate float64) error {
	nc, js, err := cfg.Connect("cluster-producer")
	if err != nil {
		return err
	}
	defer nc.Close()
	subject := streams.DefaultNames().For(cfg.NATS.Namespace).EventSubject(eventType)
	s := summary{Unacked: []string{}}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := range count {
		<-tick.C
		id := fmt.Sprintf("%s-%05d", prefix, i)
		body := fmt.Sprintf(`{"id":%q,"n":%d}`, id, i)
		var err error
		// A real producer retries until JetStream acknowledges; the id makes it idempotent.
		// A minute covers a NATS server's restart and a stream leader's election.
		for deadline := time.Now().Add(time.Minute); ; s.Retries++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = js.Publish(ctx, subject, []byte(body), jetstream.WithMsgID(id))
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			log.Printf("%s: not acknowledged: %v", id, err)
			s.Unacked = append(s.Unacked, id)
			continue
		}
		s.Published++
	}
	b, _ := json.Marshal(s)
	fmt.Println(string(b))
	if len(s.Unacked) > 0 {
		os.Exit(3)
	}
	return nil
}
