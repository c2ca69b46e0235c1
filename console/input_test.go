package console

import (
	"strings"
	"testing"
	"unicode/utf8"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/themes"
)

// TestFilterIsCapped: the filter of every view, the console's only text
// input, stops at maxFilterRunes however much is typed (a 10,000-character
// filter took 7.7 s of a core), says so, and a key past the cap costs
// nothing: no allocation, no refilter, no frame.
func TestFilterIsCapped(t *testing.T) {
	m := newModel(&oneWorker{}, Options{User: fleet.User{Name: "vic", Role: fleet.RoleViewer}, Width: 120, Height: 30, Theme: themes.Dark()})
	m.Update(m.fetchSnapshot()())
	for v := range m.views {
		m.view = viewKind(v)
		m.Update(pressKey("/"))
		for range maxFilterRunes + 50 {
			m.Update(pressKey("é")) // two bytes: the cap counts characters
		}
		// One key carrying several characters (an input method's) is cut
		// to what fits.
		m.Update(tea.KeyPressMsg{Code: 'x', Text: "xyz"})
		f := m.views[v].state().filter
		if n := utf8.RuneCountInString(f); n != maxFilterRunes || strings.ContainsAny(f, "xyz") {
			t.Errorf("%s: filter of %d characters (%q…), want %d é", m.views[v].name(), n, f[:min(len(f), 8)], maxFilterRunes)
		}
		if s := ansi.Strip(m.Render()); !strings.Contains(s, "filter is full") {
			t.Errorf("%s: a full filter does not say so:\n%s", m.views[v].name(), s)
		}
		key := tea.Msg(pressKey("a"))
		if allocs := testing.AllocsPerRun(100, func() { m.Update(key) }); allocs != 0 {
			t.Errorf("%s: a key past the cap allocates %.0f times; it should cost nothing", m.views[v].name(), allocs)
		}
		// Nor a frame: Bubble Tea asks for the view after every message,
		// and a frame each was 8.6 s of a core for 50,000 keys.
		m.View()
		frames := m.renders
		for range 1000 {
			m.Update(key)
			m.View()
		}
		if m.renders != frames {
			t.Errorf("%s: 1000 keys past the cap rendered %d frames; they change nothing on screen", m.views[v].name(), m.renders-frames)
		}
		m.Update(pressKey("enter"))
	}
}
