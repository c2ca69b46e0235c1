package console

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet/themes"
)

// textPanel shows a long text (a shape diff, a bench table, a whole event).
type textPanel struct {
	*common
	title  string
	lines  []string
	offset int
	// style picks a line's style; nil draws every line as text.
	style func(t themes.Theme, line string) lipgloss.Style
}

func (p *textPanel) scroll(k tea.KeyPressMsg) {
	keys := p.keys
	last := max(len(p.lines)-1, 0)
	switch {
	case key.Matches(k, keys.Down.Binding):
		p.offset = min(p.offset+1, last)
	case key.Matches(k, keys.Up.Binding):
		p.offset = max(0, p.offset-1)
	case key.Matches(k, keys.PageDown.Binding):
		p.offset = min(p.offset+p.bodyHeight(), last)
	case key.Matches(k, keys.PageUp.Binding):
		p.offset = max(0, p.offset-p.bodyHeight())
	}
}

func (p *textPanel) render() []string {
	t := p.theme
	out := []string{t.Accent.Render(fit(p.title, p.width))}
	for i := p.offset; i < len(p.lines) && len(out) < p.bodyHeight(); i++ {
		style := t.Text
		if p.style != nil {
			style = p.style(t, p.lines[i])
		}
		out = append(out, style.Render(fit(p.lines[i], p.width)))
	}
	return out
}

// shapeLineStyle colours the shape diff (bench/shape's Report.Text, sent
// plain): the verdict green when the shapes are the same and red when they
// differ, the rows that differ (marked ≠) and what a client would notice
// (✗) red, the notes muted.
func shapeLineStyle(t themes.Theme, line string) lipgloss.Style {
	trimmed := strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(line, "Response shape:"):
		if strings.Contains(line, ": SAME") {
			return t.OK
		}
		return t.Err
	case strings.HasSuffix(trimmed, "≠"), strings.HasPrefix(trimmed, "✗"):
		return t.Err
	case strings.HasPrefix(trimmed, "·"), strings.HasPrefix(line, "Notes ("):
		return t.Muted
	case strings.HasPrefix(line, "What a client would notice"):
		return t.Accent
	}
	return t.Text
}

// helpPanel is the help screen, generated from the keymap: each key with
// what it does and, for the keys that act, the role they need.
type helpPanel struct {
	*common
	offset int
}

func (p *helpPanel) scroll(k tea.KeyPressMsg) {
	switch {
	case key.Matches(k, p.keys.Down.Binding):
		p.offset++
	case key.Matches(k, p.keys.Up.Binding):
		p.offset = max(0, p.offset-1)
	}
}

func (p *helpPanel) render() []string {
	t := p.theme
	user := p.opts.User
	lines := []string{t.Accent.Render("Keys") + t.Muted.Render(fmt.Sprintf("  (you are %s, role %s)", user.Name, user.Role))}
	for _, b := range p.keys.main() {
		h := b.Help()
		if h.Key == "" {
			continue // documented with its neighbour
		}
		role := ""
		if need, ok := b.role(); ok {
			role = " [" + string(need) + "]"
			if !b.allowed(user.Role) {
				role += " not for you"
			}
		}
		lines = append(lines, "  "+t.Key.Render(fit(h.Key, 16))+" "+t.Text.Render(h.Desc)+t.Muted.Render(role))
		if b.more != "" {
			lines = append(lines, "  "+t.Key.Render(fit("", 16))+" "+t.Text.Render(b.more))
		}
	}
	if p.offset > 0 && p.offset < len(lines) {
		lines = lines[p.offset:]
	}
	for i := range lines {
		lines[i] = ansi.Truncate(lines[i], p.width, "…")
	}
	return lines
}
