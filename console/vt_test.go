package console_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"

	"fleet"
	"fleet/console"
	"fleet/console/consoletest"
)

// term runs a real Bubble Tea program against an in-process terminal
// emulator: the program writes to the emulator, and the emulator's replies to
// terminal queries and the keys we type flow back as the program's input.
type term struct {
	t    *testing.T
	emu  *vt.SafeEmulator
	prog *tea.Program
	done chan error
}

func startTerm(t *testing.T, src console.Source, u fleet.User, w, h int) *term {
	t.Helper()
	screen := consoletest.NewScreen(w, h)
	emu := screen.Emu
	inR, inW := io.Pipe()
	screen.Pump(inW)
	ctx, cancel := context.WithCancel(context.Background())
	m := console.New(src, console.Options{User: u, Width: w, Height: h, Refresh: 50 * time.Millisecond, Context: ctx})
	p := tea.NewProgram(m,
		tea.WithInput(inR), tea.WithOutput(onlcr{emu}),
		tea.WithWindowSize(w, h),
		tea.WithEnvironment([]string{"TERM=xterm-256color"}),
		tea.WithColorProfile(colorprofile.TrueColor),
		tea.WithoutSignals(),
	)
	tm := &term{t: t, emu: emu, prog: p, done: make(chan error, 1)}
	go func() {
		_, err := p.Run()
		tm.done <- err
	}()
	t.Cleanup(func() {
		cancel()
		p.Kill()
		select {
		case <-tm.done:
		case <-time.After(10 * time.Second):
			t.Error("program did not stop")
		}
		_ = inW.Close()
		screen.Close()
	})
	return tm
}

// onlcr does what a tty's line discipline does with output: a newline
// becomes carriage return + newline. The renderer counts on it, as it would
// on a real terminal or an SSH session's emulated pty.
type onlcr struct{ w io.Writer }

