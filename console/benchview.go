package console

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/columns"
)

const (
	benchChartHeight = 4
	benchChartGap    = 4 // cells between the two charts when side by side
	benchIndent      = 2
)

// noBenchHint is what the detail says for a worker never benched.
const noBenchHint = "no bench yet: press b to run one (operator)"

// renderBench is the detail's bench section: the bench table of docs/measurements.md row and a
// bar chart each of total tok/s and TTFT p50 against concurrency.
// The agent split's latest sweep follows the chat one, each titled with its
// split, so the two shapes of load are read together.
func (cm *common) renderBench(w fleet.WorkerView) []string {
	t := cm.theme
	if len(w.Bench) == 0 && len(w.AgentBench) == 0 {
		return []string{t.Muted.Render("Bench: ") + t.Muted.Render(noBenchHint)}
	}
	var out []string
	if len(w.Bench) > 0 {
		out = cm.renderSweep("bench", w.Bench, w.BenchAt)
	}
	if len(w.AgentBench) > 0 {
		if len(out) > 0 {
			out = append(out, "")
		}
		out = append(out, cm.renderSweep("agent split bench (~4.6K-token prompts, ~70-token answers)", w.AgentBench, w.AgentBenchAt)...)
	}
	return out
}

// renderSweep is one sweep: its title, the table and the two charts.
func (cm *common) renderSweep(name string, points []fleet.BenchPoint, at time.Time) []string {
	t := cm.theme
	pts := byConcurrency(points)
	title := name
	if !at.IsZero() {
		title = fmt.Sprintf("%s (at %s, %s ago)", name, at.Format("2006-01-02 15:04:05"),
			max(cm.opts.Now().Sub(at), 0).Round(time.Second))
	}
	out := []string{t.Muted.Render(title)}
	indent := strings.Repeat(" ", benchIndent)
	for i, line := range benchTable(pts, cm.width-benchIndent) {
		style := t.Text
		if i == 0 {
			style = t.Header
		}
		out = append(out, indent+style.Render(line))
	}

	levels := make([]string, len(pts))
	tok, ttft := make([]float64, len(pts)), make([]float64, len(pts))
	tokLabels, ttftLabels := make([]string, len(pts)), make([]string, len(pts))
	for i, p := range pts {
		levels[i] = fmt.Sprint(p.Concurrency)
		tok[i], tokLabels[i] = p.TotalTokPerSec, benchTok(p.TotalTokPerSec)
		ttft[i], ttftLabels[i] = p.TTFTp50ms, columns.Millis(p.TTFTp50ms)
	}
	charts := []barChart{
		{title: "total tok/s by concurrency", values: tok, labels: tokLabels, levels: levels},
		{title: "TTFT p50 by concurrency", values: ttft, labels: ttftLabels, levels: levels},
	}
	slot, bar, sideBySide := benchChartSize(charts, cm.width)
	if sideBySide {
		left, right := cm.barChartRows(charts[0], slot, bar), cm.barChartRows(charts[1], slot, bar)
		gap := strings.Repeat(" ", benchChartGap)
		for i := range left {
			out = append(out, indent+left[i]+gap+right[i])
		}
		return out
	}
	for _, c := range charts {
		for _, row := range cm.barChartRows(c, slot, bar) {
			out = append(out, indent+row)
		}
	}
	return out
}

