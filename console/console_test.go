package console_test

import (
	"errors"
	"fmt"
	"image/color"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/columns"
	"fleet/console"
	"fleet/console/consoletest"
	"fleet/themes"
)

var (
	operator = fleet.User{Name: "olga", Role: fleet.RoleOperator}
	viewer   = fleet.User{Name: "vic", Role: fleet.RoleViewer}
)

func press(s string) tea.KeyPressMsg {
	switch s {
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "space":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	}
	r := []rune(s)
	return tea.KeyPressMsg{Code: r[0], Text: s}
}

// harness drives a model synchronously: every command it returns is run and
// its message fed back, except the refresh tick, which would loop forever.
type harness struct {
	t *testing.T
	m tea.Model
}

func newHarness(t *testing.T, src console.Source, u fleet.User, w, h int) *harness {
	t.Helper()
	now := time.Date(2026, 1, 2, 15, 10, 0, 0, time.UTC)
	m := console.New(src, console.Options{User: u, Width: w, Height: h, Refresh: time.Millisecond,
		Theme: themes.Dark(), Now: func() time.Time { return now }})
	hs := &harness{t: t, m: m}
	hs.run(m.Init())
	return hs
}

func (h *harness) run(cmd tea.Cmd) {
	if cmd == nil {
		return
	}
	msg := cmd()
	switch msg := msg.(type) {
	case tea.BatchMsg:
		for _, c := range msg {
			h.run(c)
		}
	case nil:
	default:
		if fmt.Sprintf("%T", msg) == "console.tickMsg" {
			return
		}
		if _, ok := msg.(tea.QuitMsg); ok {
			return
		}
		h.send(msg)
	}
}

func (h *harness) send(msg tea.Msg) {
	m, cmd := h.m.Update(msg)
	h.m = m
	h.run(cmd)
}

func (h *harness) keys(ks ...string) {
	for _, k := range ks {
		h.send(press(k))
	}
}

func (h *harness) screen() string { return ansi.Strip(h.m.View().Content) }

func (h *harness) refresh() { h.run(func() tea.Msg { return tickMsgFor(h) }) }

// tickMsgFor re-reads the snapshot the way the tick does, through Init's
// first command (a snapshot fetch is always first).
func tickMsgFor(h *harness) tea.Msg {
	cmd := h.m.Init()
	msg := cmd()
	if b, ok := msg.(tea.BatchMsg); ok {
		return b[0]()
	}
	return msg
}

func mustContain(t *testing.T, screen string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(screen, w) {
			t.Fatalf("screen lacks %q:\n%s", w, screen)
		}
	}
}

func mustNotContain(t *testing.T, screen string, nots ...string) {
	t.Helper()
	for _, w := range nots {
		if strings.Contains(screen, w) {
			t.Fatalf("screen has %q but should not:\n%s", w, screen)
		}
	}
}

func TestWorkerTableShowsDesignColumns(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), operator, 160, 30)
	s := h.screen()
	mustContain(t, s, "Node", "GPU", "Host", "Engine", "Ctx", "State", "Load", "tok/s", "TTFT", "ITL", "Started with",
		"rig", "8x RTX 3060", "Linux", "vLLM", "ultra", "Apple M1 Ultra", "macOS", "llama.cpp", "max", "Apple M4 Max",
		"16k", "ready", "3/4", "vllm serve Qwen/Qwen3-4B-AWQ", "llama-server -hf")
	lines := strings.Split(s, "\n")
	if len(lines) != 30 {
		t.Fatalf("screen has %d lines, want 30", len(lines))
	}
	for i, l := range lines {
		if w := ansi.StringWidth(l); w > 160 {
			t.Fatalf("line %d is %d cells wide, more than the 160 of the window: %q", i, w, l)
		}
	}
}

