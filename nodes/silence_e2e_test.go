package nodes

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/internal/netnstest"
	"fleet/internal/sshdtest"
)

// These tests put the node's sshd in a network namespace of its own and
// make it fall silent (every packet dropped both ways, no reset, no ICMP),
// as a laptop going to sleep does. Bounds in them are hang guards or, where
// a figure is what the fix is about, far from both the fixed and the old
// behaviour.

// silentNode is an sshd in its own network namespace.
func silentNode(t *testing.T) (*netnstest.Namespace, *sshdtest.Server) {
	t.Helper()
	ns := netnstest.New(t)
	s := sshdtest.NewOn(t, ns.IP, ns.Command())
	s.Start()
	return ns, s
}

// linkLog records OnLink calls in order.
type linkLog struct {
	mu      sync.Mutex
	changes []linkChange
	ch      chan struct{}
}

type linkChange struct {
	state LinkState
	err   error
	at    time.Time
}

func newLinkLog() *linkLog { return &linkLog{ch: make(chan struct{}, 100)} }

func (l *linkLog) add(_ string, s LinkState, err error) {
	l.mu.Lock()
	l.changes = append(l.changes, linkChange{s, err, time.Now()})
	l.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
	default:
	}
}

// wait returns the first change to state recorded after index from.
func (l *linkLog) wait(t *testing.T, from int, state LinkState, within time.Duration) (linkChange, int) {
	t.Helper()
	deadline := time.After(within)
	for {
		l.mu.Lock()
		for i := from; i < len(l.changes); i++ {
			if l.changes[i].state == state {
				c := l.changes[i]
				l.mu.Unlock()
				return c, i + 1
			}
		}
		l.mu.Unlock()
		select {
		case <-l.ch:
		case <-deadline:
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("no link change to %d within %s; changes: %+v", state, within, l.changes)
		}
	}
}

func (l *linkLog) count(state LinkState) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.changes {
		if c.state == state {
			n++
		}
	}
	return n
}

