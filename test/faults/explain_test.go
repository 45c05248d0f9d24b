package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// explainMissing logs what the system holds of a few of the events a scenario lost, so that a
// loss seen once (a fault scenario is timing-dependent) can be understood from the test's
// output alone: the receiver's requests of each, every message of the namespace's streams
// that names it (the event, its scheduled retries, its records in the delivery log, a dead
// letter), the state of every consumer of those streams, and the lines of the suite's logs
// that name it or its deliveries.
func explainMissing(ctx context.Context, t *testing.T, tn *tenant, endpoint string, ids []string, rcvs ...*testenv.Receiver) {
	t.Helper()
	if len(ids) > 3 {
		ids = ids[:3]
	}
	if len(ids) == 0 {
		return
	}
	nc, js, err := tn.st.ConnectAdmin(nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		t.Logf("explaining the missing events: %v", err)
		return
	}
	defer nc.Close()
	names := streams.DefaultNames().For(tn.ns)
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "\n== missing event %s\n", id)
		for _, r := range rcvs {
			for _, q := range r.Requests() {
				if q.ID == id {
					fmt.Fprintf(&b, "receiver: request at %s, attempt %d, answered %d\n", q.At.Format("15:04:05.000"), q.Attempt, q.Status)
				}
			}
		}
		wanted := [][]byte{[]byte(id)}
		for _, name := range names.Streams() {
			st, err := streamread.Open(ctx, nc, js, name)
			if err != nil {
				fmt.Fprintf(&b, "stream %s: %v\n", name, err)
				continue
			}
			for from := st.FirstSeq; from > 0 && from <= st.LastSeq; {
				batch, err := st.Forward(ctx, ">", from, 256)
				if err != nil {
					fmt.Fprintf(&b, "stream %s from %d: %v\n", name, from, err)
					break
				}
				for _, m := range batch {
					if !namesAny(m, wanted) {
						continue
					}
					if name == names.AttemptsStream() {
						// A message of the delivery log may hold many records: only its own.
						for _, rec := range records.LogRecords(m.Data) {
							if namesAny(streamread.Msg{Data: []byte(rec.DeliveryID + " " + rec.EventID)}, wanted) {
								fmt.Fprintf(&b, "%s #%d at %s: delivery %s attempt %d %s at %s, next attempt %v, reason %q\n", name, m.Seq, m.Time.Format("15:04:05.000"),
									rec.DeliveryID, rec.Attempt, rec.State, rec.Time.Format("15:04:05.000"), rec.NextAttemptAt, rec.Reason)
							}
						}
						continue
					}
					fmt.Fprintf(&b, "%s #%d %s at %s: %s\n", name, m.Seq, m.Subject, m.Time.Format("15:04:05.000"), describeMsg(m))
					if name == names.EventsStream() {
						// Its deliveries are named after its place in the stream.
						meta, _, _ := records.EventDelivery(m.Subject, streams.DefaultNames().EventsSubjectPrefix, name, m.Seq, m.Time, m.Header, tn.ns, endpoint)
						if meta.DeliveryID != "" {
							wanted = append(wanted, []byte(meta.DeliveryID))
						}
					}
				}
				if len(batch) == 0 {
					break
				}
				from = batch[len(batch)-1].Seq + 1
			}
			s, err := js.Stream(ctx, name)
			if err != nil {
				continue
			}
			for ci := range s.ListConsumers(ctx).Info() {
				fmt.Fprintf(&b, "consumer %s > %s: delivered %d, ack floor %d, ack pending %d, redelivered %d, pending %d, leader %s\n",
					name, ci.Name, ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumAckPending, ci.NumRedelivered, ci.NumPending, clusterLeader(ci.Cluster))
			}
		}
		grepLogs(&b, wanted)
	}
	t.Logf("what the system holds of the missing events:%s", b.String())
}

// namesAny says m names one of wanted in a header value or its data.
func namesAny(m streamread.Msg, wanted [][]byte) bool {
	for _, w := range wanted {
		if bytes.Contains(m.Data, w) {
			return true
		}
		for _, vs := range m.Header {
			for _, v := range vs {
				if strings.Contains(v, string(w)) {
					return true
				}
			}
		}
	}
	return false
}

// describeMsg is a message's headers (values bounded) and the start of its data.
func describeMsg(m streamread.Msg) string {
	var parts []string
	for k, vs := range m.Header {
		for _, v := range vs {
			parts = append(parts, k+"="+records.Bound(v, 200))
		}
	}
	return strings.Join(parts, " ") + " data=" + records.Bound(string(m.Data), 400)
}

func clusterLeader(c *jetstream.ClusterInfo) string {
	if c == nil {
		return "-"
	}
	return c.Leader
}

// grepLogs writes the lines of the suite's logs that name one of wanted (at most 40 a file).
func grepLogs(b *strings.Builder, wanted [][]byte) {
	_ = filepath.Walk(suiteDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return nil
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		n := 0
		for sc.Scan() && n < 40 {
			for _, w := range wanted {
				if bytes.Contains(sc.Bytes(), w) {
					fmt.Fprintf(b, "%s: %s\n", filepath.Base(path), records.Bound(sc.Text(), 600))
					n++
					break
				}
			}
		}
		return nil
	})
}
