package streamread_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// fill publishes n messages spread over `subjects` subjects s.0 ... s.<subjects-1>, and returns
// the sequences of s.0's messages, oldest first.
func fill(t *testing.T, js jetstream.JetStream, n, subjects int) []uint64 {
	t.Helper()
	var seqs []uint64
	// In chunks, so the client never holds more unacknowledged publishes than it allows.
	for from := 0; from < n; from += 1000 {
		futures := make([]jetstream.PubAckFuture, 0, 1000)
		for i := from; i < min(from+1000, n); i++ {
			f, err := js.PublishAsync(fmt.Sprintf("s.%d", i%subjects), []byte(fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			futures = append(futures, f)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			t.Fatal("publishing timed out")
		}
		for i, f := range futures {
			select {
			case ack := <-f.Ok():
				if (from+i)%subjects == 0 {
					seqs = append(seqs, ack.Sequence)
				}
			case err := <-f.Err():
				t.Fatal(err)
			}
		}
	}
	return seqs
}

func open(t *testing.T, direct bool, n, subjects int) (*nats.Conn, *streamread.Stream, []uint64) {
	t.Helper()
	srv := testenv.NewNATS(t)
	nc, js, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: direct, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	seqs := fill(t, js, n, subjects)
	st, err := streamread.Open(ctx, nc, js, "S")
	if err != nil {
		t.Fatal(err)
	}
	return nc, st, seqs
}

// Reading the newest page of one subject among many reads about that page, not the stream.
func TestBackwardReadsNewestFirstWithoutScanning(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			const n, subjects = 20000, 40
			nc, st, seqs := open(t, direct, n, subjects)
			ctx := context.Background()
			before := nc.Stats().InMsgs
			rd := st.Backward("s.0", 0, 26)
			var got []uint64
			for range 26 {
				m, err := rd.Next(ctx)
				if err != nil || m == nil {
					t.Fatalf("Next: %v %v", m, err)
				}
				if m.Subject != "s.0" {
					t.Fatalf("got subject %s", m.Subject)
				}
				got = append(got, m.Seq)
			}
			read := nc.Stats().InMsgs - before
			t.Logf("one page of 26 received %d messages", read)
			for i, s := range got {
				if want := seqs[len(seqs)-1-i]; s != want {
					t.Fatalf("message %d: seq %d, want %d", i, s, want)
				}
			}
			// 26 of 500 matching messages among 20,000: a scan would read thousands.
			if read > 200 {
				t.Errorf("reading one page received %d messages", read)
			}
			// A reader started at the bound continues exactly where this one stands.
			rd2 := st.Backward("s.0", rd.Bound(), 100)
			all := append([]uint64{}, got...)
			for {
				m, err := rd2.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if m == nil {
					break
				}
				all = append(all, m.Seq)
			}
			if len(all) != len(seqs) {
				t.Fatalf("read %d messages of s.0, want %d", len(all), len(seqs))
			}
			for i, s := range all {
				if s != seqs[len(seqs)-1-i] {
					t.Fatalf("message %d: seq %d, want %d", i, s, seqs[len(seqs)-1-i])
				}
			}
		})
	}
}

// A sparse subject far back in the stream is found by growing the window.
func TestBackwardFindsSparseMessagesFarBack(t *testing.T) {
	srv := testenv.NewNATS(t)
	nc, js, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	a1, _ := js.Publish(ctx, "s.rare", []byte("1"))
	fill(t, js, 30000, 3)
	a2, _ := js.Publish(ctx, "s.rare", []byte("2"))
	fill(t, js, 100, 3)
	st, err := streamread.Open(ctx, nc, js, "S")
	if err != nil {
		t.Fatal(err)
	}
	before := nc.Stats().InMsgs
	rd := st.Backward("s.rare", 0, 26)
	var got []uint64
	for {
		m, err := rd.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			break
		}
		got = append(got, m.Seq)
	}
	if len(got) != 2 || got[0] != a2.Sequence || got[1] != a1.Sequence {
		t.Fatalf("got %v, want [%d %d]", got, a2.Sequence, a1.Sequence)
	}
	if read := nc.Stats().InMsgs - before; read > 50 {
		t.Errorf("finding 2 messages received %d", read)
	}
	if n, err := st.Count(ctx, "s.rare", time.Time{}); err != nil || n != 2 {
		t.Errorf("Count = %d, %v; want 2", n, err)
	}
	if m, err := st.Last(ctx, "s.*"); err != nil || m.Seq != st.LastSeq {
		t.Errorf("Last(s.*) = %v, %v", m, err)
	}
	if _, err := st.Last(ctx, "s.none"); err != streamread.ErrNotFound {
		t.Errorf("Last of nothing: %v", err)
	}
	// Forward in batches larger than one request.
	msgs, err := st.Forward(ctx, "s.0", 1, 600)
	if err != nil || len(msgs) != 600 {
		t.Fatalf("Forward: %d, %v", len(msgs), err)
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Seq <= msgs[i-1].Seq || msgs[i].Subject != "s.0" {
			t.Fatalf("Forward out of order at %d", i)
		}
	}
}

