package console

import (
	"context"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/themes"
)

// oneWorker is the least Source: one ready worker, and a record of what
// reached the hub.
type oneWorker struct {
	did, refused []fleet.ActionName
}

func (s *oneWorker) Snapshot() fleet.Snapshot {
	return fleet.Snapshot{Workers: []fleet.WorkerView{{Worker: fleet.Worker{Node: "rig", Model: "m", State: fleet.WorkerReady}}}}
}
func (s *oneWorker) Do(_ context.Context, a Action) (string, error) {
	s.did = append(s.did, a.Kind)
	return "", nil
}
func (s *oneWorker) WorkerLog(context.Context, string, int) ([]string, error) { return nil, nil }
func (s *oneWorker) Refused(kind fleet.ActionName, _ []string)                { s.refused = append(s.refused, kind) }

func pressKey(k string) tea.KeyPressMsg {
	switch k {
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "space":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	}
	r := []rune(k)
	return tea.KeyPressMsg{Code: r[0], Text: k}
}

// The help screen is the keymap: every binding with help is on it with what
// it does, and every binding that acts names its role.
func TestHelpScreenIsTheKeymap(t *testing.T) {
	m := newModel(&oneWorker{}, Options{User: fleet.User{Name: "vic", Role: fleet.RoleViewer}, Width: 200, Height: 60, Theme: themes.Dark()})
	m.Update(pressKey("?"))
	screen := ansi.Strip(m.Render())
	for _, b := range m.keys.main() {
		h := b.Help()
		if h.Key == "" {
			continue
		}
		line := ""
		for _, l := range strings.Split(screen, "\n") {
			if strings.Contains(l, h.Desc) {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, h.Key) {
			t.Errorf("help lacks %q %q:\n%s", h.Key, h.Desc, screen)
			continue
		}
		if need, ok := b.role(); ok && !strings.Contains(line, "["+string(need)+"] not for you") {
			t.Errorf("help line of %q does not say it needs %s: %q", h.Key, need, line)
		}
	}
}

// The detail hands exactly the keys the keymap marks for it to the main
// handler: a viewer's action key there is refused and reported when it is
// marked, and ignored when it is not.
func TestDetailPassesThroughTheMarkedKeys(t *testing.T) {
	for _, b := range newKeyMap().main() {
		if b.action == "" {
			continue
		}
		t.Run(string(b.action), func(t *testing.T) {
			src := &oneWorker{}
			m := newModel(src, Options{User: fleet.User{Name: "vic", Role: fleet.RoleViewer}, Theme: themes.Dark()})
			m.Update(snapshotMsg{snap: src.Snapshot()})
			m.Update(pressKey("enter"))
			if m.overlay != overlayDetail {
				t.Fatalf("enter did not open the detail")
			}
			m.Update(pressKey(b.Keys()[0]))
			reported := len(src.refused) == 1 && src.refused[0] == b.action
			if b.detail != reported {
				t.Errorf("%q in the detail: refusals %v; passthrough %v", b.Keys()[0], src.refused, b.detail)
			}
			if len(src.did) != 0 {
				t.Errorf("a viewer's %q reached the hub: %v", b.Keys()[0], src.did)
			}
		})
	}
}

// TestKeymapNamesTheTablesActions: every key of the views carries its
// handler, and every key that asks the hub for something names an action
// of the hub's table (fleet.Actions), so its role, its refusal's audit line
// and the hub's dispatch all come from there. A key given an action the
// table lacks, or added without a handler, fails here.
func TestKeymapNamesTheTablesActions(t *testing.T) {
	km := newKeyMap()
	for _, b := range km.main() {
		if b.run == nil {
			t.Errorf("key %q (%s) has no handler: pressing it would do nothing", b.Keys(), b.Help().Desc)
		}
		if b.action == "" {
			continue
		}
		a, ok := fleet.LookupAction(b.action)
		if !ok {
			t.Errorf("key %q asks for %q, which is not in the action table: nobody could use it", b.Keys(), b.action)
			continue
		}
		if need, _ := b.role(); need != a.Role || b.hint != string(a.Name) {
			t.Errorf("key %q: role %q, hint %q; the table says %q needs %q", b.Keys(), need, b.hint, a.Name, a.Role)
		}
	}
	if got, want := len(Actions()), 5; got != want {
		t.Errorf("Actions() = %v, want the %d of d, u, r, s and b", Actions(), want)
	}
}
