// Package console is the Bubble Tea UI of fleet: the live worker table, the
// nodes, models and events views, the worker detail, and the drain, undrain,
// restart, shape and bench actions. It knows nothing of SQL or SSH: it reads
// snapshots from a Source and hands actions back to it.
package console

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"fleet"
	"fleet/themes"
)

// Action is something an operator asked for: Kind is the action of the
// hub's table (fleet.Actions) that the key's binding names. Targets are
// worker names (NODE/MODEL). The Source enforces roles and writes the audit
// line; the console only refuses early so a viewer learns why without a
// round trip.
type Action struct {
	Kind    fleet.ActionName
	Targets []string
	// Split is a bench's: "chat" or "agent" (the bench package's splits).
	Split string
	// Width is the console's width in cells, for an answer shown as text
	// (the shape diff), which the Source lays out to fit it. The answer is
	// plain text: the console colours it (a Source's text is sanitised, so
	// escape codes in it would be shown, not obeyed).
	Width int
}

// The bench splits b offers.
const (
	SplitChat  = "chat"
	SplitAgent = "agent"
)

// Source is what the console needs from the hub.
type Source interface {
	Snapshot() fleet.Snapshot
	// Do performs an action and returns a message to show the operator.
	Do(ctx context.Context, a Action) (string, error)
	WorkerLog(ctx context.Context, worker string, lines int) ([]string, error)
	// Refused tells the hub the user pressed a key for an action their role
	// does not allow (fleet.ActionRole), so it is audited like a refused
	// exec; the console shows why and does nothing.
	Refused(kind fleet.ActionName, targets []string)
}

// Options configure one console.
type Options struct {
	User fleet.User
	// Theme is used as given when Theme.Name is set; otherwise the console
	// picks dark or light from the client terminal's background colour.
	Theme         themes.Theme
	Width, Height int
	// Refresh is how often the console re-reads the snapshot (default 500ms).
	Refresh time.Duration
	// DrainTimeout is what the confirmation says the hub waits for in-flight
	// requests before cancelling them (default 5 minutes).
	DrainTimeout time.Duration
	// Context bounds the actions and log reads the console starts; the SSH
	// server passes the session's context so a dropped session cancels them.
	Context context.Context
	Logger  *slog.Logger
	// Now is the clock (tests pin it); nil means time.Now.
	Now func() time.Time
}

const (
	defaultRefresh      = 500 * time.Millisecond
	defaultDrainTimeout = 5 * time.Minute
	logLines            = 12
	logRefreshEvery     = 2 * time.Second
	actionHangGuard     = 10 * time.Minute
	logHangGuard        = 15 * time.Second
)

type viewKind int

const (
	viewWorkers viewKind = iota
	viewNodes
	viewModels
	viewEvents
	viewUsage
	viewCount
)

type overlayKind int

const (
	overlayNone overlayKind = iota
	overlayDetail
	overlayHelp
	overlayConfirm
	overlayText
)

type flashLevel int

const (
	flashInfo flashLevel = iota
	flashOK
	flashWarn
	flashErr
)

// pendingAction is an action waiting for y/n, or for a bench, for the
// split to run (c or a).
type pendingAction struct {
	action Action
	prompt string
	split  bool
}

// tracker follows a drain, restart or bench until the snapshot shows it
// finished.
type tracker struct {
	kind  fleet.ActionName
	since time.Time
	// benchAt is the worker's BenchAt when the bench was asked for: the hub
	// answers at once and the sweep lands later, so a new BenchAt is the
	// sign it finished (the sweep's own start time may precede since).
	benchAt time.Time
	// split is the bench's; an agent run lands in AgentBenchAt.
	split string
}

// Messages.
type (
	tickMsg     struct{}
	snapshotMsg struct{ snap fleet.Snapshot }
	actionMsg   struct {
		action Action
		sent   time.Time
		text   string
		err    error
	}
	logMsg struct {
		worker string
		lines  []string
		err    error
	}
)