func TestViewsCycleWithTab(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 140, 30)
	tests := []struct {
		want []string
	}{
		{[]string{"[nodes]", "Address", "ops@rig.lan:22", "sim:m4max-llamacpp", "GiB", "up"}},
		{[]string{"[models]", "qwen3-4b (qwen3)", "ctx 16k", "vLLM", "Qwen/Qwen3-4B-AWQ --tensor-parallel-size 1", "llama.cpp", "Qwen/Qwen3-4B-GGUF:Q4_K_M -ngl 99", "profile m4max-llamacpp"}},
		{[]string{"[events]", "probe slow: 1.2s", "ready after 4.1s", "launched llama-server", "audit", "drain by vic: denied: drain needs the operator role"}},
		{[]string{"[usage]", "Last 24 h", "Requests", "Cached", "rig/qwen3-4b", "412", "1.23M", "987.7k  80%", "45.7k", "max/qwen3-4b", "800", "key ci"}},
		{[]string{"[workers]", "Started with"}},
	}
	for i, tt := range tests {
		h.keys("tab")
		mustContain(t, h.screen(), tt.want...)
		_ = i
	}
	// Events are newest first.
	h.keys("tab", "tab", "tab")
	mustContain(t, h.screen(), "[events]")
	s := h.screen()
	if strings.Index(s, "probe slow") > strings.Index(s, "launched llama-server") {
		t.Fatalf("events are not newest first:\n%s", s)
	}
}

func TestFilter(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 140, 30)
	h.keys("/", "u", "l", "t")
	s := h.screen()
	mustContain(t, s, "ultra", "/ult")
	mustNotContain(t, s, "8x RTX 3060", "Apple M4 Max")
	h.keys("enter")
	mustContain(t, h.screen(), `matching "ult"`)
	// The filter survives a refresh.
	h.refresh()
	mustNotContain(t, h.screen(), "8x RTX 3060")
	h.keys("esc")
	mustContain(t, h.screen(), "8x RTX 3060", "Apple M4 Max", "Apple M1 Ultra")
	// No match says so.
	h.keys("/", "z", "z", "enter")
	mustContain(t, h.screen(), `no worker matches "zz"`)
	h.keys("/", "backspace", "backspace", "enter")
	mustContain(t, h.screen(), "8x RTX 3060")
}

func TestHelpListsEveryKey(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 140, 30)
	h.keys("?")
	s := h.screen()
	for _, k := range []string{"enter", "tab", "/", "space", "d ", "u ", "r ", "s ", "b ", "?", "q / ctrl+c", "esc"} {
		mustContain(t, s, k)
	}
	mustContain(t, s, "drain: no new requests", "restart: drain, stop, launch", "[operator] not for you")
	h.keys("esc")
	mustContain(t, h.screen(), "Started with")
}

func TestViewerDangerousKeysSayWhy(t *testing.T) {
	tests := []struct {
		key  string
		want string
	}{
		{"d", "drain needs the operator role; you are viewer"},
		{"r", "restart needs the operator role; you are viewer"},
		{"u", "undrain needs the operator role; you are viewer"},
		{"b", "bench needs the operator role; you are viewer"},
		{"s", "shape needs the operator role; you are viewer"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			src := consoletest.Demo()
			h := newHarness(t, src, viewer, 160, 30)
			h.keys(tt.key)
			s := h.screen()
			mustContain(t, s, tt.want)
			mustNotContain(t, s, "y yes")
			h.keys("y")
			if a := src.Actions(); len(a) != 0 {
				t.Fatalf("a viewer's %q reached the hub: %+v", tt.key, a)
			}
			// The refusal is reported, for the hub to audit it like a refused exec.
			if r := src.RefusedActions(); len(r) != 1 || !strings.HasPrefix(tt.want, string(r[0].Kind)+" ") {
				t.Fatalf("refusals reported after a viewer's %q = %+v, want one", tt.key, r)
			}
		})
	}
}

