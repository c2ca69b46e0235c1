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
	s := sshdtest.New(t)
	s.Start()
	remoteState := t.TempDir()
	// The stranger is this test process, which is not the recipe's engine.
	ln, first := strangerBeforeFreePort(t)
	defer ln.Close()
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
