package nodes

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"fleet"
)

// sshTransport reaches a node over one multiplexed SSH connection, redialled
// with backoff when it drops.
type sshTransport struct {
	node     fleet.Node
	user     string
	addr     string // host:port
	opts     Options
	logger   *slog.Logger
	identity string // expanded identity path, "" for the agent

	mu     sync.Mutex
	client *ssh.Client
	// dialing is closed when the dial in progress ends; nil when none is.
	// Callers wait on it, not on mu, so a dial to a silent host holds up
	// only those that need the connection and are willing to wait.
	dialing     chan struct{}
	stopKeep    chan struct{}
	failures    int
	nextAttempt time.Time
	lastErr     error
	// suspect is set while a keepalive on client goes unanswered.
	suspect bool
	// checking is set while a CheckLink keepalive is out.
	checking bool
	// lost says why lostClient ended, for the errors of calls that were
	// using it (instead of "EOF").
	lost       error
	lostClient *ssh.Client
	closed     bool
}

// ParseSSHAddress splits "user@host[:port]" (IPv6 hosts in brackets). A
// missing user is the hub's own user; a missing port is 22.
func ParseSSHAddress(address string) (userName, hostPort string, err error) {
	rest := address
	if i := strings.LastIndex(address, "@"); i >= 0 {
		userName, rest = address[:i], address[i+1:]
		if userName == "" {
			return "", "", fmt.Errorf("address %q has an empty user before '@': write it as user@host[:port]", address)
		}
	}
	if rest == "" {
		return "", "", fmt.Errorf("address %q has no host: write it as user@host[:port]", address)
	}
	host, port := rest, "22"
	if h, p, splitErr := net.SplitHostPort(rest); splitErr == nil {
		host, port = h, p
	} else if strings.HasPrefix(rest, "[") && strings.HasSuffix(rest, "]") {
		host = rest[1 : len(rest)-1]
	} else if strings.Count(rest, ":") == 1 {
		return "", "", fmt.Errorf("address %q: %v; write it as user@host[:port]", address, splitErr)
	}
	if host == "" {
		return "", "", fmt.Errorf("address %q has no host: write it as user@host[:port]", address)
	}
	if n, convErr := strconv.Atoi(port); convErr != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("address %q: port %q is not a number between 1 and 65535", address, port)
	}
	if strings.ContainsAny(host, " /\t\n") {
		return "", "", fmt.Errorf("address %q: host %q is not a host name or IP address", address, host)
	}
	if userName == "" {
		u, uerr := user.Current()
		if uerr != nil {
			return "", "", fmt.Errorf("address %q names no user and the hub's own user is unknown (%v): write it as user@host", address, uerr)
		}
		userName = u.Username
	}
	return userName, net.JoinHostPort(host, port), nil
}

func newSSH(node fleet.Node, opts Options) (*sshTransport, error) {
	userName, addr, err := ParseSSHAddress(node.Address)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node.Name, err)
	}
	if opts.HostKeys == nil {
		return nil, fmt.Errorf("node %s: no host key store configured, refusing to connect without host key pinning", node.Name)
	}
	t := &sshTransport{
		node:   node,
		user:   userName,
		addr:   addr,
		opts:   opts,
		logger: opts.logger().With("node", node.Name, "addr", addr),
	}
	if node.Identity != "" {
		t.identity, err = expandHome(node.Identity)
		if err != nil {
			return nil, fmt.Errorf("node %s: identity %q: %w", node.Name, node.Identity, err)
		}
	}
	return t, nil
}

func expandHome(path string) (string, error) {
	if path != "~" && !strings.HasPrefix(path, "~/") {
		return path, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("cannot expand ~: %w", err)
	}
	return filepath.Join(home, strings.TrimPrefix(path, "~")), nil
}

func (t *sshTransport) Name() string { return t.node.Name }

