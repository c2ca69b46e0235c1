package nodes

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"

	"fleet"
	"fleet/internal/sshdtest"
)

// A remote node's port cannot be test-bound from the hub, so the port fleet
// picks there may belong to an unrelated service: the worker leaves it alone
// and launches on the next port, at once and without a failure.
func TestManagerRemotePortHeldByAStranger(t *testing.T) {
	// The stranger is this test process, which is not the recipe's engine.
	ln, first := strangerBeforeFreePort(t)
	defer ln.Close()
	h := launchOnSSHNode(t, first)
	w := h.waitReady("rig/qwen3-4b")
	if w.Port == first || w.Restarts != 0 {
		t.Errorf("ready on port %d (stranger on %d) after %d restarts; want another port and no failure\n%s", w.Port, first, w.Restarts, h.rec.dump())
	}
	if !h.rec.eventLike("leaving it alone and taking another port") {
		t.Errorf("no event says the stranger's port was skipped:\n%s", h.rec.dump())
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Errorf("the stranger's listener was disturbed: %v", err)
	} else {
		c.Close()
	}
}

// launchOnSSHNode starts an sshd and a manager that may use ports first and
// first+1 only, and places the fake engine on the SSH node "rig" there.
func launchOnSSHNode(t *testing.T, first int) *harness {
	t.Helper()
	s := sshdtest.New(t)
	s.Start()
	remoteState := t.TempDir()
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.RemoteStateDir = remoteState
		o.PortMin, o.PortMax = first, first+1
	})
	cleanupEngines(t, h)
	h.m.SetDesired(fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "rig", Address: s.Address(), Identity: s.Identity()}},
		Models:     []fleet.Model{localModel()},
		Placements: []fleet.Placement{{Model: "qwen3-4b", Node: "rig"}},
	})
	h.run()
	return h
}

// strangerBeforeFreePort listens on a port whose next one is free, both
// below Linux's default ephemeral range (32768-60999), where an outgoing
// connection, such as the test's own SSH ones, cannot take the free one.
func strangerBeforeFreePort(t *testing.T) (net.Listener, int) {
	t.Helper()
	for range 100 {
		p := 29000 + rand.IntN(3000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		if next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1)); err == nil {
			next.Close()
			return ln, p
		}
		ln.Close()
	}
	t.Fatal("no two free ports in a row in 29000-32000")
	return nil, 0
}

// A port with no listener can still be unbindable: the local end of a
// connection holds it (the hub's own SSH connections take ports like that).
// The check before the launch sees it free; the engine's bind fails; the
// worker then moves to another port at once, instead of relaunching on the
// same one for ever (152 times in 60 s in one CI run).
func TestManagerRemotePortHeldByAConnection(t *testing.T) {
	ln, first := strangerBeforeFreePort(t)
	ln.Close()
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: first}}
	conn, err := d.Dial("tcp", peer.Addr().String())
	if err != nil {
		t.Skipf("could not dial from port %d to hold it: %v", first, err)
	}
	defer conn.Close()
	if probe, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first)); err == nil {
		probe.Close()
		t.Skipf("this kernel lets a listener bind port %d beside a connection from it; nothing to test", first)
	}
	h := launchOnSSHNode(t, first)
	w := h.waitReady("rig/qwen3-4b")
	if w.Port == first {
		t.Errorf("ready on port %d, which a connection holds", w.Port)
	}
	if !h.rec.eventLike("could not bind its port") {
		t.Errorf("no event says the engine could not bind its port:\n%s", h.rec.dump())
	}
}
