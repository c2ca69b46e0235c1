package console

import (
	"fmt"
	"slices"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/columns"
)

// workersView is the live worker table.
type workersView struct {
	*common
	list
	idx      []int // the filtered rows, into snap.Workers in snapshot order
	haystack []string
	layout   workerLayout
	marks    map[string]bool
}

// workerColumn is a column of package columns as the console draws it: the
// latency columns carry a sparkline of their history when there is room.
type workerColumn struct {
	columns.Column
	history func(fleet.WorkerView) []float64
	floor   float64 // the sparkline's least top, so a quiet worker looks quiet
	// byState paints the cell in the colour of the worker's state.
	byState bool
}

// workerLayout is the worker table's columns and their widths. It is
// computed when the snapshot, filter or window changes, not per frame, so
// rendering touches only the visible rows.
type workerLayout struct {
	cols   []workerColumn
	widths []int
	spark  int // cells per sparkline, 0 for none
	argv   int // cells for "Started with"
}

func (v *workersView) name() string { return "workers" }
func (v *workersView) state() *list { return &v.list }
func (v *workersView) rows() int    { return len(v.idx) }
func (v *workersView) page() int    { return v.pageRows() }

// setSnapshot rebuilds what the filter searches and keeps the cursor on the
// worker it was on when rows move.
func (v *workersView) setSnapshot(previous string) {
	v.haystack = v.haystack[:0]
	for _, w := range v.snap.Workers {
		v.haystack = append(v.haystack, strings.ToLower(strings.Join([]string{
			w.Name(), w.GPU, w.Host, w.Engine.Label(), columns.StateCell(w), strings.Join(w.Argv, " "),
		}, " ")))
	}
	v.refilter()
	if previous == "" {
		return
	}
	for pos, i := range v.idx {
		if v.snap.Workers[i].Name() == previous {
			v.cursor = pos
			return
		}
	}
}

func (v *workersView) refilter() {
	f := strings.ToLower(v.filter)
	v.idx = v.idx[:0]
	for i := range v.snap.Workers {
		if f == "" || strings.Contains(v.haystack[i], f) {
			v.idx = append(v.idx, i)
		}
	}
	v.relayout()
}

func (v *workersView) cursorWorker() (fleet.WorkerView, bool) {
	if v.cursor < 0 || v.cursor >= len(v.idx) {
		return fleet.WorkerView{}, false
	}
	return v.snap.Workers[v.idx[v.cursor]], true
}

// toggleMark marks or unmarks the worker under the cursor and moves down.
func (v *workersView) toggleMark() {
	w, ok := v.cursorWorker()
	if !ok {
		return
	}
	if v.marks[w.Name()] {
		delete(v.marks, w.Name())
	} else {
		v.marks[w.Name()] = true
	}
	v.cursor++
}

// marked is the marked workers in snapshot order.
func (v *workersView) marked() []string {
	var out []string
	for _, w := range v.snap.Workers {
		if v.marks[w.Name()] {
			out = append(out, w.Name())
		}
	}
	return out
}

// narrowDrops are the columns a narrow window goes without, in order, so
// that the command line keeps a short form (minArgv cells; enter shows it
// whole): the OS (the GPU says as much), the context size (the detail has
// it) and the engine (the command line names it).
var narrowDrops = []string{columns.Host.Header, columns.Ctx.Header, columns.Engine.Header}

// minArgv is the least of "Started with" the table shows: the program and
// the start of its first argument ("vllm serve Qwen…").
const minArgv = 16

// relayout sizes the shared columns (columns.Table, the CLI's too) to the
// rows shown and the window: the sparklines get what is left first (they
// are the point of the table), then "Started with"; a window too narrow
// for its short form drops the columns of narrowDrops.
func (v *workersView) relayout() {
	for drop := 0; ; drop++ {
		l := v.layoutWithout(narrowDrops[:drop])
		if l.argv >= minArgv || drop == len(narrowDrops) {
			v.layout = l
			return
		}
	}
}

