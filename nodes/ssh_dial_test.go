package nodes

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/sshdtest"
)

// blackhole accepts TCP connections and never says a word, like a host
// whose network stack answers but whose sshd hangs: an SSH handshake with
// it lasts until the connect timeout.
func blackhole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				<-done
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); close(done) })
	return ln.Addr().String()
}

// A dial that hangs holds up no one who cannot wait: tunnels fail at once,
// and a command gives up when its own context ends, not when the dial does.
func TestDialDoesNotHoldOthersUp(t *testing.T) {
	const connectTimeout = 6 * time.Second
	tr, err := newSSH(fleet.Node{Name: "mac", Address: "u@" + blackhole(t)}, Options{
		HostKeys: &MemoryHostKeys{}, ConnectTimeout: connectTimeout, AgentSocket: "/nonexistent",
	}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	tr.identity = filepath.Join(t.TempDir(), "id_ed25519")
	sshdtest.WriteKey(t, tr.identity)
	defer tr.Close()
	first := make(chan error, 1)
	go func() { first <- tr.Run(context.Background(), []string{"true"}, nil, nil, nil) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tr.mu.Lock()
		busy := tr.dialing != nil
		tr.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first command never started dialling")
		}
	}

	start := time.Now()
	_, err = tr.DialContext(context.Background(), "tcp", "127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("tunnel while dialling: %v; want a refusal saying the node is not connected", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = tr.Run(ctx, []string{"true"}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "waiting for the connection") {
		t.Errorf("command with a short deadline while dialling: %v", err)
	}
	if took := time.Since(start); took > connectTimeout/2 {
		t.Errorf("the tunnel and the short command took %s: they waited for the dial (connect timeout %s)", took, connectTimeout)
	}
	select {
	case err := <-first:
		if err == nil {
			t.Error("the dial to a mute host succeeded")
		}
	case <-time.After(3 * connectTimeout):
		t.Fatal("the dial to a mute host never ended")
	}
}
