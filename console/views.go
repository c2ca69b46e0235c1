package console

import (
	"fmt"
	"strings"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/columns"
)

// nodesView is the nodes table.
type nodesView struct {
	*common
	list
	idx []int
}

func (v *nodesView) name() string { return "nodes" }
func (v *nodesView) state() *list { return &v.list }
func (v *nodesView) rows() int    { return len(v.idx) }
func (v *nodesView) page() int    { return v.pageRows() }

func (v *nodesView) refilter() {
	f := strings.ToLower(v.filter)
	v.idx = v.idx[:0]
	for i, n := range v.snap.Nodes {
		if f == "" || strings.Contains(strings.ToLower(nodeHaystack(n)), f) {
			v.idx = append(v.idx, i)
		}
	}
}

func nodeHaystack(n fleet.Node) string {
	s := n.Name + " " + n.Address + " " + string(n.State) + " " + n.Reason
	if n.Platform != nil {
		s += " " + n.Platform.HostLabel() + " " + n.Platform.GPULabel()
	}
	return s
}

// cursorNode is the node under the cursor.
func (v *nodesView) cursorNode() (fleet.Node, bool) {
	if v.cursor < 0 || v.cursor >= len(v.idx) {
		return fleet.Node{}, false
	}
	return v.snap.Nodes[v.idx[v.cursor]], true
}

func (v *nodesView) render() []string {
	t := v.theme
	headers := []string{"Name", "Address", "Host", "GPU", "Memory free/total", "State", "Workers", "Note"}
	workers := map[string]int{}
	for _, w := range v.snap.Workers {
		workers[w.Node]++
	}
	cells := make([][]string, 0, len(v.idx))
	for _, i := range v.idx {
		n := v.snap.Nodes[i]
		host, gpu, mem := "?", "?", "-"
		if p := n.Platform; p != nil {
			host, gpu = p.HostLabel(), p.GPULabel()
			if p.MemTotalBytes > 0 {
				mem = fmt.Sprintf("%s/%s", fleet.GiB(p.MemFreeBytes), fleet.GiB(p.MemTotalBytes))
			}
		}
		note := n.Reason
		if n.Drained {
			note = strings.TrimSpace("drained " + note)
		}
		cells = append(cells, []string{n.Name, n.Address, host, gpu, mem, string(n.State), fmt.Sprint(workers[n.Name]), note})
	}
	return v.simpleTable(&v.list, headers, cells, func(row, col int) lipgloss.Style {
		if col == 5 {
			return t.NodeState(fleet.NodeState(cells[row][5]))
		}
		if col == 7 {
			return t.Warn
		}
		return t.Text
	})
}

// simpleTable renders a small table (nodes) with the cursor and scrolling of l.
func (c *common) simpleTable(l *list, headers []string, cells [][]string, style func(row, col int) lipgloss.Style) []string {
	t := c.theme
	widths := make([]int, len(headers))
	for i, h := range headers {
		widths[i] = ansi.StringWidth(h)
	}
	for _, row := range cells {
		for i, cell := range row {
			widths[i] = min(max(widths[i], ansi.StringWidth(cell)), 40)
		}
	}
	var hb strings.Builder
	for i, h := range headers {
		hb.WriteString(" " + fit(h, widths[i]))
	}
	out := []string{t.Header.Render(fit(hb.String(), c.width))}
	if len(cells) == 0 {
		return append(out, t.Muted.Render("nothing to show"+filterNote(l.filter)))
	}
	end := min(l.offset+c.pageRows(), len(cells))
	for r := l.offset; r < end; r++ {
		if r == l.cursor {
			var lb strings.Builder
			for i, cell := range cells[r] {
				lb.WriteString(" " + fit(cell, widths[i]))
			}
			out = append(out, t.Selected.Render(fit(lb.String(), c.width)))
			continue
		}
		var lb strings.Builder
		used := 0
		for i, cell := range cells[r] {
			w := min(widths[i], c.width-used-1)
			if w <= 0 {
				break
			}
			lb.WriteString(" " + style(r, i).Render(fit(cell, w)))
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

// modelsView lists the models, a block of lines each.
type modelsView struct {
	*common
	list
	idx []int
}

func (v *modelsView) name() string { return "models" }
func (v *modelsView) state() *list { return &v.list }
func (v *modelsView) rows() int    { return len(v.idx) }

// page is 1: models scroll by model block, see render.
func (v *modelsView) page() int { return 1 }

func (v *modelsView) refilter() {
	f := strings.ToLower(v.filter)
	v.idx = v.idx[:0]
	for i, md := range v.snap.Models {
		if f == "" || strings.Contains(strings.ToLower(modelHaystack(md)), f) {
			v.idx = append(v.idx, i)
		}
	}
}

func modelHaystack(md fleet.Model) string {
	parts := append([]string{md.ID}, md.Aliases...)
	for k, r := range md.Recipes {
		parts = append(parts, string(k), r.Model, r.Profile)
	}
	return strings.Join(parts, " ")
}

// block is the lines one model takes in the models view.
func (v *modelsView) block(md fleet.Model) []string {
	t := v.theme
	ready, total := 0, 0
	for _, w := range v.snap.Workers {
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
	facts := fmt.Sprintf("  ctx %s", columns.Tokens(md.Context))
	if md.MemoryGB > 0 {
		facts += fmt.Sprintf(" · needs %g GiB", md.MemoryGB)
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
		lines = append(lines, t.Text.Render(fit(line, v.width)))
	}
	return append(lines, "")
}

func (v *modelsView) render() []string {
	t := v.theme
	if len(v.idx) == 0 {
		return []string{t.Muted.Render("no models" + filterNote(v.filter))}
	}
	var out []string
	h := v.bodyHeight()
	for pos := v.offset; pos < len(v.idx) && len(out) < h; pos++ {
		block := v.block(v.snap.Models[v.idx[pos]])
		if pos == v.cursor {
			block[0] = t.Selected.Render(fit("▸ "+ansi.Strip(block[0]), v.width))
		} else {
			block[0] = "  " + block[0]
		}
		out = append(out, block...)
	}
	return out
}

// eventsView is the events and audit trail, newest first.
type eventsView struct {
	*common
	list
	idx []int // into common.events
}

func (v *eventsView) name() string { return "events" }
func (v *eventsView) state() *list { return &v.list }
func (v *eventsView) rows() int    { return len(v.idx) }
func (v *eventsView) page() int    { return v.pageRows() }

func (v *eventsView) refilter() {
	f := strings.ToLower(v.filter)
	v.idx = v.idx[:0]
	for i, e := range v.events {
		if f == "" || strings.Contains(strings.ToLower(e.Level+" "+e.Subject+" "+e.Message), f) {
			v.idx = append(v.idx, i)
		}
	}
}

func (v *eventsView) cursorEvent() (fleet.Event, bool) {
	if v.cursor < 0 || v.cursor >= len(v.idx) {
		return fleet.Event{}, false
	}
	return v.events[v.idx[v.cursor]], true
}

func (v *eventsView) render() []string {
	t := v.theme
	if len(v.idx) == 0 {
		return []string{t.Muted.Render("no events" + filterNote(v.filter))}
	}
	out := []string{t.Header.Render(fit(" Time     Level Subject              Message", v.width))}
	end := min(v.offset+v.pageRows(), len(v.idx))
	for pos := v.offset; pos < end; pos++ {
		e := v.events[v.idx[pos]]
		if pos == v.cursor {
			out = append(out, t.Selected.Render(fit(" "+eventLine(e, v.width-1), v.width)))
			continue
		}
		msgW := max(v.width-1-9-6-21, 0)
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
