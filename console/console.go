// Package console is the Bubble Tea UI of fleet: the live worker table, the
// nodes, models and events views, the worker detail, and the drain, undrain,
// restart, shape and bench actions. It knows nothing of SQL or SSH: it reads
// snapshots from a Source and hands actions back to it.
package console

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"fleet"
	"fleet/themes"
)

// Action kinds the console sends to its Source.
const (
	ActionDrain   = "drain"
	ActionUndrain = "undrain"
	ActionRestart = "restart"
	ActionShape   = "shape"
	ActionBench   = "bench"
)

// Action is something an operator asked for. Targets are worker names
// (NODE/MODEL). The Source enforces roles and writes the audit line; the
// console only refuses early so a viewer learns why without a round trip.
type Action struct {
	Kind    string
	Targets []string
}

// Source is what the console needs from the hub.
type Source interface {
	Snapshot() fleet.Snapshot
	// Do performs an action and returns a message to show the operator.
	Do(ctx context.Context, a Action) (string, error)
	WorkerLog(ctx context.Context, worker string, lines int) ([]string, error)
	// Refused tells the hub the user pressed a key for an action their role
	// does not allow (fleet.ActionRole), so it is audited like a refused
	// exec; the console shows why and does nothing.
	Refused(kind string, targets []string)
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
	viewCount
)

func (v viewKind) String() string {
	return [...]string{"workers", "nodes", "models", "events"}[v]
}

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

// pendingAction is an action waiting for y/n.
type pendingAction struct {
	action Action
	prompt string
}

// tracker follows a drain, restart or bench until the snapshot shows it
// finished.
type tracker struct {
	kind  string
	since time.Time
	// benchAt is the worker's BenchAt when the bench was asked for: the hub
	// answers at once and the sweep lands later, so a new BenchAt is the
	// sign it finished (the sweep's own start time may precede since).
	benchAt time.Time
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

// Model is the console's state. It is a tea.Model; use New.
type Model struct {
	src    Source
	opts   Options
	log    *slog.Logger
	theme  themes.Theme
	paints paints
	// themeFixed is set when the operator chose a theme, so the terminal's
	// background colour does not override it.
	themeFixed bool

	width, height int

	snap   fleet.Snapshot
	loaded bool
	// workerIdx is the filtered view of snap.Workers, in snapshot order.
	workerIdx []int
	nodeIdx   []int
	modelIdx  []int
	events    []fleet.Event // snapshot events plus the audit trail
	eventIdx  []int         // into events, newest first
	haystack  []string
	layout    workerLayout

	view      viewKind
	cursor    [viewCount]int
	offset    [viewCount]int
	filter    [viewCount]string
	filtering bool

	marks map[string]bool

	overlay      overlayKind
	detail       string // worker name shown in the detail
	detailLog    []string
	detailLogErr error
	detailOffset int // lines scrolled past the detail's pinned first line
	logAt        time.Time
	logBusy      bool
	confirm      *pendingAction
	textTitle    string
	text         []string
	textOffset   int
	helpOffset   int
	flash        string
	flashLevel   flashLevel
	busy         int
	tracking     map[string]tracker
	quitting     bool
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
	m := &Model{
		src:      src,
		opts:     opts,
		log:      logger,
		width:    opts.Width,
		height:   opts.Height,
		marks:    map[string]bool{},
		tracking: map[string]tracker{},
	}
	if opts.Theme.Name != "" {
		m.theme, m.themeFixed = opts.Theme, true
	} else {
		m.theme = themes.ForBackground(true)
	}
	m.paints = newPaints(m.theme)
	if m.width <= 0 {
		m.width = 80
	}
	if m.height <= 0 {
		m.height = 24
	}
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
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = max(msg.Width, 20), max(msg.Height, 6)
		m.relayout()
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
		if c := m.maybeFetchLog(false); c != nil {
			cmds = append(cmds, c)
		}
		return m, tea.Batch(cmds...)
	case actionMsg:
		m.busy--
		return m, m.actionDone(msg)
	case logMsg:
		m.logBusy = false
		if msg.worker == m.detail {
			m.detailLog, m.detailLogErr = msg.lines, msg.err
		}
		return m, nil
	case tea.KeyPressMsg:
		return m, m.key(msg)
	}
	return m, nil
}