// connected returns a live client, dialling one if needed. After a failed
// attempt the next one waits out a growing backoff; calls in between fail at
// once with the last error instead of hammering a dead host. The dial runs
// without the lock: callers arriving meanwhile wait for its outcome as long
// as their ctx allows.
func (t *sshTransport) connected(ctx context.Context) (*ssh.Client, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, fmt.Errorf("node %s: transport closed", t.node.Name)
		}
		if t.client != nil {
			c := t.client
			t.mu.Unlock()
			return c, nil
		}
		if wait := t.dialing; wait != nil {
			t.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("node %s: waiting for the connection: %w", t.node.Name, context.Cause(ctx))
			}
		}
		if wait := time.Until(t.nextAttempt); wait > 0 && t.lastErr != nil {
			err := t.lastErr
			t.mu.Unlock()
			return nil, fmt.Errorf("%w (next connection attempt in %s)", err, wait.Round(time.Second))
		}
		done := make(chan struct{})
		t.dialing = done
		t.mu.Unlock()

		client, err := t.dial(ctx)

		t.mu.Lock()
		t.dialing = nil
		close(done)
		if t.closed {
			t.mu.Unlock()
			if client != nil {
				client.Close()
			}
			return nil, fmt.Errorf("node %s: transport closed", t.node.Name)
		}
		if err != nil {
			t.failures++
			backoff := min(time.Second<<min(t.failures-1, 10), t.opts.ReconnectBackoffMax)
			t.nextAttempt = time.Now().Add(backoff)
			t.lastErr = err
			t.mu.Unlock()
			return nil, err
		}
		if t.failures > 0 {
			t.logger.Info("reconnected", "after_failures", t.failures)
		}
		t.failures, t.lastErr, t.suspect = 0, nil, false
		t.client = client
		stop := make(chan struct{})
		t.stopKeep = stop
		t.mu.Unlock()
		go t.keepalive(client, stop)
		go t.watch(client)
		return client, nil
	}
}

// watch forgets a connection once it ended (remote closed, keepalives went
// unanswered, or Close) so the next call redials, and says so at once.
func (t *sshTransport) watch(client *ssh.Client) {
	err := client.Wait()
	t.mu.Lock()
	if t.client != client {
		t.mu.Unlock()
		return
	}
	t.client = nil
	t.suspect = false
	close(t.stopKeep)
	reason := error(nil)
	if t.lostClient == client {
		reason = t.lost
	}
	if reason == nil {
		reason = fmt.Errorf("the connection closed (%v)", cmp.Or(errText(err), "EOF"))
		t.lost, t.lostClient = reason, client
	}
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return
	}
	t.logger.Warn("connection lost", "reason", reason)
	t.link(LinkLost, reason)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// lostReason is why client's connection ended, or nil while it has not.
func (t *sshTransport) lostReason(client *ssh.Client) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lostClient == client {
		return t.lost
	}
	return nil
}

// loseWith ends client's connection for the given reason.
func (t *sshTransport) loseWith(client *ssh.Client, reason error) {
	t.mu.Lock()
	if t.lostClient != client {
		t.lost, t.lostClient = reason, client
	}
	t.mu.Unlock()
	client.Close()
}

// setSuspect records whether client's connection is suspect and reports a
// change.
func (t *sshTransport) setSuspect(client *ssh.Client, suspect bool, reason error) {
	t.mu.Lock()
	if t.client != client || t.suspect == suspect {
		t.mu.Unlock()
		return
	}
	t.suspect = suspect
	t.mu.Unlock()
	if suspect {
		t.logger.Warn("node suspect", "reason", reason)
		t.link(LinkSuspect, reason)
	} else {
		t.logger.Info("node answers keepalives again")
		t.link(LinkUp, nil)
	}
}

func (t *sshTransport) link(state LinkState, err error) {
	if t.opts.OnLink != nil {
		t.opts.OnLink(t.node.Name, state, err)
	}
}

