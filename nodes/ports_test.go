package nodes

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

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

// Another program takes a stopped worker's port while it is down: `start`
// moves the worker to a free port at once, as a first launch does, instead
// of failing on it into a restart backoff (40-50 s seen on a real node). The
// node is remote, where the hub cannot test-bind a port before the launch.
func TestManagerStartMovesOffAPortTakenWhileStopped(t *testing.T) {
	ln, first := strangerBeforeFreePort(t)
	ln.Close() // both first and first+1 free now
	h := launchOnSSHNode(t, first)
	w := h.waitReady("rig/qwen3-4b")
	if w.Port != first {
		t.Skipf("the worker took port %d, not the first free one %d; something else took it meanwhile", w.Port, first)
	}
	if err := h.m.StopWorker(t.Context(), w.Name()); err != nil {
		t.Fatal(err)
	}
	h.waitWorker(w.Name(), "stopped", func(w fleet.Worker) bool { return w.State == fleet.WorkerStopped })
	stranger, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first))
	if err != nil {
		t.Fatalf("the stopped worker's port %d is still held: %v", first, err)
	}
	defer stranger.Close()
	if err := h.m.StartWorker(t.Context(), w.Name()); err != nil {
		t.Fatalf("start with the worker's port taken by a stranger: %v\n%s", err, h.rec.dump())
	}
	w = h.waitReady(w.Name())
	if w.Port != first+1 {
		t.Errorf("ready on port %d after the stranger took %d; want %d, the other free port\n%s", w.Port, first, first+1, h.rec.dump())
	}
	if c, err := net.Dial("tcp", stranger.Addr().String()); err != nil {
		t.Errorf("the stranger's listener was disturbed: %v", err)
	} else {
		c.Close()
	}
}

// A node's own ports (fleet file ports:) win over the hub's range. An apply
// that moves them leaves a running engine where it is (a hub restarted with
// other ports adopts its engines the same way); its next launch goes inside
// the new ones.
func TestManagerNodePortsOverrideTheHubs(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil) // the hub's range: PortMin..PortMax
	cleanupEngines(t, h)
	ownPorts := func() fleet.PortRange {
		for {
			p := sshdtest.FreePort(t)
			if p+2 < h.m.opts.PortMin || p > h.m.opts.PortMax {
				return fleet.PortRange{Min: p, Max: p + 2}
			}
		}
	}
	f := localFleet(localModel())
	f.Nodes[0].Ports = ownPorts()
	h.m.SetDesired(f)
	h.run()
	w := h.waitReady("hub/qwen3-4b")
	if r := f.Nodes[0].Ports; w.Port < r.Min || w.Port > r.Max {
		t.Fatalf("ready on port %d; want one in the node's ports %s, not the hub's %d-%d", w.Port, r, h.m.opts.PortMin, h.m.opts.PortMax)
	}

	f.Nodes[0].Ports = ownPorts()
	r := f.Nodes[0].Ports
	if r.Min <= w.Port && w.Port <= r.Max {
		t.Skipf("the new ports %s hold the old port %d", r, w.Port)
	}
	h.m.SetDesired(f)
	// The manager takes the new ports at once; the engine is not touched,
	// over several health checks (each would relaunch a changed command).
	h.waitNodePorts("hub", r)
	time.Sleep(5 * h.m.opts.ReconcileInterval)
	if now, _ := h.worker(w.Name()); now.PID != w.PID || now.State != fleet.WorkerReady {
		t.Errorf("moving the node's ports disturbed its running engine: PID %d → %d, %s", w.PID, now.PID, now.State)
	}
	if err := h.m.RestartWorker(t.Context(), w.Name()); err != nil {
		t.Fatal(err)
	}
	again := h.waitReady(w.Name())
	if again.Port < r.Min || again.Port > r.Max {
		t.Errorf("relaunched on port %d; want one in the node's new ports %s", again.Port, r)
	}
}

// waitNodePorts waits until the manager's node has ports r.
func (h *harness) waitNodePorts(name string, r fleet.PortRange) {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		h.m.mu.Lock()
		ns, ok := h.m.nodes[name]
		got := fleet.PortRange{}
		if ok {
			got = ns.node.Ports
		}
		h.m.mu.Unlock()
		if got == r {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("node %s has ports %s, want %s", name, got, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