// apply takes a new snapshot: recomputes filters and layout, keeps the cursor
// on the same worker when rows move, and advances drain/restart trackers.
func (m *Model) apply(s fleet.Snapshot) {
	var cursorName string
	if w, ok := m.cursorWorker(); ok {
		cursorName = w.Name()
	}
	m.snap = s
	m.loaded = true
	m.haystack = m.haystack[:0]
	for _, w := range s.Workers {
		m.haystack = append(m.haystack, strings.ToLower(strings.Join([]string{
			w.Name(), w.GPU, w.Host, w.Engine.Label(), string(w.State), strings.Join(w.Argv, " "),
		}, " ")))
	}
	// The events view shows the audit trail interleaved with the events, so
	// "who drained ultra" sits next to "ultra drained".
	m.events = append(m.events[:0], s.Events...)
	for _, a := range s.Audit {
		m.events = append(m.events, fleet.Event{
			ID: a.ID, At: a.At, Level: "audit", Subject: a.Target,
			Message: fmt.Sprintf("%s by %s: %s", a.Action, a.User, a.Outcome),
		})
	}
	m.eventIdx = m.eventIdx[:0]
	for i := range m.events {
		m.eventIdx = append(m.eventIdx, i)
	}
	sort.SliceStable(m.eventIdx, func(a, b int) bool {
		return m.events[m.eventIdx[a]].At.After(m.events[m.eventIdx[b]].At)
	})
	m.refilter()
	if cursorName != "" {
		for pos, i := range m.workerIdx {
			if m.snap.Workers[i].Name() == cursorName {
				m.cursor[viewWorkers] = pos
				break
			}
		}
	}
	m.clampAll()
	m.track()
}

func (m *Model) refilter() {
	f := strings.ToLower(m.filter[viewWorkers])
	m.workerIdx = m.workerIdx[:0]
	for i := range m.snap.Workers {
		if f == "" || strings.Contains(m.haystack[i], f) {
			m.workerIdx = append(m.workerIdx, i)
		}
	}
	f = strings.ToLower(m.filter[viewNodes])
	m.nodeIdx = m.nodeIdx[:0]
	for i, n := range m.snap.Nodes {
		if f == "" || strings.Contains(strings.ToLower(nodeHaystack(n)), f) {
			m.nodeIdx = append(m.nodeIdx, i)
		}
	}
	f = strings.ToLower(m.filter[viewModels])
	m.modelIdx = m.modelIdx[:0]
	for i, md := range m.snap.Models {
		if f == "" || strings.Contains(strings.ToLower(modelHaystack(md)), f) {
			m.modelIdx = append(m.modelIdx, i)
		}
	}
	if f = strings.ToLower(m.filter[viewEvents]); f != "" {
		kept := m.eventIdx[:0]
		for _, i := range m.eventIdx {
			e := m.events[i]
			if strings.Contains(strings.ToLower(e.Level+" "+e.Subject+" "+e.Message), f) {
				kept = append(kept, i)
			}
		}
		m.eventIdx = kept
	}
	m.relayout()
}

func nodeHaystack(n fleet.Node) string {
	s := n.Name + " " + n.Address + " " + string(n.State) + " " + n.Reason
	if n.Platform != nil {
		s += " " + n.Platform.HostLabel() + " " + n.Platform.GPULabel()
	}
	return s
}