func (o onlcr) Write(p []byte) (int, error) {
	if _, err := o.w.Write(bytes.ReplaceAll(p, []byte("\n"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (tm *term) screen() string { return ansi.Strip(tm.emu.Render()) }

// waitFor polls the emulated screen; the timeout is a hang guard only.
func (tm *term) waitFor(what string, cond func(string) bool) string {
	tm.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := tm.screen()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("timed out waiting for %s; screen:\n%s", what, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (tm *term) waitText(texts ...string) string {
	tm.t.Helper()
	return tm.waitFor(strings.Join(texts, ", "), func(s string) bool {
		for _, x := range texts {
			if !strings.Contains(s, x) {
				return false
			}
		}
		return true
	})
}

func (tm *term) typeText(s string) { tm.emu.SendText(s) }

func (tm *term) key(code rune) { tm.emu.SendKey(vt.KeyPressEvent{Code: code}) }

func TestTerminalViewsFilterHelpResize(t *testing.T) {
	tm := startTerm(t, consoletest.Demo(), viewer, 150, 30)
	tm.waitText("Started with", "rig", "ultra", "max", "vllm serve Qwen/Qwen3-4B-AWQ")

	tm.key(tea.KeyTab)
	tm.waitText("[nodes]", "ops@ultra.lan")
	tm.key(tea.KeyTab)
	tm.waitText("[models]", "Qwen/Qwen3-4B-GGUF:Q4_K_M")
	tm.key(tea.KeyTab)
	tm.waitText("[events]", "probe slow")
	tm.key(tea.KeyTab)
	tm.waitText("[usage]", "rig/qwen3-4b", "key ci")
	tm.key(tea.KeyTab)
	tm.waitText("[workers]")

	tm.typeText("/m4")
	tm.key(tea.KeyEnter)
	tm.waitFor("only max left", func(s string) bool {
		return strings.Contains(s, `matching "m4"`) && strings.Contains(s, "Apple M4 Max") &&
			!strings.Contains(s, "8x RTX 3060") && !strings.Contains(s, "Apple M1 Ultra")
	})
	tm.key(tea.KeyEscape)
	tm.waitText("8x RTX 3060", "Apple M1 Ultra")

	tm.typeText("?")
	tm.waitText("drain: no new requests", "not for you")
	tm.key(tea.KeyEscape)
	tm.waitText("Started with")

	tm.emu.Resize(90, 16)
	tm.prog.Send(tea.WindowSizeMsg{Width: 90, Height: 16})
	// Whether a narrow "Started with" column survives depends on how wide
	// the live State and Load cells are; that the full command line no longer
	// fits does not.
	tm.waitFor("a 90-column layout", func(s string) bool {
		lines := strings.Split(s, "\n")
		return len(lines) == 16 && strings.Contains(s, "ultra") && !strings.Contains(s, "vllm serve Qwen/Qwen3-4B-AWQ")
	})

	tm.typeText("q")
	select {
	case err := <-tm.done:
		tm.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("program ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("q did not quit")
	}
}

func TestTerminalViewerAndOperator(t *testing.T) {
	src := consoletest.Demo()
	v := startTerm(t, src, viewer, 150, 30)
	v.waitText("Started with")
	v.typeText("d")
	v.waitText("drain needs the operator role; you are viewer")
	v.typeText("y")
	v.typeText("r")
	v.waitText("restart needs the operator role; you are viewer")
	if a := src.Actions(); len(a) != 0 {
		t.Fatalf("viewer keys reached the hub: %+v", a)
	}

	o := startTerm(t, src, operator, 150, 30)
	o.waitText("Started with")
	o.typeText("j")
	o.typeText("d")
	o.waitText("Drain ultra/qwen3-4b?", "3 requests in flight")
	o.typeText("y")
	o.waitText("draining ultra/qwen3-4b: 3 in flight")
	if a := src.Actions(); len(a) != 1 || a[0].Kind != fleet.ActionDrain {
		t.Fatalf("actions = %+v, want one drain", a)
	}
	// The viewer's table sees the drain through its own refresh.
	v.waitText("draining")
	src.SetInFlight("ultra/qwen3-4b", 0)
	o.waitText("ultra/qwen3-4b drained")
}

func TestTerminalLiveUpdates(t *testing.T) {
	src := consoletest.Demo()
	tm := startTerm(t, src, viewer, 150, 30)
	first := tm.waitText("Started with")
	row := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.Contains(l, "8x RTX 3060") {
				return l
			}
		}
		return ""
	}
	tm.waitFor("the rig row to change", func(s string) bool { return row(s) != "" && row(s) != row(first) })
	if src.Ticks() < 2 {
		t.Fatalf("snapshot read %d times, want a refresh", src.Ticks())
	}
}

// lineIndex is the index of the first screen line containing substr, or -1.
func lineIndex(lines []string, substr string) int {
	for i, l := range lines {
		if strings.Contains(l, substr) {
			return i
		}
	}
	return -1
}

// The detail of max, which the demo gives the first seed's M4 Max sweep,
// shows the seed's row and both charts, whole and in place, in a narrow and
// a wide terminal: a line written wider than the terminal would wrap and
// push everything under it down, so the section's rows must sit exactly
// where the layout puts them, under a title bar still on the first line.
func TestTerminalBenchChartInDetail(t *testing.T) {
	tests := []struct {
		name          string
		width, height int
		header        string
	}{
		{"80 columns", 80, 24, "1 req tok/s | 2 conc total | 4 conc total | per req at 4 |     TTFT p50"},
		{"200 columns", 200, 50, "1 request tok/s | 2 concurrent total | 4 concurrent total | per request at 4 |     TTFT p50"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm := startTerm(t, consoletest.Demo(), viewer, tt.width, tt.height)
			tm.waitText("Apple M4 Max")
			tm.typeText("jj")
			tm.key(tea.KeyEnter)
			s := tm.waitText("max/qwen3-4b", "bench (at 2026-01-02 15:08:05", "total tok/s by concurrency", "TTFT p50 by concurrency")
			lines := strings.Split(s, "\n")
			if len(lines) != tt.height {
				t.Fatalf("screen has %d lines, want %d:\n%s", len(lines), tt.height, s)
			}
			if !strings.Contains(lines[0], "fleet") || !strings.Contains(lines[0], "ready") {
				t.Fatalf("title bar is not on the first line (something wrapped):\n%s", s)
			}
			if !strings.Contains(lines[len(lines)-1], "esc back") {
				t.Fatalf("key hints are not on the last line:\n%s", s)
			}
			top := lineIndex(lines, "bench (at ")
			want := []string{
				tt.header,
				"87 |",
				"total tok/s by concurrency    TTFT p50 by concurrency",
			}
			for i, w := range want {
				if !strings.Contains(lines[top+1+i], w) {
					t.Fatalf("line %d under the bench title is %q, want it to contain %q:\n%s", i+1, lines[top+1+i], w, s)
				}
			}
			values := lines[top+2]
			for _, f := range []string{"87", "130", "136", "34", "95/118/162ms"} {
				if !strings.Contains(values, f) {
					t.Fatalf("the seed's row %q lacks %s", values, f)
				}
			}
			// Chart title, headroom, four bar rows, then the levels.
			chart := lines[top+3 : top+3+7]
			mustContain(t, chart[1], "130", "136", "162ms")
			mustContain(t, chart[2], "87", "95ms", "118ms")
			// 136 and 162ms fill their four rows; 87 of 136 is 2.6 rows.
			for r, full := range map[int]int{2: 2, 3: 3, 4: 6, 5: 6} {
				if got := strings.Count(chart[r], "██████"); got != full {
					t.Fatalf("bar row %d has %d full bars, want %d: %q", r-1, got, full, chart[r])
				}
			}
			if strings.Count(chart[6], "1       2       4") != 2 {
				t.Fatalf("level axis is %q, want 1 2 4 under each chart", chart[6])
			}
			for i, l := range lines {
				if ansi.StringWidth(l) > tt.width {
					t.Fatalf("line %d is wider than the terminal: %q", i, l)
				}
			}
		})
	}
}

func TestTerminalDetailWithoutBenchSaysHow(t *testing.T) {
	tm := startTerm(t, consoletest.Demo(), viewer, 80, 24)
	tm.waitText("8x RTX 3060")
	tm.key(tea.KeyEnter)
	s := tm.waitText("rig/qwen3-4b", "Bench: no bench yet: press b to run one (operator)")
	mustNotContain(t, s, "total tok/s by concurrency", "bench (at ")
}

// b answers at once, the status follows the sweep, and the open detail
// draws the chart when the result lands in the snapshot.
func TestTerminalBenchLandsInOpenDetail(t *testing.T) {
	src := consoletest.Demo()
	tm := startTerm(t, src, operator, 120, 40)
	tm.waitText("8x RTX 3060")
	tm.key(tea.KeyEnter)
	tm.waitText("rig/qwen3-4b", "no bench yet")
	tm.typeText("b")
	tm.waitText("which split?", "c chat split")
	tm.typeText("c")
	tm.waitText("bench started on rig/qwen3-4b", "rig/qwen3-4b", "no bench yet")
	if a := src.Actions(); len(a) != 1 || a[0].Kind != fleet.ActionBench || strings.Join(a[0].Targets, ",") != "rig/qwen3-4b" || a[0].Split != console.SplitChat {
		t.Fatalf("actions = %+v, want one chat bench of rig/qwen3-4b", a)
	}
	src.SetBench("rig/qwen3-4b", []fleet.BenchPoint{
		{Concurrency: 4, TotalTokPerSec: 310, PerRequestTokPerSec: 77.5, TTFTp50ms: 140},
		{Concurrency: 1, TotalTokPerSec: 96, PerRequestTokPerSec: 96, TTFTp50ms: 60},
		{Concurrency: 2, TotalTokPerSec: 180, PerRequestTokPerSec: 90, TTFTp50ms: 85},
	}, time.Date(2026, 1, 2, 15, 9, 0, 0, time.UTC))
	s := tm.waitText("bench (at 2026-01-02 15:09:00", "bench of rig/qwen3-4b done: 96 / 180 / 310 tok/s total at 1 / 2 / 4 concurrent")
	mustNotContain(t, s, "no bench yet", "benching rig")
	// Levels arrive out of order; the table and the axis run 1, 2, 4.
	mustContain(t, s, "96 |                180 |                310 |               78 | 60/85/140ms", "1       2       4")
}
