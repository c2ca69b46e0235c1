// Package enginectl drives one inference engine on one node: it turns a
// model's recipe into the exact command line, installs the engine, launches
// it detached from the controlling session, waits until our own process
// answers, stops it, adopts it after a hub restart, clears stale listeners
// from its port and scrapes its load figures.
//
// It reaches the node only through a Runner. Every shell snippet it runs is a
// constant script; data travels only as positional parameters, so a transport
// that quotes argv once (SSH) can never be tricked into running data as code.
package enginectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"time"
)

// Runner is how enginectl reaches a node. The nodes package implements it
// for local, simulated and SSH nodes.
type Runner interface {
	// Run runs argv on the node (argv[0] looked up in the node's PATH),
	// streaming output to stdout/stderr (either may be nil). A non-zero exit
	// returns an error with an `ExitCode() int` method.
	Run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error
	// DialContext connects to addr ("127.0.0.1:PORT") as seen from the node.
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// ExitCode returns the exit status carried by an error from Runner.Run, and
// whether there was one (a transport failure has none).
func ExitCode(err error) (int, bool) {
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode(), true
	}
	return 0, false
}

// LocalRunner runs commands on this machine with os/exec and dials with a
// plain net.Dialer. The nodes package may reuse it for local and sim nodes.
type LocalRunner struct {
	// Env is added to the environment of every command (KEY=VALUE).
	Env []string
}

// Run implements Runner.
func (l LocalRunner) Run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(argv) == 0 {
		return errors.New("run: empty command line")
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	if len(l.Env) > 0 {
		cmd.Env = append(os.Environ(), l.Env...)
	}
	// A detached grandchild must never hold our pipes open; if one does by
	// mistake, give up on its output rather than hang.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run %s: %w", argv[0], err)
	}
	return nil
}

// DialContext implements Runner.
func (LocalRunner) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Option tunes the functions that act on a node.
type Option func(*options)

type options struct {
	logger       *slog.Logger
	pollInterval time.Duration
	staleGrace   time.Duration
	fleet        Fleet
}

// Fleet is the fleet whose engines Adopt and CheckPort may take on: its ID,
// and the last launch serial its database gave out. An engine of another
// fleet is a stranger, neither adopted nor stopped; one of this fleet with
// a higher launch serial was started by a newer copy of the database (this
// one was restored from an older copy) and is refused with a
// *NewerEngineError. The zero Fleet judges no engine by its owner.
type Fleet struct {
	ID string
	// LastLaunch reads the last serial given out; nil: any.
	LastLaunch func() int64
	// OnNewer hears of each engine of a newer copy of the database.
	OnNewer func(pid int, launch int64)
}

// WithFleet makes Adopt and CheckPort take on only f's own engines.
func WithFleet(f Fleet) Option { return func(o *options) { o.fleet = f } }

var errOtherFleet = errors.New("the engine belongs to another fleet")

// NewerEngineError is an engine of this fleet launched by a newer copy of
// its database than the hub's.
type NewerEngineError struct {
	PID          int
	Launch, Last int64
}

func (e *NewerEngineError) Error() string {
	return fmt.Sprintf("engine PID %d carries launch %d, but this fleet's database has given out launches up to %d only: "+
		"it was started from a newer copy of the database (this one was restored from an older copy?), so it is neither adopted nor stopped; "+
		"stop the hub and run `fleet fleet-id --restored` to take on the engines this fleet runs now, or stop them by hand", e.PID, e.Launch, e.Last)
}

// judge says whether an engine whose environment names owner is the
// fleet's own: nil when it is (or names no owner: it predates identities),
// errOtherFleet, or a *NewerEngineError.
func (f Fleet) judge(pid int, owner Owner) error {
	if f.ID == "" || owner.FleetID == "" {
		return nil
	}
	if owner.FleetID != f.ID {
		return fmt.Errorf("%w (fleet %s; this is fleet %s)", errOtherFleet, owner.FleetID, f.ID)
	}
	if f.LastLaunch != nil {
		if last := f.LastLaunch(); owner.Launch > last {
			if f.OnNewer != nil {
				f.OnNewer(pid, owner.Launch)
			}
			return &NewerEngineError{PID: pid, Launch: owner.Launch, Last: last}
		}
	}
	return nil
}

// WithLogger sends enginectl's structured logs to l.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithPollInterval sets how often WaitReady and Stop look again (default 500ms).
func WithPollInterval(d time.Duration) Option { return func(o *options) { o.pollInterval = d } }

// WithStaleGrace sets how long CheckPort lets a stale engine exit after TERM
// before it sends KILL (default 15s).
func WithStaleGrace(d time.Duration) Option { return func(o *options) { o.staleGrace = d } }

func applyOptions(opts []Option) options {
	o := options{pollInterval: 500 * time.Millisecond, staleGrace: 15 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.pollInterval <= 0 {
		o.pollInterval = 500 * time.Millisecond
	}
	return o
}

// lockedWriter serialises writes from a command's stdout and stderr, which
// a transport may copy from two goroutines, and remembers whether what was
// written ends a line.
type lockedWriter struct {
	mu       sync.Mutex
	w        io.Writer
	openLine bool // the last write did not end with a newline
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(p) > 0 {
		l.openLine = p[len(p)-1] != '\n'
	}
	return l.w.Write(p)
}

// endLine ends the line a command left open (a progress bar's last
// "100.0%"), so what is written next starts a line of its own.
func (l *lockedWriter) endLine() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.openLine {
		_, _ = io.WriteString(l.w, "\n")
		l.openLine = false
	}
}
