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
	tm.waitFor("a 90-column layout", func(s string) bool {
		lines := strings.Split(s, "\n")
		return len(lines) == 16 && strings.Contains(s, "ultra") && !strings.Contains(s, "Started with")
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
	if a := src.Actions(); len(a) != 1 || a[0].Kind != console.ActionDrain {
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
