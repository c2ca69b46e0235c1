package nodes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"syscall"
	"time"

	"fleet"
)

// localTransport runs commands on the hub's own machine. A sim node is the
// same transport with a simulated platform attached.
type localTransport struct {
	name     string
	logger   *slog.Logger
	stateDir string
	timeout  time.Duration
	// simulated is set on sim nodes: the platform their probe reports.
	simulated *fleet.Platform
}

func newLocal(name string, opts Options) *localTransport {
	t := &localTransport{name: name, logger: opts.logger().With("node", name), timeout: opts.CommandTimeout}
	if opts.DataDir != "" {
		t.stateDir = NodeStateDir(opts.DataDir, name)
	}
	return t
}

func newSim(name string, platform fleet.Platform, opts Options) *localTransport {
	t := newLocal(name, opts)
	t.simulated = &platform
	return t
}

func (t *localTransport) Name() string { return t.name }

// StateDir is the node's folder under the hub's data dir, or "" for the
// engine controller's default (~/.fleet) when no data dir was configured.
func (t *localTransport) StateDir() string { return t.stateDir }

// SimulatedPlatform reports the profile's platform on a sim node.
func (t *localTransport) SimulatedPlatform() (fleet.Platform, bool) {
	if t.simulated == nil {
		return fleet.Platform{}, false
	}
	return *t.simulated, true
}

func (t *localTransport) Run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(argv) == 0 {
		return ErrNoCommand
	}
	if _, ok := ctx.Deadline(); !ok && t.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	// Its own process group, so a cancelled command takes its children with
	// it; engines detach into their own session and are not touched by this.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A detached grandchild that kept our stdout open must not hold Run
	// forever once the command itself has exited.
	cmd.WaitDelay = 3 * time.Second

	err := cmd.Run()
	if err == nil {
		return nil
	}
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		t.logger.Warn("command exited but a child kept its output open; not waiting for it", "argv", fleet.RedactArgv(argv))
		return nil
	}
	if errors.Is(err, exec.ErrNotFound) {
		return &ExitError{Node: t.name, Argv: argv, Code: 127, Err: err}
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		e := &ExitError{Node: t.name, Argv: argv, Code: exitErr.ExitCode(), Err: err}
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = signalName(ws.Signal())
		}
		return e
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

func (t *localTransport) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (t *localTransport) Close() error { return nil }

// signalName gives the SSH spelling of a signal ("KILL", "TERM"), so local
// and remote commands killed the same way report the same name.
func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "KILL"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGSEGV:
		return "SEGV"
	case syscall.SIGABRT:
		return "ABRT"
	case syscall.SIGPIPE:
		return "PIPE"
	}
	return s.String()
}