func modelHaystack(md fleet.Model) string {
	parts := append([]string{md.ID}, md.Aliases...)
	for k, r := range md.Recipes {
		parts = append(parts, string(k), r.Model, r.Profile)
	}
	return strings.Join(parts, " ")
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
		case ActionDrain:
			if w.InFlight == 0 && (w.State != fleet.WorkerReady || w.Drained) {
				delete(m.tracking, name)
				m.setFlash(flashOK, fmt.Sprintf("%s drained: no requests in flight, it takes no new ones (u undrains)", name))
			}
		case ActionRestart:
			switch {
			case w.State == fleet.WorkerReady && w.StartedAt.After(t.since):
				delete(m.tracking, name)
				m.setFlash(flashOK, fmt.Sprintf("%s restarted: ready, PID %d, started with %s", name, w.PID, strings.Join(w.Argv, " ")))
			case w.State == fleet.WorkerFailed || w.State == fleet.WorkerRejected:
				delete(m.tracking, name)
				m.setFlash(flashErr, fmt.Sprintf("%s restart ended %s: %s", name, w.State, w.Reason))
			}
		case ActionBench:
			if len(w.Bench) > 0 && !w.BenchAt.Equal(t.benchAt) {
				delete(m.tracking, name)
				where := " (enter on it shows the chart)"
				if m.overlay == overlayDetail && m.detail == name {
					where = ""
				}
				m.setFlash(flashOK, fmt.Sprintf("bench of %s done: %s%s", name, benchSummary(w.Bench), where))
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

func (m *Model) workerByName(name string) (fleet.WorkerView, bool) {
	for _, w := range m.snap.Workers {
		if w.Name() == name {
			return w, true
		}
	}
	return fleet.WorkerView{}, false
}

func (m *Model) cursorWorker() (fleet.WorkerView, bool) {
	c := m.cursor[viewWorkers]
	if c < 0 || c >= len(m.workerIdx) {
		return fleet.WorkerView{}, false
	}
	return m.snap.Workers[m.workerIdx[c]], true
}

func (m *Model) rowCount(v viewKind) int {
	switch v {
	case viewWorkers:
		return len(m.workerIdx)
	case viewNodes:
		return len(m.nodeIdx)
	case viewModels:
		return len(m.modelIdx)
	}
	return len(m.eventIdx)
}

// bodyHeight is the rows between the title bar and the two bottom lines.
func (m *Model) bodyHeight() int { return max(m.height-3, 1) }

// pageRows is how many data rows a table view shows (one goes to the header).
func (m *Model) pageRows() int { return max(m.bodyHeight()-1, 1) }

func (m *Model) clampAll() {
	for v := viewKind(0); v < viewCount; v++ {
		n := m.rowCount(v)
		m.cursor[v] = max(0, min(m.cursor[v], n-1))
		page := m.pageRows()
		if v == viewModels {
			page = 1 // models scroll by model block; see renderModels
		}
		if m.cursor[v] < m.offset[v] {
			m.offset[v] = m.cursor[v]
		}
		if m.cursor[v] >= m.offset[v]+page {
			m.offset[v] = m.cursor[v] - page + 1
		}
		m.offset[v] = max(0, min(m.offset[v], max(n-page, 0)))
		if m.cursor[v] < m.offset[v] {
			m.offset[v] = m.cursor[v]
		}
	}
}

func (m *Model) setFlash(level flashLevel, text string) {
	m.flash, m.flashLevel = text, level
}

// targets are the marked workers, or the one under the cursor.
func (m *Model) targets() []string {
	if m.overlay == overlayDetail && m.detail != "" {
		return []string{m.detail}
	}
	if len(m.marks) > 0 {
		var out []string
		for _, w := range m.snap.Workers {
			if m.marks[w.Name()] {
				out = append(out, w.Name())
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	if m.view == viewNodes && m.cursor[viewNodes] < len(m.nodeIdx) {
		node := m.snap.Nodes[m.nodeIdx[m.cursor[viewNodes]]].Name
		var out []string
		for _, w := range m.snap.Workers {
			if w.Node == node {
				out = append(out, w.Name())
			}
		}
		return out
	}
	if w, ok := m.cursorWorker(); ok {
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
	case ActionBench:
		// The hub starts the sweep and answers at once; the figures land in
		// the snapshot when it is done, and the detail's chart follows.
		for _, t := range a.Targets {
			w, _ := m.workerByName(t)
			m.tracking[t] = tracker{kind: a.Kind, since: msg.sent, benchAt: w.BenchAt}
		}
		reply := strings.TrimSpace(msg.text)
		m.setFlash(flashOK, nonEmpty(firstLine(reply), fmt.Sprintf("bench %s started", describe(a.Targets))))
		if strings.Contains(reply, "\n") {
			// A source that answers with the whole table gets it shown.
			m.showText(fmt.Sprintf("bench %s", strings.Join(a.Targets, ", ")), reply)
		}
		m.track()
	case ActionShape:
		m.overlay = overlayText
		m.textTitle = fmt.Sprintf("%s %s", a.Kind, strings.Join(a.Targets, " vs "))
		m.text = strings.Split(strings.TrimRight(msg.text, "\n"), "\n")
		m.textOffset = 0
		m.setFlash(flashOK, fmt.Sprintf("%s done (esc closes)", a.Kind))
	case ActionDrain, ActionRestart:
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
	m.textTitle = title
	m.text = strings.Split(strings.TrimRight(text, "\n"), "\n")
	m.textOffset = 0
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

func (m *Model) maybeFetchLog(force bool) tea.Cmd {
	if m.overlay != overlayDetail || m.detail == "" || m.logBusy {
		return nil
	}
	now := m.opts.Now()
	if !force && now.Sub(m.logAt) < logRefreshEvery {
		return nil
	}
	m.logBusy, m.logAt = true, now
	src, parent, worker := m.src, m.opts.Context, m.detail
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(parent, logHangGuard)
		defer cancel()
		lines, err := src.WorkerLog(ctx, worker, logLines)
		return logMsg{worker: worker, lines: lines, err: err}
	}
}

// needs refuses a key the user's role does not allow, saying why; the hub
// audits the refusal.
func (m *Model) needs(kind string, targets []string) bool {
	role := fleet.ActionRole(kind)
	if m.opts.User.Role.Allows(role) {
		return true
	}
	m.src.Refused(kind, targets)
	have := string(m.opts.User.Role)
	if have == "" {
		have = "no role"
	}
	m.setFlash(flashWarn, fmt.Sprintf("%s needs the %s role; you are %s", kind, role, have))
	return false
}

func (m *Model) key(k tea.KeyPressMsg) tea.Cmd {
	s := k.String()
	if s == "ctrl+c" {
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
		return m.confirmKey(s)
	case overlayHelp:
		switch s {
		case "esc", "q", "?", "enter":
			m.overlay = overlayNone
		case "down", "j":
			m.helpOffset++
		case "up", "k":
			m.helpOffset = max(0, m.helpOffset-1)
		}
		return nil
	case overlayText:
		switch s {
		case "esc", "q", "enter":
			m.overlay = overlayNone
		case "down", "j":
			m.textOffset = min(m.textOffset+1, max(len(m.text)-1, 0))
		case "up", "k":
			m.textOffset = max(0, m.textOffset-1)
		case "pgdown":
			m.textOffset = min(m.textOffset+m.bodyHeight(), max(len(m.text)-1, 0))
		case "pgup":
			m.textOffset = max(0, m.textOffset-m.bodyHeight())
		}
		return nil
	case overlayDetail:
		switch s {
		case "esc", "q", "enter":
			m.overlay, m.detail = overlayNone, ""
			return nil
		case "down", "j", "up", "k", "pgdown", "pgup", "home", "g", "end", "G":
			m.scrollDetail(s)
			return nil
		case "d", "u", "r", "b", "?":
			return m.mainKey(s)
		}
		return nil
	}
	return m.mainKey(s)
}

func (m *Model) mainKey(s string) tea.Cmd {
	v := m.view
	switch s {
	case "q":
		m.quitting = true
		return tea.Quit
	case "?":
		m.overlay, m.helpOffset = overlayHelp, 0
	case "tab":
		m.view = (m.view + 1) % viewCount
	case "shift+tab":
		m.view = (m.view + viewCount - 1) % viewCount
	case "up", "k":
		m.cursor[v]--
	case "down", "j":
		m.cursor[v]++
	case "pgup":
		m.cursor[v] -= m.pageRows()
	case "pgdown":
		m.cursor[v] += m.pageRows()
	case "home", "g":
		m.cursor[v] = 0
	case "end", "G":
		m.cursor[v] = m.rowCount(v) - 1
	case "/":
		m.filtering = true
	case "esc":
		switch {
		case m.filter[v] != "":
			m.filter[v] = ""
			m.refilter()
		case len(m.marks) > 0:
			clear(m.marks)
			m.setFlash(flashInfo, "marks cleared")
		}
	case "enter":
		if v == viewEvents {
			if c := m.cursor[v]; c < len(m.eventIdx) {
				e := m.events[m.eventIdx[c]]
				m.showText(fmt.Sprintf("%s %s %s", e.At.Format("2006-01-02 15:04:05"), e.Level, e.Subject), e.Message)
			}
			return nil
		}
		if v != viewWorkers {
			return nil
		}
		if w, ok := m.cursorWorker(); ok {
			m.overlay, m.detail = overlayDetail, w.Name()
			m.detailLog, m.detailLogErr, m.detailOffset = nil, nil, 0
			return m.maybeFetchLog(true)
		}
	case "space":
		if v != viewWorkers {
			return nil
		}
		if w, ok := m.cursorWorker(); ok {
			if m.marks[w.Name()] {
				delete(m.marks, w.Name())
			} else {
				m.marks[w.Name()] = true
			}
			m.cursor[v]++
		}
	case "d", "r":
		kind := map[string]string{"d": ActionDrain, "r": ActionRestart}[s]
		if !m.needs(kind, m.targets()) {
			return nil
		}
		return m.ask(kind)
	case "u":
		if !m.needs(ActionUndrain, m.targets()) {
			return nil
		}
		t := m.targets()
		if len(t) == 0 {
			m.setFlash(flashWarn, "no worker to undrain here")
			return nil
		}
		return m.do(Action{Kind: ActionUndrain, Targets: t})
	case "b":
		if !m.needs(ActionBench, m.targets()) {
			return nil
		}
		t := m.targets()
		if len(t) == 0 {
			m.setFlash(flashWarn, "no worker to bench here")
			return nil
		}
		return m.do(Action{Kind: ActionBench, Targets: t})
	case "s":
		var t []string
		for _, w := range m.snap.Workers {
			if m.marks[w.Name()] {
				t = append(t, w.Name())
			}
		}
		if !m.needs(ActionShape, t) {
			return nil
		}
		if len(t) != 2 {
			m.setFlash(flashWarn, fmt.Sprintf("shape compares two workers: mark exactly two with space (%d marked)", len(t)))
			return nil
		}
		return m.do(Action{Kind: ActionShape, Targets: t})
	}
	m.clampAll()
	return nil
}

// scrollDetail moves the detail's view; the bound is taken from the lines
// the detail has now, since a log or bench arriving changes its length.
func (m *Model) scrollDetail(key string) {
	limit := m.detailMaxOffset(len(m.detailLines()))
	page := max(m.bodyHeight()-1, 1)
	switch key {
	case "down", "j":
		m.detailOffset++
	case "up", "k":
		m.detailOffset--
	case "pgdown":
		m.detailOffset += page
	case "pgup":
		m.detailOffset -= page
	case "home", "g":
		m.detailOffset = 0
	case "end", "G":
		m.detailOffset = limit
	}
	m.detailOffset = max(0, min(m.detailOffset, limit))
}

// ask opens the confirmation for a drain or restart, naming what will happen.
func (m *Model) ask(kind string) tea.Cmd {
	t := m.targets()
	if len(t) == 0 {
		m.setFlash(flashWarn, fmt.Sprintf("no worker to %s here", kind))
		return nil
	}
	n := m.inFlight(t)
	timeout := m.opts.DrainTimeout
	var prompt string
	switch kind {
	case ActionDrain:
		prompt = fmt.Sprintf("Drain %s?\nIt stops taking new requests now; nothing is in flight.", describe(t))
		if n > 0 {
			prompt = fmt.Sprintf("Drain %s?\nIt stops taking new requests now. %s finish first;\nafter %s any still running are cancelled.",
				describe(t), inFlightPhrase(n), shortDuration(timeout))
		}
	case ActionRestart:
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

func (m *Model) confirmKey(s string) tea.Cmd {
	switch s {
	case "y", "Y":
		p := m.confirm
		m.confirm = nil
		m.overlay = overlayNone
		if m.detail != "" {
			m.overlay = overlayDetail
		}
		clear(m.marks)
		return m.do(p.action)
	case "n", "N", "esc", "q":
		kind := m.confirm.action.Kind
		m.confirm = nil
		m.overlay = overlayNone
		if m.detail != "" {
			m.overlay = overlayDetail
		}
		m.setFlash(flashInfo, kind+" cancelled")
	}
	return nil
}

func (m *Model) filterKey(k tea.KeyPressMsg) tea.Cmd {
	v := m.view
	switch k.String() {
	case "enter":
		m.filtering = false
	case "esc":
		m.filtering = false
		m.filter[v] = ""
	case "backspace":
		if r := []rune(m.filter[v]); len(r) > 0 {
			m.filter[v] = string(r[:len(r)-1])
		}
	case "ctrl+u":
		m.filter[v] = ""
	default:
		if k.Text == "" {
			return nil
		}
		m.filter[v] += k.Text
	}
	m.refilter()
	m.cursor[v] = 0
	m.offset[v] = 0
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

// Marked reports the names of marked workers (for tests and the SSH layer).
func (m *Model) Marked() []string {
	out := make([]string, 0, len(m.marks))
	for n := range m.marks {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
