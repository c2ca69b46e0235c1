package console

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
)

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

// fitTail is fit keeping the end of s, where a prompt's cursor is.
func fitTail(s string, w int) string {
	if w <= 0 {
		return ""
	}
	if sw := ansi.StringWidth(s); sw > w {
		return "…" + ansi.TruncateLeft(s, sw-w+1, "")
	}
	return fit(s, w)
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
	if !m.frameValid {
		m.frame, m.frameValid = m.Render(), true
		m.renders++
	}
	v := tea.NewView(m.frame)
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
		body = m.help.render()
	case overlayText:
		body = m.text.render()
	case overlayDetail:
		body = m.detail.render()
	case overlayConfirm:
		body = m.renderConfirm()
	default:
		body = m.views[m.view].render()
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
	for v, tv := range m.views {
		name := tv.name()
		if tv.state().filter != "" {
			name += "*"
		}
		if viewKind(v) == m.view && m.overlay != overlayDetail {
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
	hub := ""
	if hr := m.snap.Hub; hr != nil {
		// Several hubs: which one this is, and who drives the nodes.
		switch {
		case hr.Role == "leader":
			hub = hr.Name + " leader · "
		case hr.Leader != "":
			hub = hr.Name + " follower of " + hr.Leader + " · "
		default:
			hub = hr.Name + " follower, no leader · "
		}
	}
	right := fmt.Sprintf("%d/%d ready · %s%s (%s) · %s ",
		ready, len(m.snap.Workers), hub, m.opts.User.Name, m.opts.User.Role, m.opts.Now().Format("15:04:05"))
	left := tabs.String()
	gap := m.width - ansi.StringWidth(left) - ansi.StringWidth(right)
	if gap < 1 {
		// A narrow terminal keeps the ready count, the part that changes.
		right = fmt.Sprintf("%d/%d ready ", ready, len(m.snap.Workers))
		gap = m.width - ansi.StringWidth(left) - ansi.StringWidth(right)
	}
	if gap < 1 {
		return t.Title.Render(fit(left, m.width))
	}
	return t.Title.Render(left + strings.Repeat(" ", gap) + right)
}

func (m *Model) renderStatus() string {
	t := m.theme
	if m.filtering {
		f := m.views[m.view].state().filter
		if utf8.RuneCountInString(f) >= maxFilterRunes {
			full := fmt.Sprintf(" (the filter is full: %d characters)", maxFilterRunes)
			room := max(m.width-1-ansi.StringWidth(full), 0)
			return t.Accent.Render("/") + t.Text.Render(fitTail(f, room)) + t.Muted.Render(fit(full, m.width-1-room))
		}
		return t.Accent.Render("/") + t.Text.Render(fitTail(f+"█", m.width-1))
	}
	var parts []string
	for _, name := range sortedKeys(m.tracking) {
		tr := m.tracking[name]
		w, _ := m.workerByName(name)
		elapsed := m.opts.Now().Sub(tr.since).Round(time.Second)
		switch tr.kind {
		case fleet.ActionDrain:
			parts = append(parts, t.Warn.Render(fmt.Sprintf("draining %s: %d in flight (%s of %s)",
				name, w.InFlight, elapsed, shortDuration(m.opts.DrainTimeout))))
		case fleet.ActionRestart:
			parts = append(parts, t.Warn.Render(fmt.Sprintf("restarting %s: %s, %d in flight (%s)",
				name, w.State, w.InFlight, elapsed)))
		case fleet.ActionBench:
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
		v := m.views[m.view]
		line := fmt.Sprintf("%s: %d shown", v.name(), v.rows())
		if f := v.state().filter; f != "" {
			line += fmt.Sprintf(" matching %q (esc clears)", f)
		}
		if n := len(m.workers.marks); n > 0 {
			line += fmt.Sprintf(" · %d marked", n)
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

// renderHints is the last line: the keys of what is on screen, from the
// keymap, without the keys the user's role may not use.
func (m *Model) renderHints() string {
	t := m.theme
	k := m.keys
	var pairs []hint
	switch {
	case m.filtering:
		pairs = helpsOf(k.filterKeep, k.filterClear, k.filterErase)
	case m.overlay == overlayConfirm && m.confirm != nil && m.confirm.split:
		pairs = helpsOf(k.splitChat, k.splitAgent, k.confirmNo)
	case m.overlay == overlayConfirm:
		pairs = helpsOf(k.confirmYes, k.confirmNo)
	case m.overlay == overlayDetail:
		pairs = k.detailHints(m.opts.User.Role)
	case m.overlay != overlayNone:
		pairs = k.panelHints()
	default:
		pairs = k.mainHints(m.opts.User.Role)
	}
	// The keys to help and to quit are always shown, at the end: a narrow
	// window drops the hints before them.
	var pinned []hint
	for _, b := range []binding{k.Help, k.Quit} {
		if i := slices.IndexFunc(pairs, func(p hint) bool { return p.key == b.hintKey }); i >= 0 {
			pinned = append(pinned, pairs[i])
			pairs = slices.Delete(pairs, i, i+1)
		}
	}
	hintWidth := func(p hint) int { return ansi.StringWidth(p.key) + 1 + ansi.StringWidth(p.what) }
	room := m.width
	for _, p := range pinned {
		room -= hintWidth(p) + 2
	}
	var shown []hint
	for _, p := range pairs {
		w := hintWidth(p) + 2
		if w > room {
			break
		}
		shown = append(shown, p)
		room -= w
	}
	var b strings.Builder
	for i, p := range append(shown, pinned...) {
		if i > 0 {
			b.WriteString("  ")
		}
		b.WriteString(t.Key.Render(p.key) + " " + t.Muted.Render(p.what))
	}
	return ansi.Truncate(b.String(), m.width, "")
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
	yes, no := m.keys.confirmYes.Help(), m.keys.confirmNo.Help()
	answers := t.Key.Render(yes.Key) + t.Text.Render(" "+yes.Desc+"   ")
	if m.confirm.split {
		chat, agent := m.keys.splitChat.Help(), m.keys.splitAgent.Help()
		answers = t.Key.Render(chat.Key) + t.Text.Render(" "+chat.Desc+"   ") + t.Key.Render(agent.Key) + t.Text.Render(" "+agent.Desc+"   ")
	}
	body := t.Warn.Render(m.confirm.prompt) + "\n\n" + answers + t.Key.Render(no.Key) + t.Text.Render(" "+no.Desc)
	box := t.Dialog.Render(body)
	return strings.Split(lipgloss.Place(m.width, m.bodyHeight(), lipgloss.Center, lipgloss.Center, box), "\n")
}