// Model is the console: the views, each a small model of its own over a
// shared common, and what lies over them (the detail, help, a confirmation,
// a text panel). It is a tea.Model; use New.
type Model struct {
	*common
	src Source
	// themeFixed is set when the operator chose a theme, so the terminal's
	// background colour does not override it.
	themeFixed bool

	workers workersView
	nodes   nodesView
	models  modelsView
	evts    eventsView
	usage   usageView
	detail  detailView
	views   [viewCount]tableView
	view    viewKind

	filtering  bool
	overlay    overlayKind
	confirm    *pendingAction
	text       textPanel
	help       helpPanel
	flash      string
	flashLevel flashLevel
	busy       int
	tracking   map[string]tracker
	quitting   bool

	// frame is the last screen rendered, reused while frameValid: Bubble
	// Tea asks for the view after every message, and a key that changes
	// nothing (typed into a full filter) must not cost a frame.
	frame      string
	frameValid bool
	// renders counts the frames rendered (tests read it).
	renders int
	// ignoredKey is set by a key handler that changed nothing.
	ignoredKey bool
}

// New builds the console for one operator.
func New(src Source, opts Options) tea.Model {
	return newModel(src, opts)
}

func newModel(src Source, opts Options) *Model {
	if opts.Refresh <= 0 {
		opts.Refresh = defaultRefresh
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = defaultDrainTimeout
	}
	if opts.Context == nil {
		opts.Context = context.Background()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &common{opts: opts, log: logger, width: opts.Width, height: opts.Height, keys: newKeyMap()}
	m := &Model{common: c, src: src, tracking: map[string]tracker{}}
	if opts.Theme.Name != "" {
		c.theme, m.themeFixed = opts.Theme, true
	} else {
		c.theme = themes.ForBackground(true)
	}
	c.paints = newPaints(c.theme)
	if c.width <= 0 {
		c.width = 80
	}
	if c.height <= 0 {
		c.height = 24
	}
	m.workers = workersView{common: c, marks: map[string]bool{}}
	m.nodes = nodesView{common: c}
	m.models = modelsView{common: c}
	m.evts = eventsView{common: c}
	m.usage = usageView{common: c}
	m.detail = detailView{common: c}
	m.help = helpPanel{common: c}
	m.views = [viewCount]tableView{&m.workers, &m.nodes, &m.models, &m.evts, &m.usage}
	return m
}

// Init reads the first snapshot and, unless a theme was chosen, asks the
// client's terminal for its background colour.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{m.fetchSnapshot()}
	if !m.themeFixed {
		cmds = append(cmds, tea.RequestBackgroundColor)
	}
	return tea.Batch(cmds...)
}

func (m *Model) fetchSnapshot() tea.Cmd {
	src := m.src
	return func() tea.Msg { return snapshotMsg{snap: src.Snapshot()} }
}

func (m *Model) tick() tea.Cmd {
	return tea.Tick(m.opts.Refresh, func(time.Time) tea.Msg { return tickMsg{} })
}

// Update handles one message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	valid := m.frameValid
	m.frameValid = false
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = max(msg.Width, 20), max(msg.Height, 6)
		m.workers.relayout()
		m.clampAll()
		return m, nil
	case tea.BackgroundColorMsg:
		if !m.themeFixed {
			m.theme = themes.ForBackground(msg.IsDark())
			m.paints = newPaints(m.theme)
		}
		return m, nil
	case tickMsg:
		return m, m.fetchSnapshot()
	case snapshotMsg:
		m.apply(msg.snap)
		cmds := []tea.Cmd{m.tick()}
		if c := m.fetchLog(false); c != nil {
			cmds = append(cmds, c)
		}
		return m, tea.Batch(cmds...)
	case actionMsg:
		m.busy--
		return m, m.actionDone(msg)
	case logMsg:
		m.detail.gotLog(msg)
		return m, nil
	case tea.KeyPressMsg:
		flash := m.flash
		cmd := m.key(msg)
		if m.ignoredKey && m.flash == flash {
			m.frameValid = valid
		}
		m.ignoredKey = false
		return m, cmd
	}
	return m, nil
}

