package console

import (
	"fmt"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
)

// workerLayout is the worker table's column widths. It is computed when the
// snapshot, filter or window changes, not per frame, so rendering touches
// only the visible rows.
type workerLayout struct {
	node, gpu, host, engine, state, load, spark, argv int
	nodeWorkers                                       map[string]int
}

const (
	colCtx    = 5
	colTok    = 6
	colMs     = 6
	maxNode   = 24
	maxGPU    = 18
	maxHost   = 11
	maxEngine = 10
)

func (m *Model) relayout() {
	l := workerLayout{
		node: len("Node"), gpu: len("GPU"), host: len("Host"), engine: len("Engine"),
		state: len("State"), load: len("Load"), nodeWorkers: map[string]int{},
	}
	for _, w := range m.snap.Workers {
		l.nodeWorkers[w.Node]++
	}
	for _, i := range m.workerIdx {
		w := m.snap.Workers[i]
		l.node = max(l.node, ansi.StringWidth(l.nodeLabel(w)))
		l.gpu = max(l.gpu, ansi.StringWidth(w.GPU))
		l.host = max(l.host, ansi.StringWidth(w.Host))
		l.engine = max(l.engine, ansi.StringWidth(w.Engine.Label()))
		l.state = max(l.state, len(stateCell(w)))
		l.load = max(l.load, len(loadCell(w)))
	}
	l.node, l.gpu, l.host, l.engine = min(l.node, maxNode), min(l.gpu, maxGPU), min(l.host, maxHost), min(l.engine, maxEngine)
	// mark + 10 separators + fixed columns; what is left goes to the sparklines
	// first (they are the point of the table), then to "Started with".
	fixed := 1 + 10 + l.node + l.gpu + l.host + l.engine + colCtx + l.state + l.load + colTok + 2*colMs
	for _, spark := range []int{8, 6, 4, 0} {
		l.spark = spark
		sparkCols := 0
		if spark > 0 {
			sparkCols = 2 * (spark + 1)
		}
		l.argv = m.width - fixed - sparkCols - 1
		if l.argv >= 24 || spark == 0 {
			break
		}
	}
	l.argv = max(l.argv, 0)
	m.layout = l
}

// nodeLabel is the Node column: the node's name where it runs one worker,
// NODE/MODEL where it runs several (DESIGN.md's naming rule).
func (l workerLayout) nodeLabel(w fleet.WorkerView) string {
	if l.nodeWorkers[w.Node] > 1 {
		return w.Name()
	}
	return w.Node
}

func loadCell(w fleet.WorkerView) string {
	if w.Slots <= 0 {
		return fmt.Sprintf("%d/-", w.InFlight)
	}
	return fmt.Sprintf("%d/%d", w.InFlight, w.Slots)
}