// The confirmations read as sentences whatever is in flight.
func TestConfirmationWording(t *testing.T) {
	tests := []struct {
		key      string
		inFlight int
		want     string
	}{
		{"r", 0, "It drains (nothing in flight, timeout 5 min), stops,"},
		{"r", 1, "It drains (1 request in flight, timeout 5 min), stops,"},
		{"r", 3, "It drains (3 requests in flight, timeout 5 min), stops,"},
		{"d", 0, "It stops taking new requests now; nothing is in flight."},
		{"d", 3, "3 requests in flight will finish first"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.key, tt.inFlight), func(t *testing.T) {
			src := consoletest.Demo()
			src.SetInFlight("rig/qwen3-4b", tt.inFlight)
			h := newHarness(t, src, operator, 160, 30)
			h.keys(tt.key)
			s := h.screen()
			mustContain(t, s, tt.want)
			mustNotContain(t, s, "in flight to", "in flight will,")
		})
	}
}

func TestOperatorDrainConfirmsAndShowsProgress(t *testing.T) {
	src := consoletest.Demo()
	h := newHarness(t, src, operator, 160, 30)
	h.keys("down") // ultra, with 3 requests in flight
	h.keys("d")
	s := h.screen()
	mustContain(t, s, "Drain ultra/qwen3-4b?", "3 requests in flight will finish first", "after 5 min", "y yes", "n no")
	if len(src.Actions()) != 0 {
		t.Fatal("drain ran before it was confirmed")
	}
	h.keys("y")
	acts := src.Actions()
	if len(acts) != 1 || acts[0].Kind != fleet.ActionDrain || len(acts[0].Targets) != 1 || acts[0].Targets[0] != "ultra/qwen3-4b" {
		t.Fatalf("actions = %+v, want one drain of ultra/qwen3-4b", acts)
	}
	h.refresh()
	mustContain(t, h.screen(), "draining ultra/qwen3-4b: 3 in flight", "draining")
	src.SetInFlight("ultra/qwen3-4b", 0)
	h.refresh()
	s = h.screen()
	mustContain(t, s, "ultra/qwen3-4b drained: no requests in flight")
	mustNotContain(t, s, "draining ultra/qwen3-4b:")
}