// apply takes a new snapshot: each view refilters, the worker table keeps
// its cursor on the same worker, and the drain/restart trackers advance.
func (m *Model) apply(s fleet.Snapshot) {
	var cursorName string
	if w, ok := m.workers.cursorWorker(); ok {
		cursorName = w.Name()
	}
	m.setSnapshot(s)
	m.workers.setSnapshot(cursorName)
	m.nodes.refilter()
	m.models.refilter()
	m.evts.refilter()
	m.usage.refilter()
	m.clampAll()
	m.track()
}

func (m *Model) fetchLog(force bool) tea.Cmd {
	if m.overlay != overlayDetail {
		return nil
	}
	return m.detail.fetchLog(m.src, force)
}

// track finishes drains and restarts the snapshot shows as done.
func (m *Model) track() {
	for name, t := range m.tracking {
		w, ok := m.workerByName(name)
		if !ok {
			delete(m.tracking, name)
			continue
		}
		switch t.kind {
		case fleet.ActionDrain:
			if w.InFlight == 0 && (w.State != fleet.WorkerReady || w.Drained) {
				delete(m.tracking, name)
				m.setFlash(flashOK, fmt.Sprintf("%s drained: no requests in flight, it takes no new ones (u undrains)", name))
			}
		case fleet.ActionRestart:
			switch {
			case w.State == fleet.WorkerReady && w.StartedAt.After(t.since):
				delete(m.tracking, name)
				m.setFlash(flashOK, fmt.Sprintf("%s restarted: ready, PID %d, started with %s", name, w.PID, strings.Join(w.Argv, " ")))
			case w.State == fleet.WorkerFailed || w.State == fleet.WorkerRejected:
				delete(m.tracking, name)
				m.setFlash(flashErr, fmt.Sprintf("%s restart ended %s: %s", name, w.State, w.Reason))
			}
		case fleet.ActionBench:
			points, at := benchOf(w, t.split)
			if len(points) > 0 && !at.Equal(t.benchAt) {
				delete(m.tracking, name)
				where := " (enter on it shows the chart)"
				if m.overlay == overlayDetail && m.detail.worker == name {
					where = ""
				}
				m.setFlash(flashOK, fmt.Sprintf("%s of %s done: %s%s", benchWord(t.split), name, benchSummary(points), where))
			} else if e, ok := m.benchFailure(name, t.since); ok {
				delete(m.tracking, name)
				m.setFlash(flashErr, fmt.Sprintf("bench of %s failed: %s", name, firstLine(e.Message)))
			}
		}
	}
}

// benchFailure finds the hub's word that a bench of the worker asked for at
// since failed: its "bench failed" event or the audit line of the refusal.
func (m *Model) benchFailure(name string, since time.Time) (fleet.Event, bool) {
	for _, e := range m.events {
		if e.Subject != name || e.At.Before(since) {
			continue
		}
		if strings.HasPrefix(e.Message, "bench failed") ||
			(e.Level == "audit" && strings.HasPrefix(e.Message, "bench by ") && strings.Contains(e.Message, ": failed")) {
			return e, true
		}
	}
	return fleet.Event{}, false
}

func (m *Model) clampAll() {
	for _, v := range m.views {
		v.state().clamp(v.rows(), v.page())
	}
}

func (m *Model) setFlash(level flashLevel, text string) {
	m.flash, m.flashLevel = text, level
}

// targets are the worker shown in the detail, else the marked workers, else
// the workers of the node under the cursor, else the worker under it.
func (m *Model) targets() []string {
	if m.overlay == overlayDetail && m.detail.worker != "" {
		return []string{m.detail.worker}
	}
	if out := m.workers.marked(); len(out) > 0 {
		return out
	}
	if m.view == viewNodes {
		n, ok := m.nodes.cursorNode()
		if !ok {
			return nil
		}
		var out []string
		for _, w := range m.snap.Workers {
			if w.Node == n.Name {
				out = append(out, w.Name())
			}
		}
		return out
	}
	if w, ok := m.workers.cursorWorker(); ok {
		return []string{w.Name()}
	}
	return nil
}

