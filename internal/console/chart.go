package console

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"strings"
	"sync"
	"time"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
)

// The chart of deliveries, failures and latency over the last hours, of a namespace or an
// endpoint: read from the delivery log through the data API as the user (one list per time
// slot, since and until, at most perSlot deliveries each, a few at once), folded into fixed
// slots as the pages arrive (counts and a latency histogram per slot: memory does not grow
// with the deliveries), and drawn on the server as SVG (no script; the page's CSP holds).
// A delivery counts once, in the slot of its latest outcome (status.time): Succeeded is
// delivered, RetryScheduled and DeadLettered are failures; queued and in-flight ones are not
// outcomes yet.

// chartWindow is one window the chart offers: its span and its slots.
type chartWindow struct {
	Name  string
	Span  time.Duration
	Slots int
}

var chartWindows = []chartWindow{
	{"1h", time.Hour, 30},
	{"6h", 6 * time.Hour, 24},
	{"24h", 24 * time.Hour, 24},
	{"72h", 72 * time.Hour, 24},
}

const (
	// defaultWindow is the window shown first.
	defaultWindow = "6h"
	// perSlot bounds the deliveries read for one slot: a slot with more is drawn from its
	// newest perSlot (marked as capped).
	perSlot = 500
	// chartReads is how many slots are read at once (the data API serves 8 reads at once for
	// everyone).
	chartReads = 3
	// chartTimeout bounds the reads of one chart.
	chartTimeout = 15 * time.Second
)

// latencyBins is a latency histogram: bin i holds latencies of about 2^(i/4) microseconds
// (four bins an octave: a percentile read from it is within 19% of the true one), from 1 µs
// to over an hour.
const latencyBins = 4 * 33

type slot struct {
	Succeeded, Failed int
	// Capped is true when the slot held more than was read.
	Capped bool
	// Failed is true when the slot could not be read.
	Unread  bool
	latency [latencyBins]uint32
	samples int
}

func latencyBin(us int64) int {
	if us < 1 {
		us = 1
	}
	b := int(4 * math.Log2(float64(us)))
	return min(max(b, 0), latencyBins-1)
}

// percentile is the latency at quantile p of the slot's histogram (the bin's geometric
// middle), 0 without samples.
func (s *slot) percentile(p float64) time.Duration {
	if s.samples == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(s.samples)))
	seen := 0
	for i, n := range s.latency {
		seen += int(n)
		if seen >= rank {
			return time.Duration(math.Pow(2, (float64(i)+0.5)/4)) * time.Microsecond
		}
	}
	return 0
}

// timeline is the slots of a window ending at End.
type timeline struct {
	Window chartWindow
	Start  time.Time
	Step   time.Duration
	Slots  []slot
}

func newTimeline(w chartWindow, now time.Time) *timeline {
	step := w.Span / time.Duration(w.Slots)
	end := now.Truncate(step).Add(step) // the current slot is the last
	return &timeline{Window: w, Start: end.Add(-w.Span), Step: step, Slots: make([]slot, w.Slots)}
}

func (t *timeline) bounds(i int) (time.Time, time.Time) {
	from := t.Start.Add(time.Duration(i) * t.Step)
	return from, from.Add(t.Step)
}

// add counts a delivery in slot i (and in the slot of its time when it is in another).
func (t *timeline) add(i int, d *datav1alpha1.WebhookDelivery) {
	if at := d.Status.Time.Time; !at.IsZero() {
		if j := int(at.Sub(t.Start) / t.Step); j >= 0 && j < len(t.Slots) && at.Sub(t.Start) >= 0 {
			i = j
		}
	}
	s := &t.Slots[i]
	switch d.Status.State {
	case datav1alpha1.StateSucceeded:
		s.Succeeded++
	case datav1alpha1.StateRetryScheduled, datav1alpha1.StateDeadLettered:
		s.Failed++
	default:
		return
	}
	if l := d.Status.LatencyMicroseconds; l != nil {
		s.latency[latencyBin(*l)]++
		s.samples++
	}
}