// A blip shorter than the keepalive grace makes the node suspect at the
// first unanswered keepalive and healthy again when it answers, keeping the
// connection; a longer silence ends it, saying why, and a tunnel asked for
// then fails at once instead of waiting behind a dial to the silent node.
func TestSilentNodeSuspectThenLost(t *testing.T) {
	ns, s := silentNode(t)
	links := newLinkLog()
	const every = 400 * time.Millisecond
	opts := Options{
		HostKeys:          &MemoryHostKeys{},
		KeepaliveInterval: every, KeepaliveMissed: 3,
		ConnectTimeout: 8 * time.Second,
		OnLink:         links.add,
	}
	ctx := context.Background()
	tr, err := Open(ctx, fleet.Node{Name: "mac", Address: s.Address(), Identity: s.Identity()}, opts)
	if err != nil {
		t.Fatalf("Open: %v\n%s", err, s.Log())
	}
	defer tr.Close()
	st := tr.(*sshTransport)
	first := st.client

	// A blip: suspect, then up again on the same connection.
	ns.Cut()
	_, next := links.wait(t, 0, LinkSuspect, 10*time.Second)
	ns.Restore()
	links.wait(t, next, LinkUp, 30*time.Second)
	if links.count(LinkLost) != 0 || st.client != first {
		t.Fatalf("a blip ended the connection: %+v", links.changes)
	}
	if err := tr.Run(ctx, []string{"true"}, nil, nil, nil); err != nil {
		t.Fatalf("after the blip: %v", err)
	}

	// A silence: a command running on the connection fails with the
	// keepalive story, not "EOF".
	ns.Cut()
	ran := make(chan error, 1)
	go func() { ran <- tr.Run(ctx, []string{"sleep", "60"}, nil, nil, nil) }()
	lost, _ := links.wait(t, next, LinkLost, 30*time.Second)
	if want := "no answer to 3 keepalives in 1.2s"; lost.err == nil || lost.err.Error() != want {
		t.Errorf("lost because %v, want %q", lost.err, want)
	}
	select {
	case err := <-ran:
		if err == nil || !strings.Contains(err.Error(), "no answer to 3 keepalives in 1.2s") {
			t.Errorf("command on the lost connection: %v; want it to say no answer to 3 keepalives", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a command on the lost connection still hangs")
	}

	// While a reconnect to the silent node is under way (a dial that can
	// only time out), tunnels fail at once instead of queueing behind it.
	dialing := make(chan error, 1)
	go func() { dialing <- tr.Run(ctx, []string{"true"}, nil, nil, nil) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		st.mu.Lock()
		busy := st.dialing != nil
		st.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no reconnect started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	_, err = tr.DialContext(ctx, "tcp", "127.0.0.1:1")
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("tunnel during the reconnect: %v; want a refusal saying the node is not connected", err)
	}
	if took > opts.ConnectTimeout/2 {
		t.Errorf("tunnel during the reconnect took %s: it waited behind the dial (connect timeout %s)", took, opts.ConnectTimeout)
	}
	select {
	case err := <-dialing:
		if err == nil {
			t.Error("a command reached the silent node")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reconnect to the silent node never gave up")
	}
	var unreach *HostKeyChangedError
	if errors.As(err, &unreach) {
		t.Fatal("unexpected host key error")
	}
}

// A node that falls silent leaves the ready set as soon as its connection
// is lost, with the reason in the worker's events, and comes back (the same
// engine adopted) soon after it answers again, whatever the reconnect
// backoff and probe interval.
func TestManagerSilentNodeLeavesAndReturns(t *testing.T) {
	ns, s := silentNode(t)
	keys := &MemoryHostKeys{}
	suspects := make(chan string, 100)
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.HostKeys = keys
		o.RemoteStateDir = t.TempDir()
		// Slow probes and a long backoff: only the loss itself and the
		// TCP check may bring the node back quickly.
		o.ProbeInterval = 60 * time.Second
		o.ReachInterval = time.Second
		o.Transport = Options{KeepaliveInterval: 300 * time.Millisecond, KeepaliveMissed: 3,
			ConnectTimeout: 8 * time.Second, ReconnectBackoffMax: 60 * time.Second}
		o.OnNodeSuspect = func(node, reason string) { suspects <- node + ": " + reason }
	})
	cleanupEngines(t, h)
	h.m.SetDesired(fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "mac", Address: s.Address(), Identity: s.Identity()}},
		Models:     []fleet.Model{localModel()},
		Placements: []fleet.Placement{{Model: "qwen3-4b", Node: "mac"}},
	})
	h.run()
	w := h.waitReady("mac/qwen3-4b")

	ns.Cut()
	cut := time.Now()
	select {
	case s := <-suspects:
		if !strings.Contains(s, "mac: no answer to a keepalive") {
			t.Errorf("suspect report %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the silent node was never reported suspect")
	}
	if _, err := h.m.Dialer("mac")(context.Background(), "tcp", "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "not answering") {
		t.Errorf("dialling a suspect node: %v; want an immediate refusal", err)
	}
	left := h.waitWorker(w.Name(), "out of ready", func(x fleet.Worker) bool { return x.State != fleet.WorkerReady })
	leftAfter := time.Since(cut)
	t.Logf("worker left ready %s after the cut", leftAfter.Round(time.Millisecond))
	// Lost after 3 × 300 ms unanswered keepalives; without acting on the
	// loss at once the worker waited for a command's dial to time out (8 s).
	if leftAfter > 6*time.Second {
		t.Errorf("the worker stayed ready %s after the cut; want it out as soon as the connection is lost\n%s", leftAfter, h.rec.dump())
	}
	if !strings.Contains(left.Reason, "no answer to 3 keepalives in 900ms") {
		t.Errorf("worker reason %q; want it to say no answer to 3 keepalives", left.Reason)
	}
	if !h.rec.eventMatch(w.Name(), "left the ready set: node mac unreachable:", "no answer to 3 keepalives in 900ms") {
		t.Errorf("no worker event with the keepalive reason:\n%s", h.rec.dump())
	}

	// Long enough for a few failed reconnects, so the backoff has grown.
	time.Sleep(6 * time.Second)
	ns.Restore()
	back := time.Now()
	again := h.waitReady(w.Name())
	t.Logf("worker ready %s after the node answered again", time.Since(back).Round(time.Millisecond))
	// With a 60 s probe interval and backoff, only the TCP check brings it
	// back in time.
	if d := time.Since(back); d > 20*time.Second {
		t.Errorf("worker ready again %s after the node returned", d)
	}
	if again.PID != w.PID {
		t.Errorf("after the node returned: PID %d, want the adopted %d", again.PID, w.PID)
	}
}

// eventMatch reports whether an event about subject contains every one of
// subs.
func (r *recorder) eventMatch(subject string, subs ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		ok := e.Subject == subject
		for _, s := range subs {
			ok = ok && strings.Contains(e.Message, s)
		}
		if ok {
			return true
		}
	}
	return false
}
