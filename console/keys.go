package console

import (
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"fleet"
)

// binding is one key of the console: the keys that press it and its help
// line (key.Binding), its word on the hint line, what it does (run, as
// k9s's KeyAction carries its action) and, for a key that acts on workers,
// the hub action it asks for, whose role (fleet.ActionRole) it needs. The
// help screen, the hint lines, the detail's passthrough and the key handler
// are all generated from the keymap, so a key is added in one place.
type binding struct {
	key.Binding
	// hintKey and hint are its entry on the main hint line ("" leaves it off).
	hintKey, hint string
	// detailHint is its entry on the detail's hint line; "" leaves it off.
	detailHint string
	// action is the hub action the key asks for; "" for keys that only move.
	action fleet.ActionName
	// run handles the key in the views (and in the detail, when passed);
	// nil for the keys of a mode with its own handler (filter, confirm).
	run func(m *Model, b binding) tea.Cmd
	// detail passes the key through to the main handler from the worker
	// detail, where it acts on the worker shown.
	detail bool
	// more continues the help line (a second line of help text).
	more string
}

func bind(keys []string, helpKey, help string) binding {
	return binding{Binding: key.NewBinding(key.WithKeys(keys...), key.WithHelp(helpKey, help))}
}

// role is what the key needs; keys without an action need nothing.
func (b binding) role() (fleet.Role, bool) {
	if b.action == "" {
		return "", false
	}
	return fleet.ActionRole(b.action), true
}

// allowed reports whether r may use the key. Keys r may not use are left off
// the hint lines (as k9s leaves dangerous keys unbound in read-only mode);
// pressing one still says why and is reported to the hub.
func (b binding) allowed(r fleet.Role) bool {
	need, ok := b.role()
	return !ok || r.Allows(need)
}

// keyMap is every key of the main views and the detail, in the order the
// help screen and hint lines show them. A binding whose help key is empty is
// documented by its neighbour (down with up).
type keyMap struct {
	Up, Down, PageUp, PageDown, Home, End binding
	Enter, Filter, Mark, Esc              binding
	Drain, Undrain, Restart, Shape, Bench binding
	NextView, PrevView, Help, Quit        binding
	interrupt                             binding
	filterKeep, filterClear, filterErase  binding
	filterBack                            binding
	confirmYes, confirmNo                 binding
	splitChat, splitAgent                 binding
	panelBack                             binding
}

// newKeyMap is the one place a key is defined: its keys, its help, its
// hint words, its action, its handler and whether the detail passes it
// through.
func newKeyMap() *keyMap {
	return &keyMap{
		Up: bind([]string{"up", "k"}, "↑ ↓ / k j", "move the cursor; scroll the detail or a text panel").
			hinted("↑↓", "move").inDetail("scroll").on(cursorKey(func(l *list, _, _ int) { l.cursor-- })),
		Down:     bind([]string{"down", "j"}, "", "").on(cursorKey(func(l *list, _, _ int) { l.cursor++ })),
		PageUp:   bind([]string{"pgup"}, "pgup pgdown", "move a page").on(cursorKey(func(l *list, _, page int) { l.cursor -= page })),
		PageDown: bind([]string{"pgdown"}, "", "").on(cursorKey(func(l *list, _, page int) { l.cursor += page })),
		Home:     bind([]string{"home", "g"}, "g G / home end", "first / last row").on(cursorKey(func(l *list, _, _ int) { l.cursor = 0 })),
		End:      bind([]string{"end", "G"}, "", "").on(cursorKey(func(l *list, rows, _ int) { l.cursor = rows - 1 })),
		Enter: bind([]string{"enter"}, "enter", "worker detail: full command line, PID, port, memory, bench chart, history, log, events;").
			hinted("enter", "detail").continued("in the events view, the whole event (a bench's table)").on((*Model).enterKey),
		Filter: bind([]string{"/"}, "/", "filter the view as you type (enter keeps it, esc clears it)").hinted("/", "filter").on((*Model).filterStartKey),
		Mark:   bind([]string{"space"}, "space", "mark a worker; d, u, r and b act on the marked workers").hinted("space", "mark").on((*Model).markKey),
		Esc:    bind([]string{"esc"}, "esc", "clear the filter, then the marks; close a panel").on((*Model).escKey),

		Drain:   act("d", "drain: no new requests, in-flight ones finish (asks first)", fleet.ActionDrain, (*Model).askKey).passed(),
		Undrain: act("u", "undrain: take requests again", fleet.ActionUndrain, (*Model).actKey).passed(),
		Restart: act("r", "restart: drain, stop, launch again (asks first)", fleet.ActionRestart, (*Model).askKey).passed(),
		// shape compares the two marked workers, so the detail of one has none.
		Shape: act("s", "shape: compare the responses of the two marked workers", fleet.ActionShape, (*Model).shapeKey),
		Bench: act("b", "bench: measure the worker at 1, 2 and 4 concurrent requests (asks: chat or agent split)", fleet.ActionBench, (*Model).benchKey).passed(),

		NextView: bind([]string{"tab"}, "tab / shift+tab", "next / previous view: workers → nodes → models → events → usage").hinted("tab", "view").on((*Model).nextViewKey),
		PrevView: bind([]string{"shift+tab"}, "", "").on((*Model).prevViewKey),
		Help:     bind([]string{"?"}, "?", "this help").hinted("?", "help").inDetail("help").passed().on((*Model).helpKey),
		Quit:     bind([]string{"q"}, "q / ctrl+c", "quit (q closes a panel first)").hinted("q", "quit").on((*Model).quitKey),
		// interrupt quits from anywhere, a panel or the filter prompt
		// included; the help shows it with Quit.
		interrupt: bind([]string{"ctrl+c"}, "", ""),

		filterKeep:  bind([]string{"enter"}, "enter", "keep filter"),
		filterClear: bind([]string{"esc"}, "esc", "clear"),
		filterErase: bind([]string{"ctrl+u"}, "ctrl+u", "erase"),
		filterBack:  bind([]string{"backspace"}, "", ""),
		confirmYes:  bind([]string{"y", "Y"}, "y", "yes"),
		confirmNo:   bind([]string{"n", "N", "esc", "q"}, "n", "no"),
		splitChat:   bind([]string{"c", "enter"}, "c", "chat split"),
		splitAgent:  bind([]string{"a"}, "a", "agent split"),
		panelBack:   bind([]string{"esc", "q", "enter"}, "esc", "back"),
	}
}

