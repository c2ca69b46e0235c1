package nodes

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"fleet"
)

// watchNode connects to a node and probes it every ProbeInterval. While an
// SSH node is unreachable and silent (a TCP connect to it gets no answer)
// it is not probed, which would only wait out a dial timeout: a TCP connect
// is tried every ReachInterval instead, and the node is reconnected as soon
// as one succeeds, rather than at the end of a reconnect backoff that may
// have grown to half a minute.
func (m *Manager) watchNode(ctx context.Context, ns *nodeState) {
	probe := true
	for {
		if probe {
			m.probeNode(ctx, ns)
		}
		probe = true
		m.mu.Lock()
		node, t, changed := ns.node, ns.transport, ns.changed
		m.mu.Unlock()
		var answered <-chan struct{}
		var tcp *reach
		rctx, cancel := context.WithCancel(ctx)
		if node.State == fleet.NodeUnreachable && !strings.HasPrefix(node.Address, fleet.AddressSimPrefix) && node.Address != fleet.AddressLocal {
			if _, addr, err := ParseSSHAddress(node.Address); err == nil {
				tcp = m.whenAnswers(rctx, addr)
				answered = tcp.answered
			}
		}
		timer := time.NewTimer(m.opts.ProbeInterval)
		select {
		case <-ctx.Done():
		case <-timer.C:
			// Still silent: a dial would only time out; the TCP watch
			// will tell when it answers.
			probe = tcp == nil || !tcp.silent.Load()
		case <-ns.poke:
		case <-changed:
			probe = false // the state changed under us: choose how to wait again
		case <-answered:
			m.logger.Info("unreachable node answers TCP again; reconnecting", "node", node.Name)
			if r, ok := t.(interface{ resetBackoff() }); ok {
				r.resetBackoff()
			}
		}
		timer.Stop()
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// reach is a TCP watch on an unreachable node.
type reach struct {
	// answered is closed when a connect succeeded after failed ones. A
	// node whose TCP answered from the start has another problem (sshd,
	// keys) and is left to the probes and their backoff.
	answered chan struct{}
	silent   atomic.Bool // connects are failing
}

// whenAnswers tries a TCP connect to addr every ReachInterval until one
// succeeds or ctx ends. A connect is all it does: cheap for the node.
func (m *Manager) whenAnswers(ctx context.Context, addr string) *reach {
	r := &reach{answered: make(chan struct{})}
	go func() {
		every := m.opts.ReachInterval
		for {
			// One attempt per interval, start to start: a connect to a
			// silent host takes the whole interval to time out, and
			// sleeping after it would double the gap.
			next := time.Now().Add(every)
			d := net.Dialer{Timeout: every}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				conn.Close()
				if r.silent.Swap(false) {
					close(r.answered)
				}
				return
			}
			if ctx.Err() != nil {
				return
			}
			r.silent.Store(true)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
		}
	}()
	return r
}

func (m *Manager) transportOptions() Options {
	o := m.opts.Transport
	o.Logger, o.DataDir, o.SimPlatform, o.HostKeys, o.OnEvent = m.logger, m.opts.DataDir, m.opts.SimPlatform, m.opts.HostKeys, m.opts.OnEvent
	o.OnLink = m.onLink
	return o
}

// onLink acts on a change of a node's connection as it happens: a suspect
// node gets no new requests, and a lost one leaves the ready set now rather
// than at the next probe.
func (m *Manager) onLink(name string, state LinkState, err error) {
	m.mu.Lock()
	ns, ok := m.nodes[name]
	if !ok {
		m.mu.Unlock()
		return
	}
	was := ns.suspect
	switch state {
	case LinkSuspect:
		ns.suspect = errText(err)
	case LinkUp:
		ns.suspect = ""
	case LinkLost:
		// Stays suspect until it is up again: its workers leave the ready
		// set now, and must not take requests before they are back.
	}
	now := ns.suspect
	var node fleet.Node
	var affected []*workerState
	lost := state == LinkLost && ns.node.State == fleet.NodeUp
	if lost {
		ns.node.State, ns.node.Reason = fleet.NodeUnreachable, "connection lost: "+errText(err)
		close(ns.changed)
		ns.changed = make(chan struct{})
		node = ns.node
		for _, ws := range m.workers {
			if ws.placement.Node == name {
				affected = append(affected, ws)
			}
		}
	}
	m.mu.Unlock()
	if was != now && m.opts.OnNodeSuspect != nil {
		m.opts.OnNodeSuspect(name, now)
	}
	if !lost {
		return
	}
	for _, ws := range affected {
		signal(ws.poke)
	}
	m.event("error", name, "node unreachable: "+node.Reason)
	m.logger.Info("node state", "node", name, "state", node.State, "reason", node.Reason)
	if m.opts.OnNode != nil {
		m.opts.OnNode(node)
	}
	// The node's watcher wakes on the state change: it reconnects as soon as
	// the node answers TCP, and does not dial it while it is silent. A node
	// that closed the connection rather than falling silent (its sshd
	// restarted) may be back already: probe it now.
	if was == "" {
		signal(ns.poke)
	}
}

func (m *Manager) probeNode(ctx context.Context, ns *nodeState) {
	m.mu.Lock()
	node, t := ns.node, ns.transport
	m.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, max(m.opts.ProbeInterval, 30*time.Second))
	defer cancel()
	var err error
	if t == nil {
		t, err = Open(pctx, node, m.transportOptions())
		if err == nil {
			m.mu.Lock()
			if ctx.Err() == nil {
				ns.transport = t
			} else {
				t.Close()
			}
			m.mu.Unlock()
		}
	}
	var p fleet.Platform
	if err == nil {
		p, err = Probe(pctx, t)
	}
	if err == nil && p.Profile == "" {
		m.locateEngines(pctx, node.Name, t, &p)
	}
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	prev, prevPlatform := ns.node.State, ns.node.Platform
	if err != nil {
		ns.node.State, ns.node.Reason = fleet.NodeUnreachable, err.Error()
	} else {
		ns.node.State, ns.node.Reason = fleet.NodeUp, ""
		ns.node.Platform, ns.node.ProbedAt = &p, time.Now()
	}
	// A suspicion belongs to a connection: a new one that probes well ends it.
	cleared := ns.suspect != "" && err == nil && prev != fleet.NodeUp
	if cleared {
		ns.suspect = ""
	}
	if prev != ns.node.State {
		close(ns.changed)
		ns.changed = make(chan struct{})
	}
	if t != nil {
		if hk, herr := m.opts.HostKeys.PinnedHostKey(ctx, node.Name); herr == nil && hk != "" {
			ns.node.HostKey = hk
		}
	}
	node = ns.node
	var affected []*workerState
	if prev != ns.node.State {
		for _, ws := range m.workers {
			if ws.placement.Node == node.Name {
				affected = append(affected, ws)
			}
		}
	}
	m.mu.Unlock()
	if cleared && m.opts.OnNodeSuspect != nil {
		m.opts.OnNodeSuspect(node.Name, "")
	}
	for _, ws := range affected {
		signal(ws.poke)
	}
	if node.State == fleet.NodeUp {
		m.platformEvents(node, prevPlatform, prev != node.State)
	}
	if prev != node.State {
		if node.State != fleet.NodeUp {
			m.event("error", node.Name, "node unreachable: "+node.Reason)
		}
		m.logger.Info("node state", "node", node.Name, "state", node.State, "reason", node.Reason)
	}
	if m.opts.OnNode != nil {
		m.opts.OnNode(node)
	}
}