// Continuing from a cursor in a dense stream reads about one page, not a batch's worth.
func TestBackwardFromACursorReadsAboutAPage(t *testing.T) {
	nc, st, seqs := open(t, true, 5000, 1)
	ctx := context.Background()
	before := nc.Stats().InMsgs
	rd := st.Backward("s.0", seqs[2500], 26)
	for i := range 26 {
		m, err := rd.Next(ctx)
		if err != nil || m == nil || m.Seq != seqs[2499-i] {
			t.Fatalf("message %d: %v %v", i, m, err)
		}
	}
	if read := nc.Stats().InMsgs - before; read > 60 {
		t.Errorf("one page from a cursor received %d messages", read)
	}
}

// MaxBytes bounds what one forward read holds (at least one message, at most one message
// past the bound), with direct gets and without.
func TestForwardHoldsAtMostMaxBytes(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			_, st, _ := open(t, direct, 1000, 1)
			ctx := context.Background()
			all, err := st.Forward(ctx, ">", 1, 1000)
			if err != nil || len(all) != 1000 {
				t.Fatalf("without a bound: %d messages, %v; want 1000", len(all), err)
			}
			st.MaxBytes = 1
			if msgs, err := st.Forward(ctx, ">", 1, 1000); err != nil || len(msgs) != 1 {
				t.Fatalf("a bound below one message: %d messages, %v; want 1", len(msgs), err)
			}
			st.MaxBytes = 1000
			for name, read := range map[string]func() ([]streamread.Msg, error){
				"Forward":     func() ([]streamread.Msg, error) { return st.Forward(ctx, ">", 1, 1000) },
				"ForwardFrom": func() ([]streamread.Msg, error) { return st.ForwardFrom(ctx, ">", time.Time{}, 1000) },
			} {
				msgs, err := read()
				if err != nil || len(msgs) == 0 || len(msgs) == 1000 {
					t.Fatalf("%s with a 1000-byte bound: %d messages, %v", name, len(msgs), err)
				}
				size := 0
				for _, m := range msgs[:len(msgs)-1] {
					size += len(m.Data)
				}
				if size >= st.MaxBytes {
					t.Errorf("%s read %d messages holding %d bytes of data before its last; the bound is %d", name, len(msgs), size, st.MaxBytes)
				}
			}
		})
	}
}