// CheckLink sends one keepalive now and waits up to timeout for its answer:
// nil when it came, an error (and the connection marked suspect until a
// keepalive is answered) when not. For when traffic suggests the node went
// silent before the next regular keepalive would tell.
func (t *sshTransport) CheckLink(ctx context.Context, timeout time.Duration) error {
	t.mu.Lock()
	client, busy := t.client, t.checking
	if client != nil && !busy {
		t.checking = true
	}
	t.mu.Unlock()
	if client == nil {
		return fmt.Errorf("node %s is not connected", t.node.Name)
	}
	if busy {
		return fmt.Errorf("node %s: a check is already out", t.node.Name)
	}
	defer func() {
		t.mu.Lock()
		t.checking = false
		t.mu.Unlock()
	}()
	reply := make(chan error, 1)
	go func() {
		_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
		reply <- err
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-reply:
		if err != nil {
			return fmt.Errorf("node %s: %w", t.node.Name, err)
		}
		t.setSuspect(client, false, nil)
		return nil
	case <-timer.C:
		err := fmt.Errorf("no answer to a keepalive in %s", timeout)
		t.setSuspect(client, true, err)
		return fmt.Errorf("node %s: %w", t.node.Name, err)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// resetBackoff lets the next call dial at once.
func (t *sshTransport) resetBackoff() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failures, t.nextAttempt = 0, time.Time{}
}

func (t *sshTransport) dial(ctx context.Context) (*ssh.Client, error) {
	name := t.node.Name
	auth, closeAuth, err := t.authMethod()
	if err != nil {
		return nil, err
	}
	defer closeAuth()

	var changed *HostKeyChangedError
	var pinErr error
	cfg := &ssh.ClientConfig{
		User:    t.user,
		Auth:    []ssh.AuthMethod{auth},
		Timeout: t.opts.ConnectTimeout,
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			presented := FormatHostKey(key)
			pinned, err := t.opts.HostKeys.PinnedHostKey(ctx, name)
			if err != nil {
				pinErr = fmt.Errorf("node %s: reading the pinned host key: %w", name, err)
				return pinErr
			}
			if pinned == "" {
				if err := t.opts.HostKeys.PinHostKey(ctx, name, presented); err != nil {
					pinErr = fmt.Errorf("node %s: pinning the host key: %w", name, err)
					return pinErr
				}
				fp := ssh.FingerprintSHA256(key)
				t.logger.Info("host key pinned on first contact", "fingerprint", fp)
				t.event("info", fmt.Sprintf("host key %s %s pinned on first contact", key.Type(), fp))
				return nil
			}
			if pinned != presented {
				was := HostKeyFingerprint(pinned)
				if was == "" {
					was = "an unparsable key"
				}
				changed = &HostKeyChangedError{Node: name, Was: was, Now: ssh.FingerprintSHA256(key)}
				return changed
			}
			return nil
		},
	}

	d := net.Dialer{Timeout: t.opts.ConnectTimeout, KeepAlive: 15 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, fmt.Errorf("node %s unreachable: %w", name, err)
	}
	// The handshake has no context of its own: bound it by the timeout and
	// abort it if ctx ends first.
	_ = conn.SetDeadline(time.Now().Add(t.opts.ConnectTimeout))
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	c, chans, reqs, err := ssh.NewClientConn(conn, t.addr, cfg)
	stop()
	if err != nil {
		conn.Close()
		switch {
		case changed != nil:
			t.logger.Error("host key changed: refusing the node", "was", changed.Was, "now", changed.Now)
			t.event("error", changed.Error())
			return nil, changed
		case pinErr != nil:
			return nil, pinErr
		case ctx.Err() != nil:
			return nil, fmt.Errorf("node %s: connecting: %w", name, context.Cause(ctx))
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, fmt.Errorf("node %s: %s@%s refused our key (%w); add the hub's public key to ~%s/.ssh/authorized_keys on the node",
				name, t.user, t.addr, err, t.user)
		}
		return nil, fmt.Errorf("node %s: SSH handshake with %s: %w", name, t.addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// authMethod is public-key only: the node's identity file, else the agent.
func (t *sshTransport) authMethod() (ssh.AuthMethod, func(), error) {
	name := t.node.Name
	if t.identity != "" {
		pem, err := os.ReadFile(t.identity)
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: reading identity file: %w", name, err)
		}
		signer, err := ssh.ParsePrivateKey(pem)
		var missing *ssh.PassphraseMissingError
		if errors.As(err, &missing) {
			return nil, nil, fmt.Errorf("node %s: identity file %s is protected by a passphrase; load it into ssh-agent (ssh-add %s) and drop identity: from the node", name, t.identity, t.identity)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("node %s: identity file %s is not a private key: %w", name, t.identity, err)
		}
		return ssh.PublicKeys(signer), func() {}, nil
	}
	sock := t.opts.AgentSocket
	if sock == "" {
		sock = os.Getenv("SSH_AUTH_SOCK")
	}
	if sock == "" {
		return nil, nil, fmt.Errorf("node %s: no identity file and no ssh-agent (SSH_AUTH_SOCK is not set); set identity: for the node or start an agent", name)
	}
	conn, err := net.DialTimeout("unix", sock, t.opts.ConnectTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: ssh-agent at %s: %w", name, sock, err)
	}
	return ssh.PublicKeysCallback(agent.NewClient(conn).Signers), func() { conn.Close() }, nil
}

// keepalive marks the connection suspect at its first unanswered check
// and healthy again when one is answered; it drops the connection after
// KeepaliveMissed unanswered checks in a row, which makes every command and
// tunnel on it fail at once: a node that vanished without closing its
// socket gives an error, not a hang.
func (t *sshTransport) keepalive(client *ssh.Client, stop <-chan struct{}) {
	every := t.opts.KeepaliveInterval
	tick := time.NewTicker(every)
	defer tick.Stop()
	missed := 0
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		reply := make(chan error, 1)
		go func() {
			_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
			reply <- err
		}()
		timer := time.NewTimer(every)
		select {
		case <-stop:
			timer.Stop()
			return
		case err := <-reply:
			timer.Stop()
			if err != nil {
				t.loseWith(client, fmt.Errorf("keepalive failed: %w", err))
				return
			}
			missed = 0
			t.setSuspect(client, false, nil)
		case <-timer.C:
			missed++
			if missed >= t.opts.KeepaliveMissed {
				reason := fmt.Errorf("no answer to %d keepalives in %s", missed, time.Duration(missed)*every)
				t.logger.Warn("node stopped answering keepalives; dropping the connection", "missed", missed)
				t.loseWith(client, reason)
				return
			}
			t.setSuspect(client, true, fmt.Errorf("no answer to a keepalive in %s", every))
		}
	}
}

func (t *sshTransport) Run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(argv) == 0 {
		return ErrNoCommand
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.opts.CommandTimeout)
		defer cancel()
	}
	client, err := t.connected(ctx)
	if err != nil {
		return err
	}
	sess, err := client.NewSession()
	if err != nil {
		t.drop(client)
		if lost := t.lostReason(client); lost != nil {
			return fmt.Errorf("node %s: connection lost: %w", t.node.Name, lost)
		}
		return fmt.Errorf("node %s: opening a session: %w", t.node.Name, err)
	}
	defer sess.Close()
	pid := &pidFilter{w: stderr, ready: make(chan struct{})}
	sess.Stdin, sess.Stdout, sess.Stderr = stdin, stdout, pid
	wrapped := append([]string{"sh", "-c", runWrapper, "fleet-run"}, argv...)
	if err := sess.Start(ShellQuote(wrapped)); err != nil {
		return fmt.Errorf("node %s: starting %s: %w", t.node.Name, argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		t.killRemote(client, pid)
		sess.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		return fmt.Errorf("node %s: %s: %w", t.node.Name, argv[0], context.Cause(ctx))
	}
	if err == nil {
		return nil
	}
	var exitErr *ssh.ExitError
	if errors.As(err, &exitErr) {
		e := &ExitError{Node: t.node.Name, Argv: argv, Code: exitErr.ExitStatus(), Err: err}
		if sig := exitErr.Signal(); sig != "" {
			e.Code, e.Signal = -1, sig
		}
		return e
	}
	// No exit status: the connection went away under the command.
	t.drop(client)
	if lost := t.lostReason(client); lost != nil {
		err = lost
	}
	return fmt.Errorf("node %s: connection lost while running %s: %w", t.node.Name, argv[0], err)
}