// screenRow is the first line of screen containing substr.
func screenRow(screen, substr string) string {
	for _, l := range strings.Split(screen, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}

// The table says what the drain did: a worker drained on probation says
// so (its state alone said nothing had happened), and a drained worker
// with nothing in flight is "drained", as its event says, not "draining".
func TestDrainShowsInTheTable(t *testing.T) {
	src := consoletest.Demo()
	src.SetState("max/qwen3-4b", fleet.WorkerProbation)
	h := newHarness(t, src, operator, 160, 30)
	h.keys("down", "down") // max
	h.keys("d", "y")
	h.refresh()
	if row := screenRow(h.screen(), "Apple M4 Max"); !strings.Contains(row, "probation, drained") {
		t.Fatalf("max drained on probation: its row is %q", row)
	}
	h.keys("up") // ultra, with 3 requests in flight
	h.keys("d", "y")
	h.refresh()
	if row := screenRow(h.screen(), "Apple M1 Ultra"); !strings.Contains(row, " draining ") {
		t.Fatalf("ultra drained with 3 in flight: its row is %q", row)
	}
	src.SetInFlight("ultra/qwen3-4b", 0)
	h.refresh()
	if row := screenRow(h.screen(), "Apple M1 Ultra"); !strings.Contains(row, " drained ") || strings.Contains(row, "draining") {
		t.Fatalf("ultra drained with nothing in flight: its row is %q", row)
	}
}

func TestConfirmNoCancels(t *testing.T) {
	src := consoletest.Demo()
	h := newHarness(t, src, operator, 160, 30)
	h.keys("r")
	mustContain(t, h.screen(), "Restart rig/qwen3-4b?", "then launches again")
	h.keys("x") // anything but y/n does nothing
	mustContain(t, h.screen(), "Restart rig/qwen3-4b?")
	h.keys("n")
	mustContain(t, h.screen(), "restart cancelled")
	if len(src.Actions()) != 0 {
		t.Fatalf("cancelled restart reached the hub: %+v", src.Actions())
	}
}

func TestMarksShapeAndUndrain(t *testing.T) {
	src := consoletest.Demo()
	src.Reply = "field           rig            ultra\nreasoning       inline <think> reasoning_content"
	h := newHarness(t, src, operator, 160, 30)
	h.keys("s")
	mustContain(t, h.screen(), "mark exactly two with space (0 marked)")
	h.keys("space", "space")
	mustContain(t, h.screen(), "2 marked")
	h.keys("s")
	s := h.screen()
	mustContain(t, s, "shape rig/qwen3-4b vs ultra/qwen3-4b", "reasoning       inline <think> reasoning_content")
	h.keys("esc")
	// Marks apply to u.
	h.keys("space", "u")
	acts := src.Actions()
	last := acts[len(acts)-1]
	if last.Kind != fleet.ActionUndrain || strings.Join(last.Targets, ",") != "rig/qwen3-4b,ultra/qwen3-4b,max/qwen3-4b" {
		t.Fatalf("last action = %+v, want undrain of the three marked workers", last)
	}
}

func TestActionErrorIsShown(t *testing.T) {
	src := consoletest.Demo()
	src.Err = errors.New("drain needs the operator role; you are viewer")
	h := newHarness(t, src, operator, 160, 30)
	h.keys("d", "y")
	mustContain(t, h.screen(), "drain rig/qwen3-4b failed: drain needs the operator role")
}

func TestDetail(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 120, 50)
	h.keys("down", "down", "enter")
	s := h.screen()
	mustContain(t, s, "max/qwen3-4b", "PID 3003", "port 8003", "memory 3.0 GiB", "simulated yes", "cache hit 87%",
		"Started with:", "llama-server -hf Qwen/Qwen3-4B-GGUF:Q4_K_M", "Simulated; really runs:", "fleet sim --mimic llamacpp",
		"TTFT history", "ITL history", "Log (last lines):", "INFO loading model for max/qwen3-4b", "Recent events:", "probe slow")
	h.keys("esc")
	mustContain(t, h.screen(), "Started with")
}

func TestResizeReflows(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 160, 30)
	mustContain(t, h.screen(), "Started with")
	h.send(tea.WindowSizeMsg{Width: 90, Height: 12})
	s := h.screen()
	lines := strings.Split(s, "\n")
	if len(lines) != 12 {
		t.Fatalf("after resize the screen has %d lines, want 12", len(lines))
	}
	for i, l := range lines {
		if ansi.StringWidth(l) > 90 {
			t.Fatalf("line %d wider than 90 after resize: %q", i, l)
		}
	}
	mustContain(t, s, "ultra", "TTFT")
}

func TestScrollingKeepsCursorVisible(t *testing.T) {
	h := newHarness(t, consoletest.Many(1000), viewer, 160, 20)
	for i := 0; i < 40; i++ {
		h.keys("j")
	}
	s := h.screen()
	// Row 40 is gpu-010's model-0; the first rows have scrolled away.
	mustContain(t, s, "gpu-010 ")
	mustNotContain(t, s, "gpu-000 ")
	h.keys("G")
	mustContain(t, h.screen(), "gpu-249 ")
	h.keys("g")
	mustContain(t, h.screen(), "gpu-000 ")
}

