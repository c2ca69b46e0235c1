package console_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/bench/shape"
	"fleet/console/consoletest"
)

// printedEscape matches an escape sequence shown as text instead of obeyed
// by the terminal: the ESC written out as Sanitize and Go quote it, as a
// caret, or a colour code whose ESC was lost.
var printedEscape = regexp.MustCompile(`\\x1b|\\033|\\u001b|\\e\[|\^\[|\x1b|\[[0-9;]{1,12}m`)

// checkScreen fails on what a terminal must never show: a printed escape
// sequence, a line wider than the terminal, or a screen of the wrong
// height (a line that wrapped pushes the title off).
func checkScreen(t *testing.T, what string, s string, width, height int) {
	t.Helper()
	if m := printedEscape.FindString(s); m != "" {
		t.Fatalf("%s prints the escape sequence %q as text:\n%s", what, m, s)
	}
	lines := strings.Split(s, "\n")
	if len(lines) != height {
		t.Fatalf("%s: %d lines on a %d-line terminal:\n%s", what, len(lines), height, s)
	}
	for i, l := range lines {
		if w := ansi.StringWidth(l); w > width {
			t.Fatalf("%s: line %d is %d cells wide on a %d-column terminal: %q", what, i, w, width, l)
		}
	}
	if !strings.Contains(lines[0], "fleet") {
		t.Fatalf("%s: the title is not on the first line:\n%s", what, s)
	}
}

// shapeReport is a real report, as the hub's shape action renders it.
func shapeReport(width int) string {
	r := shape.Report{A: "max/qwen3-4b", B: "ultra/qwen3-4b", Verdict: shape.VerdictDiffers,
		Rows: []shape.Row{
			{Request: "reasoning, streamed", Aspect: "content", A: "Paris", B: "Paris", Same: true},
			{Request: "reasoning, streamed", Aspect: "reasoning", A: "reasoning_content", B: "inline <think>", Same: false},
		},
		Differences: []shape.Difference{
			{Requests: []string{"reasoning, streamed"}, Aspect: "reasoning", Material: true, Text: "reasoning inline in content on ultra/qwen3-4b"},
			{Requests: []string{"reasoning, streamed"}, Aspect: "timings", Text: "extra field timings on ultra/qwen3-4b"},
		}}
	return fleet.Sanitize(r.Text(width, false))
}

// Every panel through a terminal emulator, at 80x24 and 200x50: the worker
// table, the help, the detail with its bench chart and wrapped command
// line, the shape diff and an event's text. None prints an escape sequence
// instead of obeying it, none is wider or taller than the terminal.
func TestTerminalEveryPanelAtEverySize(t *testing.T) {
	for _, size := range []struct{ w, h int }{{80, 24}, {200, 50}} {
		t.Run(fmt.Sprintf("%dx%d", size.w, size.h), func(t *testing.T) {
			src := consoletest.Demo()
			src.Reply = shapeReport(size.w)
			tm := startTerm(t, src, operator, size.w, size.h)

			// The worker table: every measured column whole, the command
			// line's short form, and ? and q on the hint line.
			s := tm.waitText("Apple M4 Max", "Started with")
			checkScreen(t, "the worker table", s, size.w, size.h)
			lines := strings.Split(s, "\n")
			for _, h := range []string{"Node", "Model", "GPU", "State", "Load", "tok/s", "TTFT", "ITL", "Started with"} {
				if !strings.Contains(lines[1], h) {
					t.Errorf("the header %q lacks %s", lines[1], h)
				}
			}
			if size.w >= 200 {
				mustContain(t, lines[1], "Host", "Engine", "Ctx")
			}
			for _, row := range []string{screenRow(s, "8x RTX 3060"), screenRow(s, "Apple M1 Ultra")} {
				if !regexp.MustCompile(`\d+ms +(\S+ +)?\d+ms`).MatchString(row) {
					t.Errorf("a row lacks its TTFT or ITL whole: %q", row)
				}
				if !strings.Contains(row, "vllm serve Qwen") && !strings.Contains(row, "llama-server -h") {
					t.Errorf("a row lacks the short form of its command line: %q", row)
				}
			}
			if hints := lines[len(lines)-1]; !strings.HasSuffix(strings.TrimRight(hints, " "), "? help  q quit") {
				t.Errorf("the hint line %q does not end with ? help and q quit", hints)
			}

			tm.typeText("?")
			checkScreen(t, "the help", tm.waitText("Keys", "drain: no new requests"), size.w, size.h)
			tm.key(tea.KeyEscape)
			backToTable(tm)

			// The detail of rig: its whole command line, wrapped.
			backToTable(tm)
			tm.key(tea.KeyEnter)
			s = tm.waitText("rig/qwen3-4b", "Started with:", "Log (last lines)")
			checkScreen(t, "the detail", s, size.w, size.h)
			rig := src.Snapshot().Workers[0]
			joined := strings.Join(strings.Fields(s), " ")
			if !strings.Contains(joined, strings.Join(rig.Argv, " ")) {
				t.Errorf("the detail does not show rig's whole command line %q:\n%s", strings.Join(rig.Argv, " "), s)
			}
			tm.key(tea.KeyEscape)
			backToTable(tm)

			// The detail of max with its bench chart.
			tm.typeText("jj")
			tm.key(tea.KeyEnter)
			checkScreen(t, "the bench chart", tm.waitText("max/qwen3-4b", "total tok/s by concurrency"), size.w, size.h)
			tm.key(tea.KeyEscape)
			backToTable(tm)

			// The shape diff of two marked workers, coloured by the console.
			tm.typeText("k  ")
			tm.waitText("2 marked")
			tm.typeText("s")
			s = tm.waitText("Response shape: max/qwen3-4b vs ultra/qwen3-4b: DIFFERS", "What a client would notice")
			checkScreen(t, "the shape diff", s, size.w, size.h)
			acts := src.Actions()
			if a := acts[len(acts)-1]; a.Kind != fleet.ActionShape || a.Width != size.w {
				t.Errorf("the shape action %+v, want the console's width %d", a, size.w)
			}
			y := lineIndex(strings.Split(s, "\n"), "Response shape:")
			x := strings.Index(strings.Split(s, "\n")[y], "DIFFERS")
			if c := tm.emu.CellAt(x, y); c == nil || c.Style.Fg == nil {
				t.Errorf("the verdict is not coloured: cell %+v", c)
			}
			tm.key(tea.KeyEscape)
			backToTable(tm)

			// An event's whole text (the events view, newest first, enter).
			src.AddEvent(fleet.Event{At: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), Level: "info", Subject: "rig", Message: "bench:\n 1 request tok/s | 2 concurrent total\n            96 |                180"})
			for range 3 {
				tm.key(tea.KeyTab)
			}
			s = tm.waitText("[events]", "bench: · 1 request tok/s")
			checkScreen(t, "the events", s, size.w, size.h)
			tm.key(tea.KeyEnter)
			checkScreen(t, "an event's text", tm.waitText("1 request tok/s | 2 concurrent total"), size.w, size.h)
		})
	}
}

// backToTable waits for the worker table after an Esc closed a panel, so
// that the next key is not read with the Esc as one alt+key.
func backToTable(tm *term) {
	tm.t.Helper()
	tm.waitFor("the worker table", func(s string) bool {
		return strings.Contains(s, "Apple M4 Max") && strings.Contains(s, "Started with") &&
			!strings.Contains(s, "Keys  (you are") && !strings.Contains(s, "Started with:") && !strings.Contains(s, "Response shape")
	})
}