// Every tenant's inbox is in one account, and NATS checks no permission on a request's reply
// subject: another connection can make JetStream answer its own requests into a reader's
// inbox. Here it watches the reader's requests (a stand-in for knowing the inbox) and asks for
// another stream's messages, by direct and by plain gets, with the reader's reply subject. The
// reader takes none of them: what it reads is exactly what it reads alone, and the forged
// replies did reach its inbox while it read (or the test would prove nothing).
func TestReadersTakeOnlyRepliesOfTheirOwnRequests(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			srv := testenv.NewNATS(t)
			nc, js, err := srv.Connect()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			ctx := context.Background()
			for name, subj := range map[string]string{"S": "s.>", "T": "t.>"} {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, AllowDirect: direct || name == "T", Storage: jetstream.MemoryStorage}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 20 {
				// The other stream's subjects end as the reader's do: only the stream and the
				// filter's first token tell them apart.
				if _, err := js.Publish(ctx, "t.0", []byte(fmt.Sprint("forged ", i))); err != nil {
					t.Fatal(err)
				}
			}
			fill(t, js, 300, 3)
			st, err := streamread.Open(ctx, nc, js, "S")
			if err != nil {
				t.Fatal(err)
			}
			read := func() ([]uint64, uint64) {
				t.Helper()
				before := nc.Stats().InMsgs
				var seqs []uint64
				msgs, err := st.Forward(ctx, "s.0", 1, 1000)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if m.Subject != "s.0" {
						t.Fatalf("Forward returned %s seq %d (%q)", m.Subject, m.Seq, m.Data)
					}
					seqs = append(seqs, m.Seq)
				}
				rd := st.Backward("s.0", 0, 5)
				for {
					m, err := rd.Next(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if m == nil {
						break
					}
					if m.Subject != "s.0" {
						t.Fatalf("Backward returned %s seq %d (%q)", m.Subject, m.Seq, m.Data)
					}
					seqs = append(seqs, m.Seq)
				}
				if m, err := st.Last(ctx, "s.0"); err != nil || m.Subject != "s.0" {
					t.Fatalf("Last: %v, %v", m, err)
				} else {
					seqs = append(seqs, m.Seq)
				}
				return seqs, nc.Stats().InMsgs - before
			}
			want, alone := read()

			attacker, _, err := srv.Connect()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(attacker.Close)
			var forged atomic.Int64
			for _, api := range []string{"$JS.API.DIRECT.GET.S", "$JS.API.STREAM.MSG.GET.S"} {
				if _, err := attacker.Subscribe(api, func(m *nats.Msg) {
					// Many small answers of the other stream, by both APIs, to the reader's inbox.
					_ = attacker.PublishRequest("$JS.API.DIRECT.GET.T", m.Reply, []byte(`{"seq":1,"next_by_subj":"t.>","batch":20}`))
					_ = attacker.PublishRequest("$JS.API.DIRECT.GET.T", m.Reply, []byte(`{"last_by_subj":"t.0"}`))
					_ = attacker.PublishRequest("$JS.API.STREAM.MSG.GET.T", m.Reply, []byte(`{"seq":1,"next_by_subj":"t.>"}`))
					forged.Add(1)
				}); err != nil {
					t.Fatal(err)
				}
			}
			if err := attacker.Flush(); err != nil {
				t.Fatal(err)
			}
			// The forged replies race the real ones: read until some reached the inbox during a
			// read, and every read must be the same.
			testenv.Eventually(t, 60*time.Second, func() error {
				got, received := read()
				if !slices.Equal(got, want) {
					return testenv.Stop(fmt.Errorf("with forged replies the reader read %v, alone %v", got, want))
				}
				if received <= alone {
					return fmt.Errorf("no forged reply reached the reader's inbox during a read yet (%d requests seen by the attacker)", forged.Load())
				}
				return nil
			}, "forged replies reaching the reader's inbox")
		})
	}
}

// A read costs what it reads: a fold polls its log every 250 ms, and each read subscribed with
// a sync subscription, whose channel of the connection's default length (512 KiB) was garbage
// at once: 2 MiB a second in an idle dispatcher. Its own channel (about 8 KiB, room for strays)
// is used again by the next read: without that, 48 KB a pair of direct reads and 226 KB by the
// get API, against 31 and 135.
func TestAReadAllocatesWhatItReads(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			_, st, _ := open(t, direct, 100, 4)
			ctx := context.Background()
			read := func() {
				if _, err := st.Forward(ctx, "s.1", 1, 10); err != nil {
					t.Fatal(err)
				}
				if _, err := st.Last(ctx, "s.2"); err != nil {
					t.Fatal(err)
				}
			}
			read() // warm: connection buffers, the stream's info
			const reads = 20
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range reads {
				read()
			}
			runtime.ReadMemStats(&after)
			per := (after.TotalAlloc - before.TotalAlloc) / reads
			t.Logf("%d bytes allocated per pair of reads", per)
			// One such channel alone is 512 KiB; the get API's read (one request a message)
			// allocates about 135 KB, a direct read about 31 KB.
			most := uint64(40 << 10)
			if !direct {
				most = 180 << 10
			}
			if per > most {
				t.Fatalf("a forward read of 10 messages and a last read allocated %d bytes", per)
			}
		})
	}
}