// slotReader lists the deliveries of one slot: at most limit of them, newest first, and
// whether there are more.
type slotReader func(ctx context.Context, from, until time.Time, limit int) ([]datav1alpha1.WebhookDelivery, bool, error)

// fill reads every slot with read, chartReads at once, within chartTimeout; a slot that
// cannot be read is marked, and the first error is returned with the rest drawn.
func (t *timeline) fill(ctx context.Context, read slotReader) error {
	ctx, cancel := context.WithTimeout(ctx, chartTimeout)
	defer cancel()
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, chartReads)
	var wg sync.WaitGroup
	for i := range t.Slots {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			from, until := t.bounds(i)
			items, more, err := read(ctx, from, until, perSlot)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Slots[i].Unread = true
				if first == nil {
					first = err
				}
				return
			}
			t.Slots[i].Capped = more
			for j := range items {
				t.add(i, &items[j])
			}
		}()
	}
	wg.Wait()
	return first
}

// chartView is the chart as the page draws it.
type chartView struct {
	Windows  []string
	Window   string
	Endpoint string
	// Note says what the chart could not read or does not count.
	Note string
	// Totals over the window.
	Succeeded, Failed int
	SuccessRate       string
	P50, P95          string
	Capped            bool
	// The SVG's geometry.
	Width, Height, PlotTop, PlotBottom, LatTop, LatBottom, Left, Right float64
	Bars                                                               []barView
	XLabels                                                            []labelView
	CountMax, LatencyMax                                               string
	P50Line, P95Line                                                   string
	P50Dots, P95Dots                                                   []point
	Rows                                                               []chartRow
	Title                                                              string
	// Drawn is false when nothing could be read.
	Drawn bool
}

type barView struct {
	X, W, OKY, OKH, FailY, FailH float64
	Capped, Unread               bool
	Title                        string
}

type point struct{ X, Y float64 }

type labelView struct {
	X    float64
	Text string
}

type chartRow struct {
	From, Until          string
	Succeeded, Failed    string
	P50, P95             string
	Capped, Unread, Some bool
}

// Geometry of the SVG, in its own units (it scales to the page's width).
const (
	svgWidth   = 960
	svgLeft    = 56
	svgRight   = 8
	plotTop    = 24
	plotBottom = 184
	latTop     = 216
	latBottom  = 296
	svgHeight  = 320
)

