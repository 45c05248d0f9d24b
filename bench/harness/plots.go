package harness

import (
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// latencyPNG draws the cumulative distribution of each series of latencies (ms) on a log
// scale.
func latencyPNG(path string, series map[string][]float64) error {
	p := plot.New()
	p.Title.Text = "webhook-operator: publish → receipt latency"
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of deliveries at or below"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	names := make([]string, 0, len(series))
	for n := range series {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, name := range names {
		v := slices.Clone(series[name])
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		const points = 2000
		var xy plotter.XYs
		for k := 0; k < points; k++ {
			idx := k * len(v) / points
			xy = append(xy, plotter.XY{X: max(v[idx], 0.01), Y: float64(idx+1) / float64(len(v))})
		}
		xy = append(xy, plotter.XY{X: max(v[len(v)-1], 0.01), Y: 1})
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(name, l)
	}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(10)
	p.Legend.YOffs = vg.Points(20)
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}

// ratePNG draws counts per interval of step (one series per name) as rates per second
// against seconds; series of at most one point are left out.
func ratePNG(path, title, xlabel, ylabel string, step time.Duration, series map[string][]float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	names := make([]string, 0, len(series))
	for n := range series {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, name := range names {
		var xy plotter.XYs
		for k, v := range series[name] {
			xy = append(xy, plotter.XY{X: float64(k) * step.Seconds(), Y: v / step.Seconds()})
		}
		if len(xy) < 2 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(name, l)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}

// countPer counts the times ts (unix ns) by whole intervals of step since t0 into series,
// which it grows as needed and returns; times before t0 are left out.
func countPer(series []float64, t0 time.Time, step time.Duration, ts []int64) []float64 {
	for _, t := range ts {
		k := int(time.Unix(0, t).Sub(t0) / step)
		if k < 0 {
			continue
		}
		for len(series) <= k {
			series = append(series, 0)
		}
		series[k]++
	}
	return series
}