func ctxCell(n int) string {
	switch {
	case n <= 0:
		return "-"
	case n%1024 == 0:
		return fmt.Sprintf("%dk", n/1024)
	case n >= 1000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func tokCell(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func msCell(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.1fms", v)
	case v < 1000:
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.1fs", v/1000)
}

// fit pads or truncates s to exactly w cells.
func fit(s string, w int) string {
	if w <= 0 {
		return ""
	}
	sw, ok := asciiWidth(s)
	if !ok {
		sw = ansi.StringWidth(s)
	}
	if sw > w {
		return ansi.Truncate(s, w, "…")
	}
	return s + strings.Repeat(" ", w-sw)
}

func fitRight(s string, w int) string {
	sw, ok := asciiWidth(s)
	if !ok {
		sw = ansi.StringWidth(s)
	}
	if sw >= w {
		return fit(s, w)
	}
	return strings.Repeat(" ", w-sw) + s
}

// View renders the screen.
func (m *Model) View() tea.View {
	v := tea.NewView(m.Render())
	v.AltScreen = true
	v.WindowTitle = "fleet"
	return v
}

// Render is the screen as a string, height lines of at most width cells.
func (m *Model) Render() string {
	if m.quitting {
		return ""
	}
	var body []string
	switch m.overlay {
	case overlayHelp:
		body = m.renderHelp()
	case overlayText:
		body = m.renderText()
	case overlayDetail:
		body = m.renderDetail()
	case overlayConfirm:
		body = m.renderConfirm()
	default:
		switch m.view {
		case viewWorkers:
			body = m.renderWorkers()
		case viewNodes:
			body = m.renderNodes()
		case viewModels:
			body = m.renderModels()
		case viewEvents:
			body = m.renderEvents()
		}
	}
	h := m.bodyHeight()
	if len(body) > h {
		body = body[:h]
	}
	var b strings.Builder
	b.Grow(m.width * (m.height + 2) * 2)
	b.WriteString(m.renderTitle())
	for _, line := range body {
		b.WriteByte('\n')
		b.WriteString(line)
	}
	for i := len(body); i < h; i++ {
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	b.WriteString(m.renderStatus())
	b.WriteByte('\n')
	b.WriteString(m.renderHints())
	return b.String()
}

func (m *Model) renderTitle() string {
	t := m.theme
	var tabs strings.Builder
	tabs.WriteString(" fleet ")
	for v := viewKind(0); v < viewCount; v++ {
		name := v.String()
		if m.filter[v] != "" {
			name += "*"
		}
		if v == m.view && m.overlay != overlayDetail {
			tabs.WriteString("[" + name + "]")
		} else {
			tabs.WriteString(" " + name + " ")
		}
	}
	ready := 0
	for _, w := range m.snap.Workers {
		if w.State == fleet.WorkerReady {
			ready++
		}
	}
	right := fmt.Sprintf("%d/%d ready · %s (%s) · %s ",
		ready, len(m.snap.Workers), m.opts.User.Name, m.opts.User.Role, m.opts.Now().Format("15:04:05"))
	left := tabs.String()
	gap := m.width - ansi.StringWidth(left) - ansi.StringWidth(right)
	if gap < 1 {
		return t.Title.Render(fit(left, m.width))
	}
	return t.Title.Render(left + strings.Repeat(" ", gap) + right)
}

func (m *Model) renderStatus() string {
	t := m.theme
	if m.filtering {
		return t.Accent.Render("/") + t.Text.Render(fit(m.filter[m.view]+"█", m.width-1))
	}
	var parts []string
	for _, name := range sortedKeys(m.tracking) {
		tr := m.tracking[name]
		w, _ := m.workerByName(name)
		elapsed := m.opts.Now().Sub(tr.since).Round(time.Second)
		switch tr.kind {
		case ActionDrain:
			parts = append(parts, t.Warn.Render(fmt.Sprintf("draining %s: %d in flight (%s of %s)",
				name, w.InFlight, elapsed, shortDuration(m.opts.DrainTimeout))))
		case ActionRestart:
			parts = append(parts, t.Warn.Render(fmt.Sprintf("restarting %s: %s, %d in flight (%s)",
				name, w.State, w.InFlight, elapsed)))
		case ActionBench:
			parts = append(parts, t.Info.Render(fmt.Sprintf("benching %s: %s so far (its chart lands in the detail)",
				name, elapsed)))
		}
	}
	if m.flash != "" {
		style := map[flashLevel]lipgloss.Style{flashInfo: t.Info, flashOK: t.OK, flashWarn: t.Warn, flashErr: t.Err}[m.flashLevel]
		parts = append(parts, style.Render(m.flash))
	}
	if len(parts) == 0 {
		if !m.loaded {
			return t.Muted.Render(fit("loading…", m.width))
		}
		n := m.rowCount(m.view)
		line := fmt.Sprintf("%s: %d shown", m.view, n)
		if f := m.filter[m.view]; f != "" {
			line += fmt.Sprintf(" matching %q (esc clears)", f)
		}
		if len(m.marks) > 0 {
			line += fmt.Sprintf(" · %d marked", len(m.marks))
		}
		return t.Muted.Render(fit(line, m.width))
	}
	return ansi.Truncate(strings.Join(parts, t.Muted.Render(" · ")), m.width, "…")
}

func sortedKeys(mp map[string]tracker) []string {
	out := make([]string, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	// small: a handful of drains at once
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func (m *Model) renderHints() string {
	t := m.theme
	var pairs [][2]string
	switch {
	case m.filtering:
		pairs = [][2]string{{"enter", "keep filter"}, {"esc", "clear"}, {"ctrl+u", "erase"}}
	case m.overlay == overlayConfirm:
		pairs = [][2]string{{"y", "yes"}, {"n", "no"}}
	case m.overlay == overlayDetail:
		pairs = [][2]string{{"esc", "back"}, {"↑↓", "scroll"}, {"d", "drain"}, {"u", "undrain"}, {"r", "restart"}, {"b", "bench"}, {"?", "help"}}
	case m.overlay != overlayNone:
		pairs = [][2]string{{"↑↓", "scroll"}, {"esc", "back"}}
	default:
		pairs = [][2]string{{"↑↓", "move"}, {"enter", "detail"}, {"/", "filter"}, {"space", "mark"},
			{"d", "drain"}, {"u", "undrain"}, {"r", "restart"}, {"s", "shape"}, {"b", "bench"},
			{"tab", "view"}, {"?", "help"}, {"q", "quit"}}
	}
	var b strings.Builder
	width := 0
	for i, p := range pairs {
		w := len(p[0]) + 1 + len(p[1])
		if i > 0 {
			w += 2
		}
		if width+w > m.width {
			break
		}
		if i > 0 {
			b.WriteString("  ")
		}
		b.WriteString(t.Key.Render(p[0]) + " " + t.Muted.Render(p[1]))
		width += w
	}
	return b.String()
}

func (m *Model) renderWorkers() []string {
	t := m.theme
	l := m.layout
	if !m.loaded {
		return []string{t.Muted.Render("waiting for the first snapshot…")}
	}
	if len(m.snap.Workers) == 0 {
		return []string{t.Muted.Render("no workers yet: apply a fleet file (ssh … apply < fleet.yaml) or place a model")}
	}
	rows := make([]string, 0, m.pageRows()+1)
	var hb strings.Builder
	hb.WriteString(" ")
	hb.WriteString(fit("Node", l.node) + " " + fit("GPU", l.gpu) + " " + fit("Host", l.host) + " " +
		fit("Engine", l.engine) + " " + fitRight("Ctx", colCtx) + " " + fit("State", l.state) + " " +
		fitRight("Load", l.load) + " " + fitRight("tok/s", colTok) + " ")
	if l.spark > 0 {
		hb.WriteString(fit("TTFT", colMs+1+l.spark) + " " + fit("ITL", colMs+1+l.spark) + " ")
	} else {
		hb.WriteString(fitRight("TTFT", colMs) + " " + fitRight("ITL", colMs) + " ")
	}
	if l.argv > 0 {
		hb.WriteString(fit("Started with", l.argv))
	}
	rows = append(rows, t.Header.Render(fit(hb.String(), m.width)))
	if len(m.workerIdx) == 0 {
		return append(rows, t.Muted.Render(fmt.Sprintf("no worker matches %q (esc clears the filter)", m.filter[viewWorkers])))
	}
	end := min(m.offset[viewWorkers]+m.pageRows(), len(m.workerIdx))
	for pos := m.offset[viewWorkers]; pos < end; pos++ {
		rows = append(rows, m.workerRow(m.snap.Workers[m.workerIdx[pos]], pos == m.cursor[viewWorkers]))
	}
	return rows
}

func (m *Model) workerRow(w fleet.WorkerView, selected bool) string {
	t := m.theme
	l := m.layout
	mark := " "
	if m.marks[w.Name()] {
		mark = "•"
	}
	left := fit(l.nodeLabel(w), l.node) + " " + fit(w.GPU, l.gpu) + " " + fit(w.Host, l.host) + " " +
		fit(w.Engine.Label(), l.engine) + " " + fitRight(ctxCell(w.Context), colCtx) + " "
	state := fit(stateCell(w), l.state)
	mid := " " + fitRight(loadCell(w), l.load) + " " + fitRight(tokCell(w.TokPerSec), colTok) + " "
	ttft, itl := fitRight(msCell(w.TTFTms), colMs), fitRight(msCell(w.ITLms), colMs)
	var ttftSpark, itlSpark string
	if l.spark > 0 {
		ttftSpark = Spark(w.TTFTHistory, l.spark, SparkBound(w.TTFTHistory, 50))
		itlSpark = Spark(w.ITLHistory, l.spark, SparkBound(w.ITLHistory, 5))
	}
	argv := ""
	if l.argv > 0 {
		argv = fit(strings.Join(w.Argv, " "), l.argv)
	}
	if selected {
		line := mark + left + state + mid + ttft
		if l.spark > 0 {
			line += " " + ttftSpark
		}
		line += " " + itl
		if l.spark > 0 {
			line += " " + itlSpark
		}
		line += " " + argv
		return t.Selected.Render(fit(line, m.width))
	}
	p := m.paints
	var b strings.Builder
	b.Grow(m.width * 3)
	p.marked.wrap(&b, mark)
	p.text.wrap(&b, left)
	p.forState(w.State).wrap(&b, state)
	p.text.wrap(&b, mid+ttft)
	if l.spark > 0 {
		b.WriteByte(' ')
		p.spark.wrap(&b, ttftSpark)
	}
	p.text.wrap(&b, " "+itl)
	if l.spark > 0 {
		b.WriteByte(' ')
		p.spark.wrap(&b, itlSpark)
	}
	if argv != "" {
		b.WriteByte(' ')
		p.muted.wrap(&b, argv)
	}
	return b.String()
}

func (m *Model) renderNodes() []string {
	t := m.theme
	headers := []string{"Name", "Address", "Host", "GPU", "Memory free/total", "State", "Workers", "Note"}
	workers := map[string]int{}
	for _, w := range m.snap.Workers {
		workers[w.Node]++
	}
	cells := make([][]string, 0, len(m.nodeIdx))
	for _, i := range m.nodeIdx {
		n := m.snap.Nodes[i]
		host, gpu, mem := "?", "?", "-"
		if p := n.Platform; p != nil {
			host, gpu = p.HostLabel(), p.GPULabel()
			if p.MemTotalBytes > 0 {
				mem = fmt.Sprintf("%s/%s", gib(p.MemFreeBytes), gib(p.MemTotalBytes))
			}
		}
		note := n.Reason
		if n.Drained {
			note = strings.TrimSpace("drained " + note)
		}
		cells = append(cells, []string{n.Name, n.Address, host, gpu, mem, string(n.State), fmt.Sprint(workers[n.Name]), note})
	}
	return m.simpleTable(viewNodes, headers, cells, func(row, col int) lipgloss.Style {
		if col == 5 {
			return t.NodeState(fleet.NodeState(cells[row][5]))
		}
		if col == 7 {
			return t.Warn
		}
		return t.Text
	})
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// simpleTable renders a small table (nodes) with the cursor and scrolling of v.
func (m *Model) simpleTable(v viewKind, headers []string, cells [][]string, style func(row, col int) lipgloss.Style) []string {
	t := m.theme
	widths := make([]int, len(headers))
	for c, h := range headers {
		widths[c] = ansi.StringWidth(h)
	}
	for _, row := range cells {
		for c, cell := range row {
			widths[c] = min(max(widths[c], ansi.StringWidth(cell)), 40)
		}
	}
	var hb strings.Builder
	for c, h := range headers {
		hb.WriteString(" " + fit(h, widths[c]))
	}
	out := []string{t.Header.Render(fit(hb.String(), m.width))}
	if len(cells) == 0 {
		return append(out, t.Muted.Render("nothing to show"+filterNote(m.filter[v])))
	}
	end := min(m.offset[v]+m.pageRows(), len(cells))
	for r := m.offset[v]; r < end; r++ {
		if r == m.cursor[v] {
			var lb strings.Builder
			for c, cell := range cells[r] {
				lb.WriteString(" " + fit(cell, widths[c]))
			}
			out = append(out, t.Selected.Render(fit(lb.String(), m.width)))
			continue
		}
		var lb strings.Builder
		used := 0
		for c, cell := range cells[r] {
			w := min(widths[c], m.width-used-1)
			if w <= 0 {
				break
			}
			lb.WriteString(" " + style(r, c).Render(fit(cell, w)))
			used += w + 1
		}
		out = append(out, lb.String())
	}
	return out
}

func filterNote(f string) string {
	if f == "" {
		return ""
	}
	return fmt.Sprintf(" matching %q (esc clears the filter)", f)
}

// modelBlock is the lines one model takes in the models view.
func (m *Model) modelBlock(md fleet.Model) []string {
	t := m.theme
	ready, total := 0, 0
	for _, w := range m.snap.Workers {
		if w.Model == md.ID {
			total++
			if w.State == fleet.WorkerReady {
				ready++
			}
		}
	}
	head := md.ID
	if len(md.Aliases) > 0 {
		head += " (" + strings.Join(md.Aliases, ", ") + ")"
	}
	facts := fmt.Sprintf("  ctx %s", ctxCell(md.Context))
	if md.MemoryGB > 0 {
		facts += fmt.Sprintf(" · needs %.1f GB", md.MemoryGB)
	}
	if md.SpeedTolerance > 0 {
		facts += fmt.Sprintf(" · speed tolerance %.2f", md.SpeedTolerance)
	}
	if md.Reasoning != "" {
		facts += " · reasoning " + md.Reasoning
	}
	facts += fmt.Sprintf(" · %d/%d workers ready", ready, total)
	lines := []string{t.Accent.Render(head) + t.Muted.Render(facts)}
	for _, k := range fleet.EngineKinds {
		r, ok := md.Recipes[k]
		if !ok {
			continue
		}
		var parts []string
		if r.Model != "" {
			parts = append(parts, r.Model)
		}
		parts = append(parts, r.Args...)
		if r.Profile != "" {
			parts = append(parts, "profile "+r.Profile)
		}
		line := "    " + fit(k.Label(), 11) + " " + strings.Join(parts, " ")
		if r.Bin != "" {
			line += "  bin " + r.Bin
		}
		if r.Install != "" {
			line += "  install: " + r.Install
		}
		if len(r.Env) > 0 {
			line += fmt.Sprintf("  env %d vars", len(r.Env))
		}
		lines = append(lines, t.Text.Render(fit(line, m.width)))
	}
	return append(lines, "")
}

func (m *Model) renderModels() []string {
	t := m.theme
	if len(m.modelIdx) == 0 {
		return []string{t.Muted.Render("no models" + filterNote(m.filter[viewModels]))}
	}
	var out []string
	h := m.bodyHeight()
	for pos := m.offset[viewModels]; pos < len(m.modelIdx) && len(out) < h; pos++ {
		block := m.modelBlock(m.snap.Models[m.modelIdx[pos]])
		if pos == m.cursor[viewModels] {
			block[0] = t.Selected.Render(fit("▸ "+ansi.Strip(block[0]), m.width))
		} else {
			block[0] = "  " + block[0]
		}
		out = append(out, block...)
	}
	return out
}

func (m *Model) renderEvents() []string {
	t := m.theme
	if len(m.eventIdx) == 0 {
		return []string{t.Muted.Render("no events" + filterNote(m.filter[viewEvents]))}
	}
	out := []string{t.Header.Render(fit(" Time     Level Subject              Message", m.width))}
	end := min(m.offset[viewEvents]+m.pageRows(), len(m.eventIdx))
	for pos := m.offset[viewEvents]; pos < end; pos++ {
		e := m.events[m.eventIdx[pos]]
		if pos == m.cursor[viewEvents] {
			out = append(out, t.Selected.Render(fit(" "+eventLine(e, m.width-1), m.width)))
			continue
		}
		msgW := max(m.width-1-9-6-21, 0)
		out = append(out, " "+t.Muted.Render(e.At.Format("15:04:05"))+" "+t.Level(e.Level).Render(fit(e.Level, 5))+" "+
			t.Accent.Render(fit(e.Subject, 20))+" "+t.Text.Render(fit(oneLine(e.Message), msgW)))
	}
	return out
}

func eventLine(e fleet.Event, width int) string {
	return fit(e.At.Format("15:04:05")+" "+fit(e.Level, 5)+" "+fit(e.Subject, 20)+" "+oneLine(e.Message), width)
}

// oneLine joins a multi-line message (a bench table in an event) so it
// keeps to its row; enter on the event shows it whole.
func oneLine(s string) string {
	if !strings.Contains(s, "\n") {
		return s
	}
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " · ")
}

// renderDetail shows the detail from the scroll offset on, its first line
// (name and state) pinned so a scrolled view still says whose it is.
func (m *Model) renderDetail() []string {
	lines := m.detailLines()
	off := min(m.detailOffset, m.detailMaxOffset(len(lines)))
	if off <= 0 {
		return lines
	}
	return append(lines[:1:1], lines[1+off:]...)
}

func (m *Model) detailMaxOffset(lines int) int { return max(lines-m.bodyHeight(), 0) }

func (m *Model) detailLines() []string {
	t := m.theme
	w, ok := m.workerByName(m.detail)
	if !ok {
		return []string{t.Warn.Render(fmt.Sprintf("%s is no longer in the fleet (esc goes back)", m.detail))}
	}
	label := func(s string) string { return t.Muted.Render(s) }
	out := []string{
		t.Accent.Render(w.Name()) + "  " + t.State(w.State).Render(string(w.State)) + "  " +
			t.Text.Render(fmt.Sprintf("%s %s · %s · %s", w.Engine.Label(), w.EngineVersion, w.GPU, w.Host)),
	}
	if w.Reason != "" {
		out = append(out, t.Err.Render("reason: "+w.Reason))
	}
	mem := "-"
	if w.MemoryBytes > 0 {
		mem = gib(w.MemoryBytes)
	}
	started := "-"
	if !w.StartedAt.IsZero() {
		started = fmt.Sprintf("%s (%s ago)", w.StartedAt.Format("2006-01-02 15:04:05"), m.opts.Now().Sub(w.StartedAt).Round(time.Second))
	}
	out = append(out,
		label("PID ")+fmt.Sprint(w.PID)+label("  port ")+fmt.Sprint(w.Port)+label("  memory ")+mem+
			label("  started ")+started+label("  restarts ")+fmt.Sprint(w.Restarts),
		label("load ")+loadCell(w)+label("  tok/s ")+tokCell(w.TokPerSec)+label("  TTFT p50 ")+msCell(w.TTFTms)+label(" (predicted ")+msCell(w.PredictedTTFTms)+label(")")+
			label("  ITL ")+msCell(w.ITLms)+label("  ctx ")+ctxCell(w.Context)+label("  simulated ")+yesNo(w.Simulated),
		label("Started with:"),
	)
	for _, line := range wrapArgs(w.Argv, max(m.width-4, 10)) {
		out = append(out, "  "+t.Text.Render(line))
	}
	if w.Simulated && len(w.LaunchArgv) > 0 {
		out = append(out, label("Simulated; really runs:"))
		for _, line := range wrapArgs(w.LaunchArgv, max(m.width-4, 10)) {
			out = append(out, "  "+t.Muted.Render(line))
		}
	}
	out = append(out, m.renderBench(w)...)
	chartW := max(min(m.width-12, 120), 10)
	for _, c := range []struct {
		name  string
		hist  []float64
		floor float64
	}{{"TTFT", w.TTFTHistory, 50}, {"ITL", w.ITLHistory, 5}} {
		hi := SparkBound(c.hist, c.floor)
		out = append(out, label(fmt.Sprintf("%s history (%d samples, top %s)", c.name, len(c.hist), msCell(hi))))
		for i, row := range Chart(c.hist, chartW, 3, hi) {
			axis := "          "
			if i == 0 {
				axis = fitRight(msCell(hi), 9) + " "
			}
			out = append(out, t.Muted.Render(axis)+t.Spark.Render(row))
		}
	}
	out = append(out, label("Log (last lines):"))
	switch {
	case m.detailLogErr != nil:
		out = append(out, "  "+t.Err.Render(fit(m.detailLogErr.Error(), m.width-2)))
	case m.detailLog == nil:
		out = append(out, "  "+t.Muted.Render("reading…"))
	case len(m.detailLog) == 0:
		out = append(out, "  "+t.Muted.Render("(empty)"))
	}
	for _, line := range m.detailLog {
		out = append(out, "  "+t.Text.Render(fit(line, m.width-2)))
	}
	out = append(out, label("Recent events:"))
	n := 0
	for _, i := range m.eventIdx {
		e := m.events[i]
		if e.Subject != w.Name() && e.Subject != w.Node {
			continue
		}
		out = append(out, "  "+t.Level(e.Level).Render(eventLine(e, m.width-2)))
		if n++; n == 8 {
			break
		}
	}
	if n == 0 {
		out = append(out, "  "+t.Muted.Render("(none)"))
	}
	for i := range out {
		out[i] = ansi.Truncate(out[i], m.width, "…")
	}
	return out
}

// wrapArgs packs a command line into lines of at most width cells, breaking
// only between arguments so "--tensor-parallel-size" is never split at its
// hyphens (word wrapping does that, and a reader copies the wrong flag); an
// argument wider than a whole line is cut into line-sized pieces.
func wrapArgs(argv []string, width int) []string {
	var lines []string
	var cur strings.Builder
	curW := 0
	for _, arg := range argv {
		aw := ansi.StringWidth(arg)
		if curW > 0 && curW+1+aw > width {
			lines = append(lines, cur.String())
			cur.Reset()
			curW = 0
		}
		for aw > width {
			head := ansi.Truncate(arg, width, "")
			if curW > 0 {
				lines = append(lines, cur.String())
				cur.Reset()
				curW = 0
			}
			lines = append(lines, head)
			arg = arg[len(head):]
			aw = ansi.StringWidth(arg)
		}
		if curW > 0 {
			cur.WriteByte(' ')
			curW++
		}
		cur.WriteString(arg)
		curW += aw
	}
	if curW > 0 || len(lines) == 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (m *Model) renderConfirm() []string {
	t := m.theme
	if m.confirm == nil {
		return nil
	}
	body := t.Warn.Render(m.confirm.prompt) + "\n\n" + t.Key.Render("y") + t.Text.Render(" yes   ") + t.Key.Render("n") + t.Text.Render(" no")
	box := t.Dialog.Render(body)
	return strings.Split(lipgloss.Place(m.width, m.bodyHeight(), lipgloss.Center, lipgloss.Center, box), "\n")
}

func (m *Model) renderText() []string {
	t := m.theme
	out := []string{t.Accent.Render(fit(m.textTitle, m.width))}
	for i := m.textOffset; i < len(m.text) && len(out) < m.bodyHeight(); i++ {
		out = append(out, t.Text.Render(fit(m.text[i], m.width)))
	}
	return out
}

// helpEntries lists every key; the SSH layer's docs and the tests use it too.
// action names the hub action a key triggers; its role is fleet.ActionRole's.
var helpEntries = []struct{ key, what, action string }{
	{"↑ ↓ / k j", "move the cursor; scroll the detail or a text panel", ""},
	{"pgup pgdown", "move a page", ""},
	{"g G / home end", "first / last row", ""},
	{"enter", "worker detail: full command line, PID, port, memory, bench chart, history, log, events;", ""},
	{"", "in the events view, the whole event (a bench's table)", ""},
	{"tab / shift+tab", "next / previous view: workers → nodes → models → events", ""},
	{"/", "filter the view as you type (enter keeps it, esc clears it)", ""},
	{"space", "mark a worker; d, u, r and b act on the marked workers", ""},
	{"esc", "clear the filter, then the marks; close a panel", ""},
	{"d", "drain: no new requests, in-flight ones finish (asks first)", ActionDrain},
	{"u", "undrain: take requests again", ActionUndrain},
	{"r", "restart: drain, stop, launch again (asks first)", ActionRestart},
	{"s", "shape: compare the responses of the two marked workers", ActionShape},
	{"b", "bench: measure the worker at 1, 2 and 4 concurrent requests", ActionBench},
	{"?", "this help", ""},
	{"q / ctrl+c", "quit (q closes a panel first)", ""},
}

func (m *Model) renderHelp() []string {
	t := m.theme
	lines := []string{t.Accent.Render("Keys") + t.Muted.Render(fmt.Sprintf("  (you are %s, role %s)", m.opts.User.Name, m.opts.User.Role))}
	for _, e := range helpEntries {
		role := ""
		if e.action != "" {
			need := fleet.ActionRole(e.action)
			role = " [" + string(need) + "]"
			if !m.opts.User.Role.Allows(need) {
				role += " not for you"
			}
		}
		lines = append(lines, "  "+t.Key.Render(fit(e.key, 16))+" "+t.Text.Render(e.what)+t.Muted.Render(role))
	}
	if m.helpOffset > 0 && m.helpOffset < len(lines) {
		lines = lines[m.helpOffset:]
	}
	for i := range lines {
		lines[i] = ansi.Truncate(lines[i], m.width, "…")
	}
	return lines
}

// stateCell is the State column: the lifecycle state, with the install's
// progress while an engine is being installed.
func stateCell(w fleet.WorkerView) string {
	if w.State == fleet.WorkerInstalling && w.Progress > 0 {
		return fmt.Sprintf("%s %.0f%%", w.State, w.Progress)
	}
	return string(w.State)
}
