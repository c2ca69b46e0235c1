package console

import (
	"context"
	"fmt"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/columns"
)

// detailView is one worker's detail: facts, command line, bench, history
// charts, log and events. Its first line stays pinned while the rest scrolls.
type detailView struct {
	*common
	worker string // "" when closed
	log    []string
	logErr error
	offset int // lines scrolled past the pinned first line
	logAt  time.Time
	busy   bool // a log read is on its way
}

func (d *detailView) open(worker string) {
	d.worker, d.log, d.logErr, d.offset = worker, nil, nil, 0
}

func (d *detailView) close() { d.worker = "" }

// fetchLog reads the worker's last log lines off the UI goroutine, at most
// every logRefreshEvery unless forced.
func (d *detailView) fetchLog(src Source, force bool) tea.Cmd {
	if d.worker == "" || d.busy {
		return nil
	}
	now := d.opts.Now()
	if !force && now.Sub(d.logAt) < logRefreshEvery {
		return nil
	}
	d.busy, d.logAt = true, now
	parent, worker := d.opts.Context, d.worker
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(parent, logHangGuard)
		defer cancel()
		lines, err := src.WorkerLog(ctx, worker, logLines)
		return logMsg{worker: worker, lines: lines, err: err}
	}
}

func (d *detailView) gotLog(msg logMsg) {
	d.busy = false
	if msg.worker == d.worker {
		d.log, d.logErr = msg.lines, msg.err
	}
}

// scroll moves the detail's view; the bound is taken from the lines the
// detail has now, since a log or bench arriving changes its length.
func (d *detailView) scroll(k tea.KeyPressMsg) {
	keys := d.keys
	limit := d.maxOffset(len(d.lines()))
	page := max(d.bodyHeight()-1, 1)
	switch {
	case key.Matches(k, keys.Down.Binding):
		d.offset++
	case key.Matches(k, keys.Up.Binding):
		d.offset--
	case key.Matches(k, keys.PageDown.Binding):
		d.offset += page
	case key.Matches(k, keys.PageUp.Binding):
		d.offset -= page
	case key.Matches(k, keys.Home.Binding):
		d.offset = 0
	case key.Matches(k, keys.End.Binding):
		d.offset = limit
	}
	d.offset = max(0, min(d.offset, limit))
}

// render shows the detail from the scroll offset on, its first line (name
// and state) pinned so a scrolled view still says whose it is.
func (d *detailView) render() []string {
	lines := d.lines()
	off := min(d.offset, d.maxOffset(len(lines)))
	if off <= 0 {
		return lines
	}
	return append(lines[:1:1], lines[1+off:]...)
}

func (d *detailView) maxOffset(lines int) int { return max(lines-d.bodyHeight(), 0) }

func (d *detailView) lines() []string {
	t := d.theme
	w, ok := d.workerByName(d.worker)
	if !ok {
		return []string{t.Warn.Render(fmt.Sprintf("%s is no longer in the fleet (esc goes back)", d.worker))}
	}
	label := func(s string) string { return t.Muted.Render(s) }
	out := []string{
		t.Accent.Render(w.Name()) + "  " + t.State(w.State).Render(columns.StateCell(w)) + "  " +
			t.Text.Render(fmt.Sprintf("%s %s · %s · %s", w.Engine.Label(), w.EngineVersion, w.GPU, w.Host)),
	}
	if w.Reason != "" {
		out = append(out, t.Err.Render("reason: "+w.Reason))
	}
	mem := "-"
	if w.MemoryBytes > 0 {
		mem = fleet.GiB(w.MemoryBytes)
	}
	started := "-"
	if !w.StartedAt.IsZero() {
		started = fmt.Sprintf("%s (%s ago)", w.StartedAt.Format("2006-01-02 15:04:05"), d.opts.Now().Sub(w.StartedAt).Round(time.Second))
	}
	out = append(out,
		label("PID ")+columns.PIDCell(w)+label("  port ")+columns.PortCell(w)+label("  memory ")+mem+
			label("  started ")+started+label("  restarts ")+fmt.Sprint(w.Restarts),
		label("load ")+columns.LoadCell(w)+label("  tok/s ")+columns.Rate(w.TokPerSec)+label("  TTFT p50 ")+columns.Millis(w.TTFTms)+
			label(" (predicted ")+columns.Millis(w.PredictedTTFTms)+label(")")+
			label("  ITL ")+columns.Millis(w.ITLms)+label("  cache hit ")+cacheHitCell(w.CacheHit)+label("  ctx ")+columns.Tokens(w.Context)+
			label("  simulated ")+yesNo(w.Simulated),
		label("Started with:"),
	)
	for _, line := range wrapArgs(w.Argv, max(d.width-4, 10)) {
		out = append(out, "  "+t.Text.Render(line))
	}
	if w.EngineBin != "" {
		out = append(out, label("  found on the node at ")+t.Text.Render(w.EngineBin))
	}
	if w.Simulated && len(w.LaunchArgv) > 0 {
		out = append(out, label("Simulated; really runs:"))
		for _, line := range wrapArgs(w.LaunchArgv, max(d.width-4, 10)) {
			out = append(out, "  "+t.Muted.Render(line))
		}
	}
	out = append(out, d.renderBench(w)...)
	chartW := max(min(d.width-12, 120), 10)
	for _, c := range []struct {
		name  string
		hist  []float64
		floor float64
	}{{"TTFT", w.TTFTHistory, 50}, {"ITL", w.ITLHistory, 5}} {
		hi := SparkBound(c.hist, c.floor)
		out = append(out, label(fmt.Sprintf("%s history (%d samples, top %s)", c.name, len(c.hist), columns.Millis(hi))))
		for i, row := range Chart(c.hist, chartW, 3, hi) {
			axis := "          "
			if i == 0 {
				axis = fitRight(columns.Millis(hi), 9) + " "
			}
			out = append(out, t.Muted.Render(axis)+t.Spark.Render(row))
		}
	}
	out = append(out, label("Log (last lines):"))
	switch {
	case d.logErr != nil:
		out = append(out, "  "+t.Err.Render(fit(d.logErr.Error(), d.width-2)))
	case d.log == nil:
		out = append(out, "  "+t.Muted.Render("reading…"))
	case len(d.log) == 0:
		out = append(out, "  "+t.Muted.Render("(empty)"))
	}
	for _, line := range d.log {
		out = append(out, "  "+t.Text.Render(fit(line, d.width-2)))
	}
	out = append(out, label("Recent events:"))
	n := 0
	for _, e := range d.events {
		if e.Subject != w.Name() && e.Subject != w.Node {
			continue
		}
		out = append(out, "  "+t.Level(e.Level).Render(eventLine(e, d.width-2)))
		if n++; n == 8 {
			break
		}
	}
	if n == 0 {
		out = append(out, "  "+t.Muted.Render("(none)"))
	}
	for i := range out {
		out[i] = ansi.Truncate(out[i], d.width, "…")
	}
	return out
}

// cacheHitCell is the engine-reported prompt cache hit ratio, "-" before
// the engine reported one.
func cacheHitCell(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100**v)
}