// runWrapper reports the command's PID on stderr before becoming the
// command. sshd cannot be relied on to deliver signals (OpenSSH refuses them
// for root sessions and older servers ignore them) and closing a session does
// not end a process that is not writing, so a cancelled command is killed by
// PID from a second session.
const runWrapper = `printf '@@fleet-pid %s\n' "$$" >&2; exec "$@"`

// killTreeScript stops a process, kills its descendants, then kills it;
// stopping first keeps it from spawning more while the tree is walked.
const killTreeScript = `kill_tree() {
	kill -STOP "$1" 2>/dev/null
	for c in $(ps -A -o pid= -o ppid= | awk -v p="$1" '$2 == p { print $1 }'); do kill_tree "$c"; done
	kill -KILL "$1" 2>/dev/null
}
case $1 in ''|*[!0-9]*|0|1) exit 64 ;; esac
kill_tree "$1"`

// killRemote kills a cancelled command on the node, if it reported its PID.
func (t *sshTransport) killRemote(client *ssh.Client, pid *pidFilter) {
	select {
	case <-pid.ready:
	default:
		return // never started: nothing to kill
	}
	if pid.pid <= 1 {
		return
	}
	sess, err := client.NewSession()
	if err != nil {
		t.logger.Warn("cannot open a session to kill a cancelled command", "pid", pid.pid, "err", err)
		return
	}
	defer sess.Close()
	done := make(chan error, 1)
	go func() {
		done <- sess.Run(ShellQuote([]string{"sh", "-c", killTreeScript, "fleet-kill", strconv.Itoa(pid.pid)}))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.logger.Warn("killing a cancelled command failed", "pid", pid.pid, "err", err)
		}
	case <-time.After(5 * time.Second):
		t.logger.Warn("killing a cancelled command timed out", "pid", pid.pid)
	}
}