func fmtLatency(d time.Duration) string {
	switch {
	case d == 0:
		return ""
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// view draws the timeline.
func (t *timeline) view() chartView {
	v := chartView{Window: t.Window.Name, Width: svgWidth, Height: svgHeight, PlotTop: plotTop, PlotBottom: plotBottom,
		LatTop: latTop, LatBottom: latBottom, Left: svgLeft, Right: svgWidth - svgRight}
	for _, w := range chartWindows {
		v.Windows = append(v.Windows, w.Name)
	}
	var all slot
	maxCount, maxLat := 1, time.Millisecond
	for i := range t.Slots {
		s := &t.Slots[i]
		v.Succeeded += s.Succeeded
		v.Failed += s.Failed
		v.Capped = v.Capped || s.Capped
		maxCount = max(maxCount, s.Succeeded+s.Failed)
		maxLat = max(maxLat, s.percentile(0.95))
		for b, n := range s.latency {
			all.latency[b] += n
		}
		all.samples += s.samples
	}
	if n := v.Succeeded + v.Failed; n > 0 {
		v.SuccessRate = fmt.Sprintf("%.1f%%", 100*float64(v.Succeeded)/float64(n))
	}
	v.P50, v.P95 = fmtLatency(all.percentile(0.5)), fmtLatency(all.percentile(0.95))
	v.CountMax, v.LatencyMax = fmt.Sprint(maxCount), fmtLatency(maxLat)
	slotW := (v.Right - v.Left) / float64(len(t.Slots))
	countY := func(n int) float64 { return (plotBottom - plotTop) * float64(n) / float64(maxCount) }
	latY := func(d time.Duration) float64 {
		return latBottom - (latBottom-latTop)*float64(d)/float64(maxLat)
	}
	var p50, p95 []string
	every := max(1, len(t.Slots)/6)
	for i := range t.Slots {
		s := &t.Slots[i]
		from, until := t.bounds(i)
		x := v.Left + float64(i)*slotW
		okH, failH := countY(s.Succeeded), countY(s.Failed)
		b := barView{X: x + 1, W: math.Max(slotW-2, 1), FailY: plotBottom - failH, FailH: failH, OKY: plotBottom - failH - okH, OKH: okH,
			Capped: s.Capped, Unread: s.Unread}
		row := chartRow{From: from.UTC().Format("2006-01-02 15:04"), Until: until.UTC().Format("15:04"), Capped: s.Capped, Unread: s.Unread,
			Some: s.Succeeded+s.Failed > 0}
		more := ""
		if s.Capped {
			more = " or more"
		}
		row.Succeeded, row.Failed = fmt.Sprint(s.Succeeded), fmt.Sprint(s.Failed)
		b.Title = fmt.Sprintf("%s to %s UTC: %d delivered, %d failed%s", row.From, row.Until, s.Succeeded, s.Failed, more)
		if s.Unread {
			b.Title = fmt.Sprintf("%s to %s UTC: not read", row.From, row.Until)
		}
		if s.samples > 0 {
			l50, l95 := s.percentile(0.5), s.percentile(0.95)
			row.P50, row.P95 = fmtLatency(l50), fmtLatency(l95)
			b.Title += ", latency p50 " + row.P50 + ", p95 " + row.P95
			cx := x + slotW/2
			p50 = append(p50, fmt.Sprintf("%.1f,%.1f", cx, latY(l50)))
			p95 = append(p95, fmt.Sprintf("%.1f,%.1f", cx, latY(l95)))
			v.P50Dots = append(v.P50Dots, point{cx, latY(l50)})
			v.P95Dots = append(v.P95Dots, point{cx, latY(l95)})
		}
		v.Bars = append(v.Bars, b)
		v.Rows = append(v.Rows, row)
		if i%every == 0 {
			v.XLabels = append(v.XLabels, labelView{X: x, Text: from.UTC().Format("15:04")})
		}
	}
	v.P50Line, v.P95Line = strings.Join(p50, " "), strings.Join(p95, " ")
	return v
}

// deliveryChart reads and draws the chart of namespace ns (of one endpoint when endpoint is
// not empty) over the window the request names.
func (s *Server) deliveryChart(q *request, ns, endpoint string) chartView {
	w := chartWindows[1]
	for _, c := range chartWindows {
		if c.Name == q.r.URL.Query().Get("window") {
			w = c
		}
	}
	t := newTimeline(w, s.o.Now())
	err := t.fill(q.r.Context(), func(ctx context.Context, from, until time.Time, limit int) ([]datav1alpha1.WebhookDelivery, bool, error) {
		sel := []string{datav1alpha1.FieldSince + "=" + from.UTC().Format(time.RFC3339Nano), datav1alpha1.FieldUntil + "=" + until.UTC().Format(time.RFC3339Nano)}
		if endpoint != "" {
			sel = append(sel, datav1alpha1.FieldEndpoint+"="+endpoint)
		}
		var l datav1alpha1.WebhookDeliveryList
		err := q.kube.get(ctx, nsPath(dataPath, ns, datav1alpha1.ResourceDeliveries), url.Values{"fieldSelector": {strings.Join(sel, ",")}, "limit": {fmt.Sprint(limit)}}, &l)
		return l.Items, l.Continue != "", err
	})
	v := t.view()
	v.Endpoint, v.Drawn = endpoint, true
	v.Title = "Deliveries of " + ns
	if endpoint != "" {
		v.Title = "Deliveries of " + endpoint
	}
	switch {
	case err != nil && v.Succeeded+v.Failed == 0:
		v.Note, v.Drawn = "The chart cannot be drawn: "+err.Error(), false
	case err != nil:
		v.Note = "Some of the window could not be read (marked): " + err.Error()
	case v.Capped:
		v.Note = fmt.Sprintf("Slots marked ≥ held more than %d deliveries: they are drawn from their newest %d.", perSlot, perSlot)
	}
	return v
}