func TestSparkAndChart(t *testing.T) {
	tests := []struct {
		name    string
		samples []float64
		width   int
		hi      float64
		want    string
	}{
		{"empty", nil, 4, 10, "    "},
		{"short history is padded left", []float64{0, 10}, 4, 10, "  ▁█"},
		{"keeps the newest", []float64{10, 0, 5, 10}, 3, 10, "▁▄█"},
		{"clamps above hi", []float64{50}, 1, 10, "█"},
		{"zero hi", []float64{1, 2}, 2, 0, "▁▁"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := console.Spark(tt.samples, tt.width, tt.hi); got != tt.want {
				t.Fatalf("Spark = %q, want %q", got, tt.want)
			}
		})
	}
	rows := console.Chart([]float64{0, 5, 10}, 3, 2, 10)
	if len(rows) != 2 || rows[0] != "  █" || rows[1] != " ██" {
		t.Fatalf("Chart rows = %q", rows)
	}
	if b := console.SparkBound([]float64{100, 200}, 50); b != 250 {
		t.Fatalf("SparkBound = %v, want 250", b)
	}
	if b := console.SparkBound(nil, 50); b != 50 {
		t.Fatalf("SparkBound floor = %v, want 50", b)
	}
}

// firstSnapshot runs the model's first command (the snapshot read) and feeds
// its message back, the way the program does.
func firstSnapshot(m tea.Model) tea.Model {
	msg := m.Init()()
	if b, ok := msg.(tea.BatchMsg); ok {
		msg = b[0]()
	}
	m, _ = m.Update(msg)
	return m
}

// BenchmarkRenderTable1000 measures one frame of the worker table with 1,000
// workers in a 200x50 window, the cursor mid-table: what every refresh and
// keystroke costs to draw.
func BenchmarkRenderTable1000(b *testing.B) {
	src := consoletest.Many(1000)
	m := firstSnapshot(console.New(src, console.Options{User: viewer, Width: 200, Height: 50, Theme: themes.Dark()}))
	for i := 0; i < 500; i++ {
		m, _ = m.Update(press("j"))
	}
	screen := ansi.Strip(m.View().Content)
	if got := strings.Count(screen, "gpu-"); got != 46 {
		b.Fatalf("frame shows %d worker rows, want 46:\n%s", got, screen)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = m.View()
	}
}

// BenchmarkRefresh1000 measures a live refresh with 1,000 workers: taking the
// new snapshot (filter, column layout, trackers) and drawing the frame after it.
func BenchmarkRefresh1000(b *testing.B) {
	src := consoletest.Many(1000)
	m := firstSnapshot(console.New(src, console.Options{User: viewer, Width: 200, Height: 50, Theme: themes.Dark()}))
	b.ReportAllocs()
	for b.Loop() {
		m = firstSnapshot(m)
		_ = m.View()
	}
}

// Without a chosen theme the console follows the client's background: the
// light palette's title colour (#005f87) appears only after a light reply.
func TestThemeFollowsBackground(t *testing.T) {
	src := consoletest.Demo()
	m := firstSnapshot(console.New(src, console.Options{User: viewer, Width: 120, Height: 20}))
	const lightTitle = "0;95;135"
	if strings.Contains(m.View().Content, lightTitle) {
		t.Fatal("dark default already uses the light title colour")
	}
	m, _ = m.Update(tea.BackgroundColorMsg{Color: color.White})
	if !strings.Contains(m.View().Content, lightTitle) {
		t.Fatal("a light background did not switch to the light theme")
	}
	// A chosen theme is kept whatever the terminal says.
	m = firstSnapshot(console.New(src, console.Options{User: viewer, Width: 120, Height: 20, Theme: themes.HighContrast()}))
	before := m.View().Content
	m, _ = m.Update(tea.BackgroundColorMsg{Color: color.White})
	if strings.Contains(m.View().Content, lightTitle) || !strings.Contains(before, "\x1b[") {
		t.Fatal("a chosen theme was overridden by the background colour")
	}
}

