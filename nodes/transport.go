// Package nodes reaches the machines of a fleet and keeps their workers in
// their desired state. A Transport runs commands on one node and dials ports
// as seen from that node; Probe learns the node's platform through it; the
// Manager reconciles the declared placements against what runs, driving one
// engine at a time through enginectl.
//
// Three transports exist: local (the hub's own machine), sim (a node that
// runs its engines on the hub's machine but reports a simulated profile's
// platform) and ssh (a real remote node reached with golang.org/x/crypto/ssh,
// nothing installed on it but a POSIX shell).
package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"fleet"
	"fleet/enginectl"
)

// Transport reaches one node. It is an enginectl.Runner: Run executes an
// argv on the node (a non-zero exit is an error with ExitCode() int) and
// DialContext opens a connection to an address as the node itself sees it,
// so "127.0.0.1:18000" means the node's loopback.
type Transport interface {
	enginectl.Runner
	Close() error
	// Name is the node's name, for logs and errors.
	Name() string
}

// ExitError is a command that ran on a node and exited unsuccessfully. Both
// transports report "command not found" as exit status 127, the way a shell
// does, so callers see the same thing locally and over SSH.
type ExitError struct {
	Node string
	Argv []string
	Code int
	// Signal is set when the command was killed by a signal ("KILL").
	Signal string
	Err    error
}

// ExitCode is the command's exit status, or -1 when a signal ended it.
func (e *ExitError) ExitCode() int { return e.Code }

func (e *ExitError) Error() string {
	cmd := ShellQuote(e.Argv)
	if len(cmd) > 120 {
		cmd = cmd[:117] + "..."
	}
	if e.Signal != "" {
		return fmt.Sprintf("node %s: %s was killed by signal %s", e.Node, cmd, e.Signal)
	}
	if e.Code == 127 {
		return fmt.Sprintf("node %s: %s: command not found (exit status 127); install it on the node or give the recipe a bin: path", e.Node, cmd)
	}
	return fmt.Sprintf("node %s: %s exited with status %d", e.Node, cmd, e.Code)
}

func (e *ExitError) Unwrap() error { return e.Err }

// ErrNoCommand is returned by Run when argv is empty.
var ErrNoCommand = errors.New("empty command: argv needs at least the program name")

// Options configure how Open reaches a node. Zero values are sensible
// defaults, except that sim nodes need SimPlatform and ssh nodes HostKeys.
type Options struct {
	Logger *slog.Logger
	// DataDir is the hub's data directory; local and sim nodes keep their
	// engines' pid and log files under DataDir/nodes/NAME so that two sim
	// nodes on one machine never share a state directory.
	DataDir string
	// SimPlatform resolves a sim profile name to the platform its node
	// reports (the hub passes profiles.Lookup's platform).
	SimPlatform func(profile string) (fleet.Platform, error)
	// HostKeys pins SSH host keys. Required for ssh nodes.
	HostKeys HostKeyStore
	// OnEvent receives events worth an operator's attention, such as a host
	// key pinned on first contact. May be nil.
	OnEvent func(fleet.Event)
	// AgentSocket is the ssh-agent socket; empty means $SSH_AUTH_SOCK.
	AgentSocket string
	// ConnectTimeout bounds TCP connect plus SSH handshake (default 10s).
	ConnectTimeout time.Duration
	// CommandTimeout bounds a Run whose context has no deadline (default 10m;
	// installs get their own, longer, deadline from the caller).
	CommandTimeout time.Duration
	// KeepaliveInterval is how often an idle SSH connection is checked
	// (default 5s); after KeepaliveMissed unanswered checks (default 3) the
	// connection is dropped so running commands fail instead of hanging.
	KeepaliveInterval time.Duration
	KeepaliveMissed   int
	// ReconnectBackoffMax caps the wait between reconnect attempts (default 30s).
	ReconnectBackoffMax time.Duration
	// OnLink hears at once about changes of an SSH node's connection:
	// suspect at its first unanswered keepalive (err says so), up again
	// when one is answered, lost when it ended (err says why). May be nil.
	OnLink func(node string, state LinkState, err error)
}

// LinkState is the health of an SSH node's connection.
type LinkState int

const (
	// LinkUp: keepalives are answered.
	LinkUp LinkState = iota
	// LinkSuspect: a keepalive went unanswered; the connection is kept, so
	// a blip costs nothing but new requests, which go elsewhere.
	LinkSuspect
	// LinkLost: the connection ended; every session and tunnel on it failed.
	LinkLost
)

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

func (o Options) withDefaults() Options {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = 10 * time.Minute
	}
	if o.KeepaliveInterval <= 0 {
		o.KeepaliveInterval = 5 * time.Second
	}
	if o.KeepaliveMissed <= 0 {
		o.KeepaliveMissed = 3
	}
	if o.ReconnectBackoffMax <= 0 {
		o.ReconnectBackoffMax = 30 * time.Second
	}
	return o
}

// NodeStateDir is where a local or sim node keeps its engines' pid and log
// files: a folder per node under the hub's data dir.
func NodeStateDir(dataDir, node string) string {
	return filepath.Join(dataDir, "nodes", node)
}

// Open returns a transport to node, chosen by its address: "local",
// "sim:PROFILE" or "user@host[:port]". An ssh transport connects before Open
// returns, so an unreachable node, a refused key or a changed host key is
// reported here; later losses of the connection are repaired on demand.
func Open(ctx context.Context, node fleet.Node, opts Options) (Transport, error) {
	opts = opts.withDefaults()
	if node.Name == "" {
		return nil, errors.New("node has no name: give every node a name in the fleet file")
	}
	switch {
	case node.Address == fleet.AddressLocal:
		return newLocal(node.Name, opts), nil
	case strings.HasPrefix(node.Address, fleet.AddressSimPrefix):
		profile, _ := node.SimProfile()
		if profile == "" {
			return nil, fmt.Errorf("node %s: address %q names no sim profile; write it as sim:PROFILE, e.g. sim:m4max-llamacpp", node.Name, node.Address)
		}
		if opts.SimPlatform == nil {
			return nil, fmt.Errorf("node %s: simulated nodes need a sim profile lookup and none is configured: set nodes.Options.SimPlatform (a hub sets it from hub.Options.SimProfile), or give the node a user@host or %q address", node.Name, fleet.AddressLocal)
		}
		platform, err := opts.SimPlatform(profile)
		if err != nil {
			return nil, fmt.Errorf("node %s: sim profile %q: %w", node.Name, profile, err)
		}
		platform.Profile = profile
		return newSim(node.Name, platform, opts), nil
	case node.Address == "":
		return nil, fmt.Errorf("node %s has no address: use user@host[:port], %q or sim:PROFILE", node.Name, fleet.AddressLocal)
	default:
		t, err := newSSH(node, opts)
		if err != nil {
			return nil, err
		}
		if _, err := t.connected(ctx); err != nil {
			t.Close()
			return nil, err
		}
		return t, nil
	}
}