func (m *Model) inFlight(names []string) int {
	n := 0
	for _, name := range names {
		if w, ok := m.workerByName(name); ok {
			n += w.InFlight
		}
	}
	return n
}

func describe(names []string) string {
	if len(names) == 1 {
		return names[0]
	}
	if len(names) <= 3 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%d workers (%s, …)", len(names), strings.Join(names[:2], ", "))
}

// do runs an action off the UI goroutine.
func (m *Model) do(a Action) tea.Cmd {
	m.busy++
	m.setFlash(flashInfo, fmt.Sprintf("%s %s…", a.Kind, describe(a.Targets)))
	src, parent, sent := m.src, m.opts.Context, m.opts.Now()
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(parent, actionHangGuard)
		defer cancel()
		text, err := src.Do(ctx, a)
		return actionMsg{action: a, sent: sent, text: text, err: err}
	}
}

func (m *Model) actionDone(msg actionMsg) tea.Cmd {
	a := msg.action
	if msg.err != nil {
		m.log.Warn("console action failed", "user", m.opts.User.Name, "action", a.Kind, "targets", a.Targets, "err", msg.err)
		m.setFlash(flashErr, fmt.Sprintf("%s %s failed: %v", a.Kind, describe(a.Targets), msg.err))
		return nil
	}
	switch a.Kind {
	case fleet.ActionBench:
		// The hub starts the sweep and answers at once; the figures land in
		// the snapshot when it is done, and the detail's chart follows.
		for _, t := range a.Targets {
			w, _ := m.workerByName(t)
			_, at := benchOf(w, a.Split)
			m.tracking[t] = tracker{kind: a.Kind, since: msg.sent, benchAt: at, split: a.Split}
		}
		reply := strings.TrimSpace(msg.text)
		m.setFlash(flashOK, nonEmpty(firstLine(reply), fmt.Sprintf("bench %s started", describe(a.Targets))))
		if strings.Contains(reply, "\n") {
			// A source that answers with the whole table gets it shown.
			m.showText(fmt.Sprintf("bench %s", strings.Join(a.Targets, ", ")), reply)
		}
		m.track()
	case fleet.ActionShape:
		m.showText(fmt.Sprintf("%s %s", a.Kind, strings.Join(a.Targets, " vs ")), msg.text)
		m.text.style = shapeLineStyle
		m.setFlash(flashOK, fmt.Sprintf("%s done (esc closes)", a.Kind))
	case fleet.ActionDrain, fleet.ActionRestart:
		now := m.opts.Now()
		for _, t := range a.Targets {
			m.tracking[t] = tracker{kind: a.Kind, since: now}
		}
		m.setFlash(flashOK, nonEmpty(msg.text, fmt.Sprintf("%s %s started", a.Kind, describe(a.Targets))))
		m.track()
	default:
		for _, t := range a.Targets {
			delete(m.tracking, t)
		}
		m.setFlash(flashOK, nonEmpty(msg.text, fmt.Sprintf("%s %s done", a.Kind, describe(a.Targets))))
	}
	return nil
}

