package sshserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
	gossh "golang.org/x/crypto/ssh"

	"fleet"
	"fleet/internal/syncbuf"
)

// tail keeps what a session printed, for a test to wait on.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
	n   int
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += len(p)
	w.buf.Write(p)
	return len(p), nil
}

func (w *tail) raw() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func (w *tail) text() string { return ansi.Strip(w.raw()) }

func (w *tail) waitFor(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.text(), what) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %q in %d bytes of output", what, w.n)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestHugeTerminalIsCapped: a viewer asking for a 3000×3000 terminal used
// to take the hub to 2 GB, about 230 bytes per
// cell. The console renders within MaxTermWidth×MaxTermHeight instead. The
// server runs in this process, so its heap is this test's heap.
func TestHugeTerminalIsCapped(t *testing.T) {
	vic := newIdentity(t, "vic", fleet.RoleViewer)
	ts := startServer(t, Options{Users: newUsers(vic.user)})
	c, err := dial(ts.addr, gossh.PublicKeys(vic.signer))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := heapInUse()

	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out := &tail{}
	sess.Stdout = out
	if _, err := sess.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := sess.RequestPty("xterm-256color", 3000, 3000, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "Started with")
	// A few refreshes, so what each frame costs is counted too.
	time.Sleep(5 * ts.opts.Refresh)
	asked := heapInUse()

	// 1000×1000 is within what Bubble Tea itself accepts (1 M cells).
	if err := sess.WindowChange(1000, 1000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * ts.opts.Refresh)
	resized := heapInUse()

	// The console drew within the cap, and used it: the status line is
	// right-aligned to the last column, the key help on the last row.
	col, row := farthestCursor(out.raw())
	t.Logf("heap in use: %.1f MB before, %.1f MB with a 3000x3000 console, %.1f MB after a 1000x1000 window-change; "+
		"farthest cursor position column %d, row %d", mb(before), mb(asked), mb(resized), col, row)
	if col > MaxTermWidth || row > MaxTermHeight {
		t.Errorf("the console moved the cursor to column %d, row %d; the cap is %dx%d", col, row, MaxTermWidth, MaxTermHeight)
	}
	if col < MaxTermWidth-100 || row < MaxTermHeight-1 {
		t.Errorf("the console drew up to column %d, row %d: it did not use the %dx%d it was given", col, row, MaxTermWidth, MaxTermHeight)
	}
	// 3000×3000 uncapped is 9 M cells (2 GB); the cap is 100 k cells.
	const limit = 64 << 20
	for what, got := range map[string]uint64{"the pty request": asked, "the window-change": resized} {
		if got > before && got-before > limit {
			t.Errorf("after %s the heap grew by %.0f MB, more than %.0f MB", what, mb(got-before), mb(limit))
		}
	}
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// cursorMoves are the renderer's absolute moves: CUP (row;col H) and VPA (row d).
var cursorMoves = regexp.MustCompile(`\x1b\[(\d+)(?:;(\d+))?([Hd])`)

// farthestCursor is the largest column and row the output moved the cursor to.
func farthestCursor(out string) (col, row int) {
	for _, m := range cursorMoves.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(m[1])
		row = max(row, r)
		if m[3] == "H" && m[2] != "" {
			c, _ := strconv.Atoi(m[2])
			col = max(col, c)
		}
	}
	return col, row
}