// act is a key that asks the hub for action, handled by run: its hint word
// is the action's name, and its role is the action's.
func act(k, help string, action fleet.ActionName, run func(*Model, binding) tea.Cmd) binding {
	b := bind([]string{k}, k, help).hinted(k, string(action)).on(run)
	b.action = action
	return b
}

// Actions are the hub actions the console's keys ask for, in help order:
// what a Source's Do must answer.
func Actions() []fleet.ActionName {
	var out []fleet.ActionName
	for _, b := range newKeyMap().main() {
		if b.action != "" {
			out = append(out, b.action)
		}
	}
	return out
}

func (b binding) on(run func(*Model, binding) tea.Cmd) binding { b.run = run; return b }
func (b binding) hinted(k, what string) binding                { b.hintKey, b.hint = k, what; return b }
func (b binding) inDetail(what string) binding                 { b.detailHint = what; return b }
func (b binding) continued(more string) binding                { b.more = more; return b }

// passed makes the detail hand the key to the main handler, to act on the
// worker shown, and shows it on the detail's hint line.
func (b binding) passed() binding {
	b.detail = true
	if b.detailHint == "" {
		b.detailHint = b.hint
	}
	return b
}

// main is the keymap of the views and the detail in help order.
func (k *keyMap) main() []*binding {
	return []*binding{
		&k.Up, &k.Down, &k.PageUp, &k.PageDown, &k.Home, &k.End,
		&k.Enter, &k.Filter, &k.Mark, &k.Esc,
		&k.Drain, &k.Undrain, &k.Restart, &k.Shape, &k.Bench,
		&k.NextView, &k.PrevView, &k.Help, &k.Quit,
	}
}

// passthrough is the keys the detail hands to the main handler, to act on
// the worker shown.
func (k *keyMap) passthrough() []key.Binding {
	var out []key.Binding
	for _, b := range k.main() {
		if b.detail {
			out = append(out, b.Binding)
		}
	}
	return out
}

// panelHints is the hint line of the help and text panels.
func (k *keyMap) panelHints() []hint {
	return []hint{{k.Up.hintKey, k.Up.detailHint}, {k.panelBack.Help().Key, k.panelBack.Help().Desc}}
}

// hint is one "key word" pair of a hint line.
type hint struct{ key, what string }

// mainHints is the hint line of the table views for role r.
func (k *keyMap) mainHints(r fleet.Role) []hint {
	var out []hint
	for _, b := range k.main() {
		if b.hint != "" && b.allowed(r) {
			out = append(out, hint{b.hintKey, b.hint})
		}
	}
	return out
}

// detailHints is the detail's hint line for role r: back, scroll, then the
// keys passed through to the main handler.
func (k *keyMap) detailHints(r fleet.Role) []hint {
	out := []hint{{k.panelBack.Help().Key, k.panelBack.Help().Desc}}
	for _, b := range k.main() {
		if b.detailHint != "" && b.allowed(r) {
			out = append(out, hint{b.hintKey, b.detailHint})
		}
	}
	return out
}

// helpsOf is the hint line of a mode with its own few keys.
func helpsOf(bs ...binding) []hint {
	out := make([]hint, len(bs))
	for i, b := range bs {
		out[i] = hint{b.Help().Key, b.Help().Desc}
	}
	return out
}