func TestBenchFollowsTheSweep(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 10, 0, 0, time.UTC) // the harness's clock
	tests := []struct {
		name   string
		land   func(src *consoletest.Source)
		status string
		screen []string
	}{
		{
			name: "result lands in the snapshot",
			land: func(src *consoletest.Source) {
				src.SetBench("ultra/qwen3-4b", consoletest.DemoBench(), at)
			},
			status: "bench of ultra/qwen3-4b done: 87 / 130 / 136 tok/s total at 1 / 2 / 4 concurrent, TTFT p50 95/118/162ms (enter on it shows the chart)",
		},
		{
			name: "hub reports a failure",
			land: func(src *consoletest.Source) {
				src.AddEvent(fleet.Event{At: at, Level: "error", Subject: "ultra/qwen3-4b", Message: "bench failed: ultra/qwen3-4b answered 503\nmore"})
			},
			status: "bench of ultra/qwen3-4b failed: bench failed: ultra/qwen3-4b answered 503",
		},
		{
			name: "the refusal's audit line ends it too",
			land: func(src *consoletest.Source) {
				src.AddEvent(fleet.Event{At: at, Level: "audit", Subject: "ultra/qwen3-4b", Message: "bench by olga: failed: no ready worker"})
			},
			status: "bench of ultra/qwen3-4b failed: bench by olga: failed: no ready worker",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := consoletest.Demo()
			h := newHarness(t, src, operator, 200, 30)
			h.keys("down", "b", "c")
			mustContain(t, h.screen(), "bench started on ultra/qwen3-4b; the table lands in its events")
			h.refresh()
			mustContain(t, h.screen(), "benching ultra/qwen3-4b: 0s so far")
			tt.land(src)
			h.refresh()
			s := h.screen()
			mustContain(t, s, tt.status)
			mustNotContain(t, s, "benching ultra")
		})
	}
}

// An old event from before the bench was asked for is not its failure.
func TestBenchIgnoresEarlierFailures(t *testing.T) {
	src := consoletest.Demo()
	src.AddEvent(fleet.Event{At: time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC), Level: "error", Subject: "ultra/qwen3-4b", Message: "bench failed: earlier"})
	h := newHarness(t, src, operator, 200, 30)
	h.keys("down", "b", "c")
	h.refresh()
	mustContain(t, h.screen(), "benching ultra/qwen3-4b")
}

// A source that answers b with the whole table (not the hub's "started")
// gets the table shown.
func TestBenchReplyWithTableIsShown(t *testing.T) {
	src := consoletest.Demo()
	src.Reply = "Bench of rig/qwen3-4b\n| 1 request tok/s | 2 concurrent total |\n| 96 | 180 |"
	h := newHarness(t, src, operator, 160, 30)
	h.keys("b", "c")
	mustContain(t, h.screen(), "bench rig/qwen3-4b", "| 96 | 180 |")
}

func TestDetailScrollsWithPinnedTitle(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 100, 16)
	h.keys("down", "down", "enter")
	s := h.screen()
	mustContain(t, s, "max/qwen3-4b", "PID 3003")
	mustNotContain(t, s, "Recent events:")
	h.keys("G")
	s = h.screen()
	mustContain(t, s, "max/qwen3-4b  ready", "Recent events:", "probe slow")
	mustNotContain(t, s, "PID 3003")
	h.keys("g")
	mustContain(t, h.screen(), "PID 3003")
	// Scrolling past the end stops at the end.
	for i := 0; i < 100; i++ {
		h.keys("j")
	}
	lines := strings.Split(h.screen(), "\n")
	if !strings.Contains(lines[len(lines)-3], "probe slow") {
		t.Fatalf("the last detail line is not at the bottom of the body:\n%s", strings.Join(lines, "\n"))
	}
}