// benchTok formats a tok/s figure as the bench table of docs/measurements.md does: whole numbers,
// with a decimal only where the figure is small enough to need one.
func benchTok(v float64) string {
	switch {
	case v <= 0 || math.IsNaN(v):
		return "-"
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// benchTable is the bench table of docs/measurements.md ("1 request tok/s | 2 concurrent
// total | 4 concurrent total | per request at 4 | TTFT p50"), a header and
// one row of values with the columns right-aligned. That wording needs
// about 95 cells; narrower terminals get the same columns abbreviated, and
// when even those do not fit (a sweep of many levels) the table turns on its
// side: a row per level.
func benchTable(pts []fleet.BenchPoint, width int) []string {
	var long, short, cells []string
	for i, p := range pts {
		if i == 0 && p.Concurrency == 1 {
			// One request alone: its total is its per-request speed.
			long, short = append(long, "1 request tok/s"), append(short, "1 req tok/s")
			cells = append(cells, benchTok(p.PerRequestTokPerSec))
			continue
		}
		long = append(long, fmt.Sprintf("%d concurrent total", p.Concurrency))
		short = append(short, fmt.Sprintf("%d conc total", p.Concurrency))
		cells = append(cells, benchTok(p.TotalTokPerSec))
	}
	last := pts[len(pts)-1]
	long = append(long, fmt.Sprintf("per request at %d", last.Concurrency))
	short = append(short, fmt.Sprintf("per req at %d", last.Concurrency))
	cells = append(cells, benchTok(last.PerRequestTokPerSec))
	long, short = append(long, "TTFT p50"), append(short, "TTFT p50")
	cells = append(cells, ttftList(pts))

	for _, heads := range [][]string{long, short} {
		if lines := alignColumns([][]string{heads, cells}); ansi.StringWidth(lines[0]) <= width {
			return lines
		}
	}
	rows := [][]string{{"concurrency", "total tok/s", "per request", "TTFT p50"}}
	for _, p := range pts {
		rows = append(rows, []string{fmt.Sprint(p.Concurrency), benchTok(p.TotalTokPerSec),
			benchTok(p.PerRequestTokPerSec), columns.Millis(p.TTFTp50ms)})
	}
	return alignColumns(rows)
}

// alignColumns joins rows of cells with " | ", each column right-aligned to
// its widest cell.
func alignColumns(rows [][]string) []string {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for c, cell := range row {
			widths[c] = max(widths[c], ansi.StringWidth(cell))
		}
	}
	out := make([]string, len(rows))
	for r, row := range rows {
		cells := make([]string, len(row))
		for c, cell := range row {
			cells[c] = fitRight(cell, widths[c])
		}
		out[r] = strings.Join(cells, " | ")
	}
	return out
}

// ttftList is every level's TTFT p50, in level order: "95/110/140ms".
func ttftList(pts []fleet.BenchPoint) string {
	allMs := true
	for _, p := range pts {
		if p.TTFTp50ms <= 0 || p.TTFTp50ms >= 1000 {
			allMs = false
		}
	}
	parts := make([]string, len(pts))
	for i, p := range pts {
		if allMs {
			parts[i] = fmt.Sprintf("%.0f", p.TTFTp50ms)
		} else {
			parts[i] = columns.Millis(p.TTFTp50ms)
		}
	}
	s := strings.Join(parts, "/")
	if allMs {
		s += "ms"
	}
	return s
}

// barChart is one vertical bar chart: a bar per concurrency level, its
// value written above it and the level below.
type barChart struct {
	title  string
	values []float64
	labels []string
	levels []string
}

// width is the cells the chart takes with slots of the given width.
func (c barChart) width(slot int) int {
	return max(len(c.values)*slot, ansi.StringWidth(c.title))
}

// benchChartSize picks the widest bars that let both charts sit side by
// side in width; when even the thinnest do not, the charts are stacked.
func benchChartSize(charts []barChart, width int) (slot, bar int, sideBySide bool) {
	label := 0
	for _, c := range charts {
		for i := range c.labels {
			label = max(label, ansi.StringWidth(c.labels[i]), ansi.StringWidth(c.levels[i]))
		}
	}
	const minBar, maxBar = 3, 6
	for bar = maxBar; bar >= minBar; bar-- {
		// A slot leaves a gap beside its bar and room for its labels.
		slot = max(bar+2, label+1)
		total := benchIndent + benchChartGap
		for _, c := range charts {
			total += c.width(slot)
		}
		if total <= width {
			return slot, bar, true
		}
	}
	return max(minBar+2, label+1), minBar, false
}

// barChartRows renders c as rows of exactly c.width(slot) cells: the title,
// a row of headroom for the tallest bar's label, benchChartHeight rows of
// bars, and the concurrency levels. Bars come from Chart, each value
// repeated across its bar's columns, so partial blocks give the same eight
// steps per row as the history charts.
func (cm *common) barChartRows(c barChart, slot, bar int) []string {
	t := cm.theme
	width := c.width(slot)
	hi := 0.0
	for _, v := range c.values {
		if !math.IsNaN(v) {
			hi = max(hi, v)
		}
	}
	lead := (slot - bar) / 2
	samples := make([]float64, 0, len(c.values)*slot)
	labelRow := make([]int, len(c.values)) // index into the rows below the title
	for i, v := range c.values {
		for col := 0; col < slot; col++ {
			if col >= lead && col < lead+bar {
				samples = append(samples, v)
			} else {
				samples = append(samples, 0)
			}
		}
		labelRow[i] = benchChartHeight - int(math.Ceil(float64(barEighths(v, hi))/8))
	}
	bars := Chart(samples, len(samples), benchChartHeight, hi)
	cells := make([][]rune, len(bars))
	for r := range bars {
		cells[r] = []rune(bars[r])
	}

	rows := []string{t.Muted.Render(fit(c.title, width))}
	for g := 0; g <= benchChartHeight; g++ {
		var b strings.Builder
		for i := range c.values {
			switch {
			case g == labelRow[i]:
				b.WriteString(t.Text.Render(center(c.labels[i], slot)))
			case g == 0:
				b.WriteString(strings.Repeat(" ", slot))
			default:
				b.WriteString(t.Spark.Render(string(cells[g-1][i*slot : (i+1)*slot])))
			}
		}
		b.WriteString(strings.Repeat(" ", width-len(c.values)*slot))
		rows = append(rows, b.String())
	}
	var axis strings.Builder
	for i := range c.levels {
		axis.WriteString(center(c.levels[i], slot))
	}
	rows = append(rows, t.Muted.Render(fit(axis.String(), width)))
	return rows
}

// barEighths is how many eighth-rows Chart fills for v, by the same rule.
func barEighths(v, hi float64) int {
	if hi <= 0 || math.IsNaN(v) || v <= 0 {
		return 0
	}
	e := int(math.Round(v / hi * float64(benchChartHeight*8)))
	return max(1, min(e, benchChartHeight*8))
}

// center pads s to w cells with s in the middle, truncating if it is wider.
func center(s string, w int) string {
	sw := ansi.StringWidth(s)
	if sw >= w {
		return fit(s, w)
	}
	left := (w - sw) / 2
	return strings.Repeat(" ", left) + s + strings.Repeat(" ", w-sw-left)
}

// benchSummary is a sweep in one phrase for the status line.
func benchSummary(points []fleet.BenchPoint) string {
	pts := byConcurrency(points)
	levels, tok := make([]string, len(pts)), make([]string, len(pts))
	for i, p := range pts {
		levels[i], tok[i] = fmt.Sprint(p.Concurrency), benchTok(p.TotalTokPerSec)
	}
	return fmt.Sprintf("%s tok/s total at %s concurrent, TTFT p50 %s",
		strings.Join(tok, " / "), strings.Join(levels, " / "), ttftList(pts))
}

// byConcurrency sorts a copy of the points so the x axis and the table run
// from the lowest level up whatever order the source keeps them in.
func byConcurrency(points []fleet.BenchPoint) []fleet.BenchPoint {
	pts := slices.Clone(points)
	slices.SortStableFunc(pts, func(a, b fleet.BenchPoint) int { return a.Concurrency - b.Concurrency })
	return pts
}