// layoutWithout lays the table out without the columns headed dropped.
func (v *workersView) layoutWithout(dropped []string) workerLayout {
	l := workerLayout{}
	for _, c := range columns.Table {
		if slices.Contains(dropped, c.Header) {
			continue
		}
		wc := workerColumn{Column: c}
		switch c.Header {
		case columns.State.Header:
			wc.byState = true
		case columns.TTFT.Header:
			wc.history, wc.floor = func(w fleet.WorkerView) []float64 { return w.TTFTHistory }, 50
		case columns.ITL.Header:
			wc.history, wc.floor = func(w fleet.WorkerView) []float64 { return w.ITLHistory }, 5
		}
		l.cols = append(l.cols, wc)
	}
	fixed := 1 // the mark
	sparks := 0
	for _, c := range l.cols {
		width := c.Width
		if width == 0 {
			width = ansi.StringWidth(c.Header)
			for _, i := range v.idx {
				width = max(width, ansi.StringWidth(c.Cell(v.snap.Workers[i])))
			}
			if c.Max > 0 {
				width = min(width, c.Max)
			}
		}
		l.widths = append(l.widths, width)
		fixed += width + 1 // and the separator after it
		if c.history != nil {
			sparks++
		}
	}
	for _, spark := range []int{8, 6, 4, 0} {
		l.spark = spark
		sparkCols := 0
		if spark > 0 {
			sparkCols = sparks * (spark + 1)
		}
		l.argv = v.width - fixed - sparkCols - 1
		if l.argv >= 24 || spark == 0 {
			break
		}
	}
	l.argv = max(l.argv, 0)
	return l
}

func (v *workersView) render() []string {
	t := v.theme
	l := v.layout
	if !v.loaded {
		return []string{t.Muted.Render("waiting for the first snapshot…")}
	}
	if len(v.snap.Workers) == 0 {
		return []string{t.Muted.Render("no workers yet: apply a fleet file (ssh … apply < fleet.yaml) or place a model")}
	}
	rows := make([]string, 0, v.pageRows()+1)
	var hb strings.Builder
	hb.WriteString(" ")
	for i, c := range l.cols {
		switch {
		case c.history != nil && l.spark > 0:
			hb.WriteString(fit(c.Header, l.widths[i]+1+l.spark))
		case c.Right:
			hb.WriteString(fitRight(c.Header, l.widths[i]))
		default:
			hb.WriteString(fit(c.Header, l.widths[i]))
		}
		hb.WriteByte(' ')
	}
	if l.argv > 0 {
		hb.WriteString(fit(columns.Argv.Header, l.argv))
	}
	rows = append(rows, t.Header.Render(fit(hb.String(), v.width)))
	if len(v.idx) == 0 {
		return append(rows, t.Muted.Render(fmt.Sprintf("no worker matches %q (esc clears the filter)", v.filter)))
	}
	end := min(v.offset+v.pageRows(), len(v.idx))
	for pos := v.offset; pos < end; pos++ {
		rows = append(rows, v.row(v.snap.Workers[v.idx[pos]], pos == v.cursor))
	}
	return rows
}

// row draws one worker. The cursor's row is one style across; the others
// are painted cell by cell with pre-rendered escapes, as a frame draws many.
func (v *workersView) row(w fleet.WorkerView, selected bool) string {
	l := v.layout
	p := v.paints
	var b strings.Builder
	b.Grow(v.width * 3)
	paint := func(pt paint, s string) {
		if selected {
			b.WriteString(s)
		} else {
			pt.wrap(&b, s)
		}
	}
	mark := " "
	if v.marks[w.Name()] {
		mark = "•"
	}
	paint(p.marked, mark)
	for i, c := range l.cols {
		if i > 0 {
			b.WriteByte(' ')
		}
		cell := c.Cell(w)
		if c.Right {
			cell = fitRight(cell, l.widths[i])
		} else {
			cell = fit(cell, l.widths[i])
		}
		if c.byState {
			paint(p.forState(w.State), cell)
		} else {
			paint(p.text, cell)
		}
		if c.history != nil && l.spark > 0 {
			hist := c.history(w)
			b.WriteByte(' ')
			paint(p.spark, Spark(hist, l.spark, SparkBound(hist, c.floor)))
		}
	}
	if l.argv > 0 {
		b.WriteByte(' ')
		paint(p.muted, fit(columns.Argv.Cell(w), l.argv))
	}
	if selected {
		return v.theme.Selected.Render(fit(b.String(), v.width))
	}
	return b.String()
}