// Eight levels do not fit side by side in 80 columns: the charts stack, and
// no line is wider than the terminal.
func TestBenchChartsStackWhenNarrow(t *testing.T) {
	src := consoletest.Demo()
	var pts []fleet.BenchPoint
	for i, c := range []int{1, 2, 4, 8, 16, 32, 64, 128} {
		pts = append(pts, fleet.BenchPoint{Concurrency: c, TotalTokPerSec: float64(90 + 40*i), PerRequestTokPerSec: 90 / float64(i+1), TTFTp50ms: float64(95 * (i + 1))})
	}
	src.SetBench("max/qwen3-4b", pts, time.Date(2026, 1, 2, 15, 9, 0, 0, time.UTC))
	h := newHarness(t, src, viewer, 80, 60)
	h.keys("down", "down", "enter")
	s := h.screen()
	mustContain(t, s, "bench (at 2026-01-02 15:09:00, 1m0s ago)", "concurrency | total tok/s | per request | TTFT p50",
		"        128 |         370 |          11 |    760ms")
	lines := strings.Split(s, "\n")
	tok, ttft := lineIndex(lines, "total tok/s by concurrency"), lineIndex(lines, "TTFT p50 by concurrency")
	if tok < 0 || ttft != tok+7 {
		t.Fatalf("charts not stacked (tok/s at line %d, TTFT at %d):\n%s", tok, ttft, s)
	}
	mustContain(t, lines[tok+6], "1", "128")
	for i, l := range lines {
		if ansi.StringWidth(l) > 80 {
			t.Fatalf("line %d is %d cells wide: %q", i, ansi.StringWidth(l), l)
		}
	}
}

// A multi-line event (the hub's bench event carries the whole table) keeps
// to one row in the events view, and enter shows it whole.
func TestMultiLineEvent(t *testing.T) {
	src := consoletest.Demo()
	src.AddEvent(fleet.Event{At: time.Date(2026, 1, 2, 15, 9, 0, 0, time.UTC), Level: "info", Subject: "max/qwen3-4b",
		Message: "bench:\nBench of max/qwen3-4b\n\n| 1 request tok/s | 2 concurrent total |\n| 87 | 130 |"})
	h := newHarness(t, src, viewer, 140, 20)
	h.keys("tab", "tab", "tab")
	s := h.screen()
	mustContain(t, s, "bench: · Bench of max/qwen3-4b · | 1 request tok/s")
	lines := strings.Split(s, "\n")
	if len(lines) != 20 || !strings.Contains(lines[0], "[events]") {
		t.Fatalf("the event broke the layout:\n%s", s)
	}
	h.keys("enter")
	s = h.screen()
	mustContain(t, s, "2026-01-02 15:09:00 info max/qwen3-4b", "Bench of max/qwen3-4b", "| 87 | 130 |")
	h.keys("esc")
	mustContain(t, h.screen(), "[events]")
}

// The hint lines leave off the keys the role may not use (k9s leaves them
// unbound in read-only mode); the help screen still lists them as not for
// the viewer, and pressing one still says why (TestViewerDangerousKeysSayWhy).
func TestHintsLeaveOutKeysTheRoleCannotUse(t *testing.T) {
	tests := []struct {
		name       string
		user       fleet.User
		table      []string
		detail     []string
		notInTable []string
	}{
		{"operator", operator,
			[]string{"↑↓ move", "enter detail", "d drain", "u undrain", "r restart", "s shape", "b bench", "? help"},
			[]string{"esc back", "d drain", "u undrain", "r restart", "b bench", "? help"}, nil},
		{"viewer", viewer,
			[]string{"↑↓ move", "enter detail", "/ filter", "space mark", "tab view", "? help", "q quit"},
			[]string{"esc back", "↑↓ scroll", "? help"},
			[]string{"drain", "restart", "shape", "bench"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, consoletest.Demo(), tt.user, 160, 30)
			last := func() string {
				lines := strings.Split(h.screen(), "\n")
				return lines[len(lines)-1]
			}
			mustContain(t, last(), tt.table...)
			mustNotContain(t, last(), tt.notInTable...)
			h.keys("enter")
			mustContain(t, last(), tt.detail...)
			mustNotContain(t, last(), tt.notInTable...)
		})
	}
}