// pidFilter takes the wrapper's "@@fleet-pid N" first line off a command's
// stderr and passes everything after it through.
type pidFilter struct {
	w     io.Writer
	line  []byte
	pid   int
	ready chan struct{}
	done  bool
}

func (f *pidFilter) Write(p []byte) (int, error) {
	n := len(p)
	if !f.done {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.line = append(f.line, p...)
			if len(f.line) > 64 { // not our line: give it back untouched
				f.done = true
				close(f.ready)
				return n, f.forward(f.line)
			}
			return n, nil
		}
		f.line = append(f.line, p[:i+1]...)
		p = p[i+1:]
		f.done = true
		if rest, ok := strings.CutPrefix(strings.TrimSpace(string(f.line)), "@@fleet-pid "); ok {
			f.pid, _ = strconv.Atoi(rest)
		} else if err := f.forward(f.line); err != nil {
			close(f.ready)
			return n, err
		}
		close(f.ready)
	}
	return n, f.forward(p)
}

func (f *pidFilter) forward(p []byte) error {
	if f.w == nil || len(p) == 0 {
		return nil
	}
	_, err := f.w.Write(p)
	return err
}

// DialContext opens a tunnel through the live connection. It never dials
// the node itself: a tunnel is wanted now (a request is waiting, and may go
// to another worker), so without a connection it fails at once and the
// node's watcher reconnects.
func (t *sshTransport) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	t.mu.Lock()
	client, closed, lost, lastErr := t.client, t.closed, t.lost, t.lastErr
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("node %s: transport closed", t.node.Name)
	}
	if client == nil {
		why := cmp.Or(lastErr, lost)
		if why == nil {
			return nil, fmt.Errorf("node %s is not connected", t.node.Name)
		}
		return nil, fmt.Errorf("node %s is not connected: %w", t.node.Name, why)
	}
	conn, err := client.DialContext(ctx, network, addr)
	if err != nil {
		if lost := t.lostReason(client); lost != nil {
			err = lost
		}
		return nil, fmt.Errorf("node %s: tunnel to %s: %w", t.node.Name, addr, err)
	}
	return conn, nil
}

// drop closes a client that proved broken so the next call redials.
func (t *sshTransport) drop(client *ssh.Client) {
	client.Close()
}

func (t *sshTransport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.client != nil {
		err := t.client.Close()
		return err
	}
	return nil
}

func (t *sshTransport) event(level, msg string) {
	if t.opts.OnEvent != nil {
		t.opts.OnEvent(fleet.Event{At: time.Now(), Level: level, Subject: t.node.Name, Message: msg})
	}
}