// TestSessionLimits: one connection opened 400 consoles (2.1 GB). Sessions
// are limited per connection and per user, consoles over the whole hub, and
// a refused client is told which limit it met.
func TestSessionLimits(t *testing.T) {
	olga := newIdentity(t, "olga", fleet.RoleOperator)
	vic := newIdentity(t, "vic", fleet.RoleViewer)
	logs := &syncbuf.Buffer{}
	ts := startServer(t, Options{Users: newUsers(olga.user, vic.user), MaxSessionsPerConn: 2, MaxSessionsPerUser: 3, MaxConsoles: 1,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	connect := func(id identity) *gossh.Client {
		t.Helper()
		c, err := dial(ts.addr, gossh.PublicKeys(id.signer))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	open := func(c *gossh.Client, refusal string) *gossh.Session {
		t.Helper()
		sess, err := c.NewSession()
		if refusal == "" {
			if err != nil {
				t.Fatalf("opening a session: %v", err)
			}
			return sess
		}
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, refusal) {
			t.Fatalf("opening a session: %v; want a refusal saying %q", err, refusal)
		}
		return nil
	}

	// Per connection.
	a := connect(olga)
	a1, a2 := open(a, ""), open(a, "")
	// A client retrying in a loop gets one warning in the log, not one each.
	for range 20 {
		open(a, "this connection already has 2 sessions open")
	}
	if n := strings.Count(logs.String(), "ssh session refused"); n != 1 {
		t.Errorf("20 refusals on one connection logged %d lines, want 1", n)
	}
	// Per user, over connections: olga's third session on another
	// connection is her last; vic is not affected.
	b := connect(olga)
	open(b, "")
	open(b, "you already have 3 sessions open")
	v := connect(vic)
	open(v, "")
	// A closed session frees its slots.
	a2.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := a.NewSession()
		if err == nil {
			a2 = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after closing a session, the connection still cannot open one: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a1.Close()
	a2.Close()

	// Consoles over the whole hub: vic's is the one there is room for;
	// olga's is refused with a message, and commands still work.
	p := openConsole(t, ts.addr, vic, 120, 30)
	p.waitText("Started with")
	c := connect(olga)
	sess := open(c, "")
	var stderr bytes.Buffer
	sess.Stderr = &stderr
	if err := sess.RequestPty("xterm-256color", 30, 120, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	var exit *gossh.ExitError
	if err := sess.Wait(); !errors.As(err, &exit) || exit.ExitStatus() != 1 || !strings.Contains(stderr.String(), "already serves 1 console,") {
		t.Fatalf("a console past the limit: %v, stderr %q; want exit 1 saying the hub serves 1 console", err, stderr.String())
	}
	if out, errOut, code := run(t, ts.addr, olga, "whoami", ""); code != 0 || out != "olga operator\n" {
		t.Fatalf("a command while the consoles are full: exit %d, %q %q", code, out, errOut)
	}
}

func TestSessionLimitsDisabled(t *testing.T) {
	l := newSessionLimits(-1, -1, -1)
	for range 1000 {
		if _, why := l.openSession("conn", "user"); why != "" {
			t.Fatal(why)
		}
		if _, ok := l.openConsole(); !ok {
			t.Fatal("a disabled console limit refused")
		}
	}
}

// TestLongCommandIsRefusedAndNotLogged: a viewer's `drain <120 KB>` was
// logged twice per session in full. A command line over MaxCommandBytes is
// refused before it runs, and no log line carries more than a clip of it.
func TestLongCommandIsRefusedAndNotLogged(t *testing.T) {
	vic := newIdentity(t, "vic", fleet.RoleViewer)
	logs := &syncbuf.Buffer{}
	var ran []string
	var mu sync.Mutex
	exec := func(ctx context.Context, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
		mu.Lock()
		ran = append(ran, strings.Join(args, " "))
		mu.Unlock()
		return 0
	}
	ts := startServer(t, Options{Users: newUsers(vic.user), Exec: exec, Logger: slog.New(slog.NewTextHandler(logs, nil))})

	long := "drain " + strings.Repeat("a", 120_000)
	_, stderr, code := run(t, ts.addr, vic, long, "")
	if code != 2 || !strings.Contains(stderr, "the limit is 4096 bytes") {
		t.Errorf("a 120 KB command: exit %d, stderr %q; want exit 2 naming the limit", code, stderr)
	}
	// Just under the limit runs, and is logged clipped.
	fits := "drain " + strings.Repeat("b", MaxCommandBytes-len("drain "))
	if _, stderr, code := run(t, ts.addr, vic, fits, ""); code != 0 {
		t.Errorf("a command of exactly %d bytes: exit %d, %q", MaxCommandBytes, code, stderr)
	}
	mu.Lock()
	if len(ran) != 1 || ran[0] != fits {
		t.Errorf("the command tree ran %d commands, want only the one within the limit", len(ran))
	}
	mu.Unlock()
	for _, l := range strings.Split(logs.String(), "\n") {
		if len(l) > 1024 {
			t.Errorf("a log line of %d bytes: %.200s…", len(l), l)
		}
	}
}

// What a console costs the hub at its largest: consoles at the size cap
// whose clients read none of their output (stalled: the SSH window is full,
// the hub's writes wait) while the fleet changes under them. docs/limits.md
// states the figure per console that this bounds.
func TestStalledConsolesMemory(t *testing.T) {
	const consoles = 4
	vic := newIdentity(t, "vic", fleet.RoleViewer)
	ts := startServer(t, Options{Users: newUsers(vic.user), MaxSessionsPerUser: consoles, MaxSessionsPerConn: consoles})
	c, err := dial(ts.addr, gossh.PublicKeys(vic.signer))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := heapInUse()
	for range consoles {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if _, err := sess.StdoutPipe(); err != nil { // never read
			t.Fatal(err)
		}
		if _, err := sess.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := sess.RequestPty("xterm-256color", MaxTermHeight, MaxTermWidth, gossh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		if err := sess.Shell(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second) // hang guard
	for ts.consolesOpen() != consoles {
		if time.Now().After(deadline) {
			t.Fatalf("%d consoles open, want %d", ts.consolesOpen(), consoles)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Refreshes (the demo source changes every one) until the output is
	// stuck behind the full SSH windows.
	time.Sleep(20 * ts.opts.Refresh)
	each := float64(heapInUse()-min(before, heapInUse())) / consoles
	t.Logf("heap in use per stalled %dx%d console: %.1f MB", MaxTermWidth, MaxTermHeight, mb(uint64(each)))
	const documented = 30 << 20 // docs/limits.md: "each up to about 30 MB of heap"
	if each > documented {
		t.Errorf("a stalled console at the size cap holds %.1f MB of heap; docs/limits.md says up to about %.0f MB", mb(uint64(each)), mb(documented))
	}
}