// b asks which split; a runs the agent split, whose result lands beside the
// chat one in the detail; esc asks nothing of the hub.
func TestBenchOffersTheSplit(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 10, 0, 0, time.UTC) // the harness's clock
	src := consoletest.Demo()
	h := newHarness(t, src, operator, 200, 60)
	h.keys("down", "b")
	mustContain(t, h.screen(), "which split?", "agent: ~4.6K-token prompts", "a agent split")
	h.keys("esc")
	mustContain(t, h.screen(), "bench cancelled")
	if a := src.Actions(); len(a) != 0 {
		t.Fatalf("esc at the split question sent %+v", a)
	}

	src.SetBench("ultra/qwen3-4b", consoletest.DemoBench(), at.Add(-time.Hour))
	h.refresh()
	h.keys("b", "a")
	if a := src.Actions(); len(a) != 1 || a[0].Split != console.SplitAgent || strings.Join(a[0].Targets, ",") != "ultra/qwen3-4b" {
		t.Fatalf("actions = %+v, want one agent bench of ultra/qwen3-4b", a)
	}
	h.refresh()
	mustContain(t, h.screen(), "benching ultra/qwen3-4b")
	src.SetAgentBench("ultra/qwen3-4b", []fleet.BenchPoint{
		{Concurrency: 1, TotalTokPerSec: 41, PerRequestTokPerSec: 41, TTFTp50ms: 900},
		{Concurrency: 2, TotalTokPerSec: 70, PerRequestTokPerSec: 35, TTFTp50ms: 1500},
	}, at)
	h.refresh()
	mustContain(t, h.screen(), "agent bench of ultra/qwen3-4b done: 41 / 70 tok/s total at 1 / 2 concurrent")
	h.keys("enter")
	s := h.screen()
	mustContain(t, s, "bench (at 2026-01-02 14:10:00", "agent split bench (~4.6K-token prompts, ~70-token answers) (at 2026-01-02 15:10:00",
		"87 |", "41 |")
}

// TestWorkerTableHasTheSharedColumns: the console's worker table shows the
// shared column set in its order, Model included, so a node running one
// worker says which model it serves, as the CLI's `workers` does.
func TestWorkerTableHasTheSharedColumns(t *testing.T) {
	h := newHarness(t, consoletest.Demo(), viewer, 200, 30)
	lines := strings.Split(h.screen(), "\n")
	head := lineIndex(lines, "Started with")
	if head < 0 {
		t.Fatalf("no worker table header:\n%s", h.screen())
	}
	header := lines[head]
	at := 0
	for _, c := range columns.Table {
		i := strings.Index(header[at:], c.Header)
		if i < 0 {
			t.Fatalf("the header lacks %q after %q: %q", c.Header, header[:at], header)
		}
		at += i + len(c.Header)
	}
	col := strings.Index(header, "Model")
	row := lines[lineIndex(lines, "Apple M4 Max")]
	if cell := strings.Fields(row[col:])[0]; cell != "qwen3-4b" {
		t.Errorf("max's Model cell is %q, want qwen3-4b:\n%s\n%s", cell, header, row)
	}
}

// TestTitleSaysTheHubAndItsRole: with several hubs the title bar says which
// hub this is and which leads; with one (SQLite) it says nothing of hubs.
func TestTitleSaysTheHubAndItsRole(t *testing.T) {
	src := consoletest.Demo()
	h := newHarness(t, src, operator, 160, 30)
	mustNotContain(t, strings.Split(h.screen(), "\n")[0], "leader", "follower")
	src.SetHub(&fleet.HubRole{Name: "hub2", Role: "follower", Leader: "hub1"})
	h = newHarness(t, src, operator, 160, 30)
	mustContain(t, strings.Split(h.screen(), "\n")[0], "hub2 follower of hub1")
	src.SetHub(&fleet.HubRole{Name: "hub2", Role: "follower"})
	h = newHarness(t, src, operator, 160, 30)
	mustContain(t, strings.Split(h.screen(), "\n")[0], "hub2 follower, no leader")
}