// platformEvents tells what a probe found on a node that is up: what it is
// when it comes up, with the probe's notes and a failing GPU, and a GPU that
// fails or recovers while it stays up (a driver upgraded under a running
// node).
func (m *Manager) platformEvents(node fleet.Node, prev *fleet.Platform, cameUp bool) {
	p := node.Platform
	if cameUp {
		var most int64
		for _, g := range p.GPUs {
			most = max(most, g.MemFreeMiB)
		}
		perGPU := ""
		if len(p.GPUs) > 1 && most > 0 {
			// A vLLM engine is checked GPU by GPU, not against the sum.
			perGPU = fmt.Sprintf(" (at most %s on one GPU)", fleet.GiB(uint64(most)<<20))
		}
		m.event("info", node.Name, fmt.Sprintf("node up: %s, %s, %s usable%s", p.HostLabel(), p.GPULabel(), fleet.GiB(p.UsableMemory()), perGPU))
		for _, n := range p.Notes {
			m.event("info", node.Name, n)
		}
	}
	wasFailing := prev != nil && prev.GPUError != ""
	switch {
	case p.GPUError != "" && (cameUp || !wasFailing || prev.GPUError != p.GPUError):
		m.event("warn", node.Name, p.GPUError)
	case p.GPUError == "" && wasFailing && !cameUp:
		m.event("info", node.Name, fmt.Sprintf("nvidia-smi answers again: %s, %s usable", p.GPULabel(), fleet.GiB(p.UsableMemory())))
	}
}

// nodeFor returns the worker's node and transport when the node is up.
func (m *Manager) nodeFor(ws *workerState) (fleet.Node, Transport, <-chan struct{}, bool) {
	return m.nodeNamed(ws.placement.Node)
}

// nodeNamed returns the node and its transport, and whether it is up.
func (m *Manager) nodeNamed(name string) (fleet.Node, Transport, <-chan struct{}, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ns, ok := m.nodes[name]
	if !ok {
		never := make(chan struct{})
		return fleet.Node{Name: name, State: fleet.NodeUnknown, Reason: "node is not in the fleet"}, nil, never, false
	}
	up := ns.node.State == fleet.NodeUp && ns.transport != nil && ns.node.Platform != nil
	return ns.node, ns.transport, ns.changed, up
}

// nodeSuspect reports whether the node's connection is suspect.
func (m *Manager) nodeSuspect(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ns, ok := m.nodes[name]
	return ok && ns.suspect != ""
}

// markNodeSuspect asks for an immediate probe after a worker saw its
// transport fail.
func (m *Manager) markNodeSuspect(name string) {
	m.mu.Lock()
	ns, ok := m.nodes[name]
	known := ok && ns.node.State == fleet.NodeUnreachable
	m.mu.Unlock()
	// Already known unreachable: its watcher is on it, and a probe now
	// would only dial a node that may be silent.
	if ok && !known {
		signal(ns.poke)
	}
}
