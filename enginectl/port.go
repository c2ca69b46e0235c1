package enginectl

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// ErrPortTaken means a process that is not one of our engines holds the port.
var ErrPortTaken = errors.New("port taken by a stranger")

// PortOwner is what held an engine's port before launch.
type PortOwner struct {
	// PID is 0 when the port was free.
	PID  int
	PGID int
	Exe  string
	// Argv is the owner's command line (split on spaces where the node
	// cannot give the exact argv).
	Argv []string
	// Stale is true when the owner ran from the engine's binary path and
	// CheckPort stopped it.
	Stale bool
	// Message is the operator-facing line about what CheckPort did, for the
	// node's event log; "" when the port was free.
	Message string
}

// listener is one process holding a listening socket on a port.
type listener struct {
	PID, PGID int // 0 when the node does not let us see the owner
}

func listeners(ctx context.Context, r Runner, port int) ([]listener, error) {
	out, err := runScript(ctx, r, "listeners", strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("who listens on port %d: %w", port, err)
	}
	var ls []listener
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, _ := strconv.Atoi(f[0])
		pgid, _ := strconv.Atoi(f[1])
		ls = append(ls, listener{PID: pid, PGID: pgid})
	}
	return ls, nil
}

// CheckPort clears the way for an engine on port before it is launched.
// A listener there is not ours (ours would have been adopted): when it runs
// from the engine's binary path bin (for a simulated engine, the fleet
// binary) it is a stale engine and is stopped, TERM then KILL, with its
// process group when it leads one; anything else is refused with an error
// naming its PID and command, and left alone.
func CheckPort(ctx context.Context, r Runner, port int, bin string, opts ...Option) (PortOwner, error) {
	o := applyOptions(opts)
	if port < 1 || port > 65535 {
		return PortOwner{}, fmt.Errorf("check port: %d is not a TCP port (1-65535)", port)
	}
	ls, err := listeners(ctx, r, port)
	if err != nil {
		return PortOwner{}, err
	}
	if len(ls) == 0 {
		return PortOwner{}, nil
	}
	resolved := resolveBin(ctx, r, bin)
	var stale []PortOwner
	for _, l := range ls {
		if l.PID == 0 {
			return PortOwner{}, fmt.Errorf("port %d is held by a process this account cannot see (another user's?); stop it on the node or use another port: %w", port, ErrPortTaken)
		}
		info, alive, err := readArgv(ctx, r, l.PID)
		if err != nil {
			return PortOwner{}, fmt.Errorf("port %d: reading the command of PID %d: %w", port, l.PID, err)
		}
		if !alive {
			continue // exited while we looked
		}
		owner := ownerOf(l, info)
		if !runsFrom(info, owner.Argv, bin, resolved) {
			return owner, fmt.Errorf("port %d is already in use by PID %d (%s), which is not %s; stop it or move the engine to another port: %w",
				port, l.PID, commandLine(owner), bin, ErrPortTaken)
		}
		// Our binary, but maybe not our engine: another fleet's (a second
		// hub on the node) is left alone like any stranger.
		if err := o.fleet.judge(l.PID, info.Owner); errors.Is(err, errOtherFleet) {
			return owner, fmt.Errorf("port %d is in use by PID %d (%s), an engine of another fleet: %v; it is left alone: %w",
				port, l.PID, commandLine(owner), err, ErrPortTaken)
		} else if err != nil {
			return owner, fmt.Errorf("port %d: %w", port, err)
		}
		stale = append(stale, owner)
	}
	if len(stale) == 0 {
		return PortOwner{}, nil
	}
	name := path.Base(bin)
	first := stale[0]
	first.Stale = true
	first.Message = fmt.Sprintf("%s already answering on port %d without a process of ours; stopping the stale one (PID %d)", name, port, first.PID)
	o.logger.Warn(first.Message, "port", port, "pid", first.PID, "argv", first.Argv)
	for _, s := range stale {
		if s.PGID == s.PID {
			err = stopGroup(ctx, r, s.PID, s.PGID, o.staleGrace, o)
		} else {
			// Not a group leader: its group is someone else's (a shell, a
			// supervisor), so only the process itself is ours to stop.
			err = stopPID(ctx, r, s.PID, o)
		}
		if err != nil {
			return first, fmt.Errorf("stopping the stale %s on port %d: %w", name, port, err)
		}
	}
	if ls, err := listeners(ctx, r, port); err != nil {
		return first, err
	} else if len(ls) > 0 {
		return first, fmt.Errorf("port %d still has a listener (PID %d) after stopping the stale %s: %w", port, ls[0].PID, name, ErrPortTaken)
	}
	return first, nil
}

func stopPID(ctx context.Context, r Runner, pid int, o options) error {
	for _, sig := range []string{"TERM", "KILL"} {
		if _, err := runScript(ctx, r, "signalpid", sig, strconv.Itoa(pid)); err != nil {
			return err
		}
		within := o.staleGrace
		if sig == "KILL" {
			within = 10 * o.pollInterval
		}
		if gone, err := waitPIDGone(ctx, r, pid, within, o.pollInterval); err != nil || gone {
			return err
		}
	}
	return fmt.Errorf("PID %d survives KILL", pid)
}

func waitPIDGone(ctx context.Context, r Runner, pid int, within, every time.Duration) (bool, error) {
	deadline := time.Now().Add(within)
	for {
		alive, err := Alive(ctx, r, pid)
		if err != nil || !alive {
			return !alive, err
		}
		if !time.Now().Before(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(every):
		}
	}
}

// resolveBin is where bin lives on the node ("" when it is not found there).
func resolveBin(ctx context.Context, r Runner, bin string) string {
	out, err := runScript(ctx, r, "which", bin)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// runsFrom tells a stale engine from a stranger: its executable, argv[0],
// or (for an interpreted engine like vllm) its script argv[1] is the
// engine's binary.
func runsFrom(info procInfo, argv []string, bin, resolved string) bool {
	match := func(s string) bool {
		if s == "" {
			return false
		}
		if s == bin || (resolved != "" && s == resolved) {
			return true
		}
		// A bare name like "llama-server" was looked up in PATH at launch,
		// so argv[0] is that name; an absolute bin must match exactly.
		return !strings.Contains(bin, "/") && path.Base(s) == bin && (resolved == "" || !strings.Contains(s, "/"))
	}
	if match(info.Exe) {
		return true
	}
	if len(argv) > 0 && match(argv[0]) {
		return true
	}
	return len(argv) > 1 && isInterpreter(argv[0]) && match(argv[1])
}

func isInterpreter(s string) bool {
	b := path.Base(s)
	return strings.HasPrefix(b, "python") || b == "sh" || b == "bash" || b == "perl" || b == "node"
}

func ownerOf(l listener, info procInfo) PortOwner {
	o := PortOwner{PID: l.PID, PGID: l.PGID, Exe: info.Exe, Argv: info.Argv}
	if o.Argv == nil {
		o.Argv = strings.Fields(info.Args)
	}
	return o
}

func commandLine(o PortOwner) string {
	if len(o.Argv) > 0 {
		return strings.Join(o.Argv, " ")
	}
	if o.Exe != "" {
		return o.Exe
	}
	return "unknown command"
}