func (m *Model) showText(title, text string) {
	m.overlay = overlayText
	m.text = textPanel{common: m.common, title: title, lines: strings.Split(strings.TrimRight(text, "\n"), "\n")}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func nonEmpty(s, fallback string) string {
	if strings.TrimSpace(s) == "" {
		return fallback
	}
	return strings.TrimSpace(s)
}

// needs refuses a key the user's role does not allow, saying why; the hub
// audits the refusal.
func (m *Model) needs(b binding, targets []string) bool {
	if b.allowed(m.opts.User.Role) {
		return true
	}
	role, _ := b.role()
	m.src.Refused(b.action, targets)
	have := string(m.opts.User.Role)
	if have == "" {
		have = "no role"
	}
	m.setFlash(flashWarn, fmt.Sprintf("%s needs the %s role; you are %s", b.action, role, have))
	return false
}

func (m *Model) key(k tea.KeyPressMsg) tea.Cmd {
	keys := m.keys
	if key.Matches(k, keys.interrupt.Binding) {
		m.quitting = true
		return tea.Quit
	}
	// A message answers the last key; the next key makes it stale.
	if m.busy == 0 {
		m.flash = ""
	}
	if m.filtering {
		return m.filterKey(k)
	}
	switch m.overlay {
	case overlayConfirm:
		return m.confirmKey(k)
	case overlayHelp:
		if key.Matches(k, keys.panelBack.Binding, keys.Help.Binding) {
			m.overlay = overlayNone
		} else {
			m.help.scroll(k)
		}
		return nil
	case overlayText:
		if key.Matches(k, keys.panelBack.Binding) {
			m.overlay = overlayNone
		} else {
			m.text.scroll(k)
		}
		return nil
	case overlayDetail:
		switch {
		case key.Matches(k, keys.panelBack.Binding):
			m.overlay = overlayNone
			m.detail.close()
		case key.Matches(k, keys.Up.Binding, keys.Down.Binding, keys.PageUp.Binding, keys.PageDown.Binding, keys.Home.Binding, keys.End.Binding):
			m.detail.scroll(k)
		case key.Matches(k, keys.passthrough()...):
			return m.mainKey(k)
		}
		return nil
	}
	return m.mainKey(k)
}

// mainKey runs the handler the pressed key's binding carries (keys.go):
// the keymap is the one place a key of the views is defined, handler and
// all. A key no binding claims only keeps the cursors on a row.
func (m *Model) mainKey(k tea.KeyPressMsg) tea.Cmd {
	for _, b := range m.keys.main() {
		if b.run != nil && key.Matches(k, b.Binding) {
			return b.run(m, *b)
		}
	}
	m.clampAll()
	return nil
}

// The handlers of the keymap's bindings, in help order. Those that change
// what a view shows keep its cursor on a row (clamped); those that open a
// panel or hand the key to the hub return at once.

func (m *Model) quitKey(binding) tea.Cmd {
	m.quitting = true
	return tea.Quit
}

func (m *Model) helpKey(binding) tea.Cmd {
	m.overlay, m.help.offset = overlayHelp, 0
	return m.clamped()
}

func (m *Model) nextViewKey(binding) tea.Cmd {
	m.view = (m.view + 1) % viewCount
	return m.clamped()
}

func (m *Model) prevViewKey(binding) tea.Cmd {
	m.view = (m.view + viewCount - 1) % viewCount
	return m.clamped()
}

// cursorKey is the handler of a key that moves the current view's cursor;
// rows is the number of rows of that view and page a screenful.
func cursorKey(move func(l *list, rows, page int)) func(*Model, binding) tea.Cmd {
	return func(m *Model, _ binding) tea.Cmd {
		v := m.views[m.view]
		move(v.state(), v.rows(), m.pageRows())
		return m.clamped()
	}
}

func (m *Model) filterStartKey(binding) tea.Cmd {
	m.filtering = true
	return m.clamped()
}

// escKey clears the filter, else the marks.
func (m *Model) escKey(binding) tea.Cmd {
	v := m.views[m.view]
	l := v.state()
	switch {
	case l.filter != "":
		l.filter = ""
		v.refilter()
	case len(m.workers.marks) > 0:
		clear(m.workers.marks)
		m.setFlash(flashInfo, "marks cleared")
	}
	return m.clamped()
}

// enterKey opens the worker under the cursor, or the event under it whole.
func (m *Model) enterKey(binding) tea.Cmd {
	switch m.view {
	case viewEvents:
		if e, ok := m.evts.cursorEvent(); ok {
			m.showText(fmt.Sprintf("%s %s %s", e.At.Format("2006-01-02 15:04:05"), e.Level, e.Subject), e.Message)
		}
	case viewWorkers:
		if w, ok := m.workers.cursorWorker(); ok {
			m.overlay = overlayDetail
			m.detail.open(w.Name())
			return m.fetchLog(true)
		}
	}
	return nil
}

func (m *Model) markKey(binding) tea.Cmd {
	if m.view == viewWorkers {
		m.workers.toggleMark()
	}
	return m.clamped()
}

// askKey is the handler of drain and restart: they ask first (ask).
func (m *Model) askKey(b binding) tea.Cmd {
	if !m.needs(b, m.targets()) {
		return nil
	}
	return m.ask(b.action)
}

// actKey is the handler of an action done at once on the targets.
func (m *Model) actKey(b binding) tea.Cmd {
	t, ok := m.actTargets(b)
	if !ok {
		return nil
	}
	return m.do(Action{Kind: b.action, Targets: t})
}

// benchKey asks which split to bench the targets with.
func (m *Model) benchKey(b binding) tea.Cmd {
	t, ok := m.actTargets(b)
	if !ok {
		return nil
	}
	m.confirm = &pendingAction{action: Action{Kind: b.action, Targets: t}, split: true,
		prompt: fmt.Sprintf("Bench %s at 1, 2 and 4 concurrent requests: which split?\nchat: short prompts, 256-token answers\nagent: ~4.6K-token prompts, ~70-token answers", describe(t))}
	m.overlay = overlayConfirm
	return nil
}

// actTargets are the targets of b's action, once the role allows it and
// there is at least one; ok is false (and the flash says why) otherwise.
func (m *Model) actTargets(b binding) (t []string, ok bool) {
	if !m.needs(b, m.targets()) {
		return nil, false
	}
	t = m.targets()
	if len(t) == 0 {
		m.setFlash(flashWarn, fmt.Sprintf("no worker to %s here", b.action))
		return nil, false
	}
	return t, true
}

// shapeKey compares the two marked workers.
func (m *Model) shapeKey(b binding) tea.Cmd {
	t := m.workers.marked()
	if !m.needs(b, t) {
		return nil
	}
	if len(t) != 2 {
		m.setFlash(flashWarn, fmt.Sprintf("shape compares two workers: mark exactly two with space (%d marked)", len(t)))
		return nil
	}
	return m.do(Action{Kind: b.action, Targets: t, Width: m.width})
}

// clamped keeps every view's cursor on a row after a key changed it.
func (m *Model) clamped() tea.Cmd {
	m.clampAll()
	return nil
}

// ask opens the confirmation for a drain or restart, naming what will happen.
func (m *Model) ask(kind fleet.ActionName) tea.Cmd {
	t := m.targets()
	if len(t) == 0 {
		m.setFlash(flashWarn, fmt.Sprintf("no worker to %s here", kind))
		return nil
	}
	n := m.inFlight(t)
	timeout := m.opts.DrainTimeout
	var prompt string
	switch kind {
	case fleet.ActionDrain:
		prompt = fmt.Sprintf("Drain %s?\nIt stops taking new requests now; nothing is in flight.", describe(t))
		if n > 0 {
			prompt = fmt.Sprintf("Drain %s?\nIt stops taking new requests now. %s finish first;\nafter %s any still running are cancelled.",
				describe(t), inFlightPhrase(n), shortDuration(timeout))
		}
	case fleet.ActionRestart:
		prompt = fmt.Sprintf("Restart %s?\nIt drains (%s, timeout %s), stops,\nthen launches again with the same recipe.",
			describe(t), inFlightCount(n), shortDuration(timeout))
	}
	m.confirm = &pendingAction{action: Action{Kind: kind, Targets: t}, prompt: prompt}
	m.overlay = overlayConfirm
	return nil
}

// inFlightPhrase starts a sentence about n > 0 requests in flight.
func inFlightPhrase(n int) string {
	if n == 1 {
		return "1 request in flight will"
	}
	return fmt.Sprintf("%d requests in flight will", n)
}

// inFlightCount is the in-flight figure as a noun phrase, for inside a
// sentence: "nothing in flight", "1 request in flight".
func inFlightCount(n int) string {
	switch n {
	case 0:
		return "nothing in flight"
	case 1:
		return "1 request in flight"
	}
	return fmt.Sprintf("%d requests in flight", n)
}

// closeConfirm goes back to what the confirmation was asked from.
func (m *Model) closeConfirm() {
	m.confirm = nil
	m.overlay = overlayNone
	if m.detail.worker != "" {
		m.overlay = overlayDetail
	}
}

func (m *Model) confirmKey(k tea.KeyPressMsg) tea.Cmd {
	if m.confirm.split {
		split := ""
		switch {
		case key.Matches(k, m.keys.splitChat.Binding):
			split = SplitChat
		case key.Matches(k, m.keys.splitAgent.Binding):
			split = SplitAgent
		case key.Matches(k, m.keys.confirmNo.Binding):
			m.closeConfirm()
			m.setFlash(flashInfo, "bench cancelled")
			return nil
		default:
			return nil
		}
		a := m.confirm.action
		a.Split = split
		m.closeConfirm()
		clear(m.workers.marks)
		return m.do(a)
	}
	switch {
	case key.Matches(k, m.keys.confirmYes.Binding):
		p := m.confirm
		m.closeConfirm()
		clear(m.workers.marks)
		return m.do(p.action)
	case key.Matches(k, m.keys.confirmNo.Binding):
		kind := m.confirm.action.Kind
		m.closeConfirm()
		m.setFlash(flashInfo, string(kind)+" cancelled")
	}
	return nil
}

// maxFilterRunes caps a view's filter, the console's only text input: it
// is matched against every row and drawn in every frame, and without a cap
// a pasted flood (10,000 characters took 7.7 s of a core) slowed the hub
// for everyone. Nothing worth finding takes more.
const maxFilterRunes = 128

func (m *Model) filterKey(k tea.KeyPressMsg) tea.Cmd {
	v := m.views[m.view]
	l := v.state()
	switch {
	case key.Matches(k, m.keys.filterKeep.Binding):
		m.filtering = false
	case key.Matches(k, m.keys.filterClear.Binding):
		m.filtering = false
		l.filter = ""
	case key.Matches(k, m.keys.filterBack.Binding):
		if r := []rune(l.filter); len(r) > 0 {
			l.filter = string(r[:len(r)-1])
		}
	case key.Matches(k, m.keys.filterErase.Binding):
		l.filter = ""
	default:
		room := maxFilterRunes - utf8.RuneCountInString(l.filter)
		if k.Text == "" || room <= 0 {
			// A full filter ignores what is typed at no cost: no refilter,
			// no layout, no new frame (the prompt line says it is full).
			m.ignoredKey = true
			return nil
		}
		text := k.Text
		if utf8.RuneCountInString(text) > room {
			text = string([]rune(text)[:room])
		}
		l.filter += text
	}
	v.refilter()
	l.cursor, l.offset = 0, 0
	m.clampAll()
	return nil
}

func shortDuration(d time.Duration) string {
	switch {
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%d min", int(d/time.Minute))
	case d >= time.Second:
		return d.Round(time.Second).String()
	}
	return d.String()
}

// benchOf is a worker's latest sweep of the split and when it ran.
func benchOf(w fleet.WorkerView, split string) ([]fleet.BenchPoint, time.Time) {
	if split == SplitAgent {
		return w.AgentBench, w.AgentBenchAt
	}
	return w.Bench, w.BenchAt
}

// benchWord names a bench by its split in the status line.
func benchWord(split string) string {
	if split == SplitAgent {
		return "agent bench"
	}
	return "bench"
}
