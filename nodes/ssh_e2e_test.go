package nodes

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"fleet"
	"fleet/internal/sshdtest"
)

type eventLog struct {
	mu     sync.Mutex
	events []fleet.Event
}

func (l *eventLog) add(e fleet.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) find(sub string) (fleet.Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if strings.Contains(e.Message, sub) {
			return e, true
		}
	}
	return fleet.Event{}, false
}

func TestSSHTransportRunsLikeLocal(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	keys := &MemoryHostKeys{}
	events := &eventLog{}
	ctx := context.Background()
	tr, err := Open(ctx, fleet.Node{Name: "rig", Address: s.Address(), Identity: s.Identity()}, Options{HostKeys: keys, OnEvent: events.add})
	if err != nil {
		t.Fatalf("Open: %v\nsshd log:\n%s", err, s.Log())
	}
	defer tr.Close()

	pinned, _ := keys.PinnedHostKey(ctx, "rig")
	if !strings.HasPrefix(pinned, "ssh-ed25519 ") {
		t.Errorf("pinned host key = %q, want the server's ed25519 key", pinned)
	}
	if e, ok := events.find("pinned on first contact"); !ok || e.Subject != "rig" {
		t.Errorf("no first-contact event for rig: %+v", events.events)
	}
	runnerCases(t, tr)

	t.Run("probe over ssh", func(t *testing.T) {
		p, err := Probe(ctx, tr)
		if err != nil {
			t.Fatal(err)
		}
		if p.OS != "linux" || p.MemTotalBytes == 0 {
			t.Errorf("probe = %+v", p)
		}
	})
}

func TestSSHTransportThroughAgent(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	keyring := agent.NewKeyring()
	raw, _ := os.ReadFile(s.Identity())
	key, err := ssh.ParseRawPrivateKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := keyring.Add(agent.AddedKey{PrivateKey: key}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); agent.ServeAgent(keyring, c) }()
		}
	}()
	ctx := context.Background()
	tr, err := Open(ctx, fleet.Node{Name: "ultra", Address: s.Address()}, Options{HostKeys: &MemoryHostKeys{}, AgentSocket: sock})
	if err != nil {
		t.Fatalf("Open via agent: %v", err)
	}
	defer tr.Close()
	var out strings.Builder
	if err := tr.Run(ctx, []string{"echo", "via agent"}, nil, &out, nil); err != nil || out.String() != "via agent\n" {
		t.Fatalf("Run = %q, %v", out.String(), err)
	}
}

func TestSSHRefusesChangedHostKey(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	keys := &MemoryHostKeys{}
	events := &eventLog{}
	ctx := context.Background()
	node := fleet.Node{Name: "rig", Address: s.Address(), Identity: s.Identity()}
	tr, err := Open(ctx, node, Options{HostKeys: keys, OnEvent: events.add})
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	before, _ := keys.PinnedHostKey(ctx, "rig")

	// Same address and port, another machine's key.
	s.Kill()
	s.RotateHostKey()
	s.Start()
	_, err = Open(ctx, node, Options{HostKeys: keys, OnEvent: events.add})
	var changed *HostKeyChangedError
	if !errors.As(err, &changed) {
		t.Fatalf("Open after host key change: err = %v, want a HostKeyChangedError", err)
	}
	msg := err.Error()
	for _, want := range []string{"host key of node rig changed", "was SHA256:", "now SHA256:", "fleet node trust rig"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if changed.Was == changed.Now {
		t.Errorf("was and now fingerprints are equal: %s", changed.Was)
	}
	if after, _ := keys.PinnedHostKey(ctx, "rig"); after != before {
		t.Error("a refused key replaced the pinned one")
	}
	if _, ok := events.find("changed"); !ok {
		t.Error("no event recorded for the changed host key")
	}

	// An operator trusting the new key lets the node in again.
	keys.PinHostKey(ctx, "rig", "")
	tr, err = Open(ctx, node, Options{HostKeys: keys})
	if err != nil {
		t.Fatalf("after trust: %v", err)
	}
	tr.Close()
}

func TestSSHRefusedKeyIsExplained(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	other := filepath.Join(t.TempDir(), "other_key")
	sshdtest.WriteKey(t, other)
	_, err := Open(context.Background(), fleet.Node{Name: "rig", Address: s.Address(), Identity: other}, Options{HostKeys: &MemoryHostKeys{}})
	if err == nil || !strings.Contains(err.Error(), "refused our key") || !strings.Contains(err.Error(), "authorized_keys") {
		t.Fatalf("err = %v, want it to say the key was refused and what to do", err)
	}
	_, err = Open(context.Background(), fleet.Node{Name: "rig", Address: s.Address(), Identity: filepath.Join(t.TempDir(), "missing")}, Options{HostKeys: &MemoryHostKeys{}})
	if err == nil || !strings.Contains(err.Error(), "identity file") {
		t.Fatalf("missing identity: err = %v", err)
	}
}

func TestSSHNodeKilledMidCommand(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	ctx := context.Background()
	tr, err := Open(ctx, fleet.Node{Name: "rig", Address: s.Address(), Identity: s.Identity()}, Options{HostKeys: &MemoryHostKeys{}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()

	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		pr, pw := io.Pipe()
		go func() {
			buf := make([]byte, 16)
			if n, _ := pr.Read(buf); n > 0 {
				close(started)
			}
			io.Copy(io.Discard, pr)
		}()
		done <- tr.Run(ctx, []string{"sh", "-c", "echo running; exec sleep 600"}, nil, pw, nil)
		pw.Close()
	}()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the remote command never started")
	}
	s.Kill()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run succeeded although sshd was killed under it")
		}
		var ec exitCoder
		if errors.As(err, &ec) {
			t.Errorf("a lost connection looks like an exit status: %v", err)
		}
		if !strings.Contains(err.Error(), "connection lost") {
			t.Errorf("error does not say the connection was lost: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run hung after sshd was killed")
	}

	// The node comes back: the transport reconnects on its own.
	s.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out strings.Builder
		err := tr.Run(ctx, []string{"echo", "back"}, nil, &out, nil)
		if err == nil && out.String() == "back\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnection after sshd came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSSHNodeVanishes cuts the network path without closing any socket, as a
// machine losing power does: only keepalives can notice, and they must.
func TestSSHNodeVanishes(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	proxy := newFreezableProxy(t, s.Addr())
	ctx := context.Background()
	u := strings.SplitN(s.Address(), "@", 2)[0]
	tr, err := Open(ctx, fleet.Node{Name: "rig", Address: u + "@" + proxy.addr(), Identity: s.Identity()}, Options{
		HostKeys: &MemoryHostKeys{}, KeepaliveInterval: 200 * time.Millisecond, KeepaliveMissed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Run(ctx, []string{"true"}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, []string{"sleep", "600"}, nil, nil, nil) }()
	time.Sleep(300 * time.Millisecond)
	proxy.freeze()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run succeeded on a vanished node")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run hung on a vanished node: keepalives did not drop the connection")
	}
}

// freezableProxy forwards TCP to a target until frozen, after which it
// silently swallows everything, keeping the sockets open.
type freezableProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen bool
}

func newFreezableProxy(t *testing.T, target string) *freezableProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezableProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(c, up)
			go p.pipe(up, c)
		}
	}()
	return p
}

func (p *freezableProxy) addr() string { return p.ln.Addr().String() }

func (p *freezableProxy) freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

func (p *freezableProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		frozen := p.frozen
		p.mu.Unlock()
		if frozen {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
