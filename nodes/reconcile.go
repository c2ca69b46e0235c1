package nodes

import (
	"context"
	"errors"
	"fmt"

	"fleet"
	"fleet/enginectl"
)

var errRemoved = errors.New("placement removed")

// sync brings node watchers and worker supervisors in line with the desired
// fleet. A node that leaves the fleet stays connected while a worker on it
// is retiring: its engine must be stopped before the node is let go.
func (m *Manager) sync(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	if m.leading && m.term == nil {
		tctx, cancel := context.WithCancelCause(ctx)
		m.term = &term{ctx: tctx, cancel: cancel}
	}
	// A follower supervises no worker: it keeps its nodes connected, for
	// routing and the console, and leaves the engines to the leader.
	lead := m.term
	wantWorkers := map[string]fleet.Placement{}
	for _, p := range m.desired.Placements {
		name := p.Node + "/" + p.Model
		if _, dup := wantWorkers[name]; dup {
			m.logger.Warn("two placements of one model on one node; keeping the first", "worker", name)
			continue
		}
		wantWorkers[name] = p
	}
	for name, ws := range m.workers {
		p, ok := wantWorkers[name]
		if ok && !ws.retiring {
			if ws.placement != p {
				// Node and Model make the worker's name and never change,
				// so its supervisor reads them without the lock; only the
				// engine and context change, here, under m.mu.
				ws.placement.Engine, ws.placement.Context = p.Engine, p.Context
				signal(ws.poke)
			}
			continue
		}
		if !ws.retiring {
			ws.retiring = true
			ws.cancel(errRemoved)
		}
	}

	wantNodes := map[string]fleet.Node{}
	for _, n := range m.desired.Nodes {
		wantNodes[n.Name] = n
	}
	// keep adds to wantNodes the node a retiring worker needs, when not
	// declared: the one connected now, else the one a previous hub recorded
	// with its pending stop. It reports whether any is known.
	keep := func(name string) bool {
		if _, ok := wantNodes[name]; ok {
			return true
		}
		if ns, ok := m.nodes[name]; ok {
			wantNodes[name] = ns.node
			return true
		}
		if n, ok := m.removedNodes[name]; ok {
			wantNodes[name] = n
			return true
		}
		return false
	}
	for _, ws := range m.workers {
		if ws.retiring {
			keep(ws.placement.Node)
		}
	}
	var orphans []fleet.Worker
	for name, w := range m.restored {
		if lead == nil {
			break // kept for SetLeading(true), which replaces them anyway
		}
		if _, ok := wantWorkers[name]; ok {
			continue
		}
		if _, ok := m.workers[name]; ok {
			continue
		}
		if !keep(w.Node) {
			if w.PID > 0 || w.Launch > 0 {
				m.logger.Error("a stored engine's node is not known any more; it cannot be stopped from here", "worker", name, "pid", w.PID)
				m.event("error", name, fmt.Sprintf("engine PID %d ran on node %s, which the fleet no longer declares and no pending stop describes; stop it by hand", w.PID, w.Node))
			}
			delete(m.restored, name)
			continue
		}
		orphans = append(orphans, w)
	}
	for name := range m.removedNodes {
		if _, ok := wantNodes[name]; !ok {
			delete(m.removedNodes, name) // its engines are stopped
		}
	}

	for name, ns := range m.nodes {
		want, ok := wantNodes[name]
		if ok && want.Address == ns.node.Address && want.Identity == ns.node.Identity {
			ns.node.Endpoint, ns.node.Drained, ns.node.Ports = want.Endpoint, want.Drained, want.Ports
			continue
		}
		// Gone or re-addressed: drop the old connection.
		ns.cancel()
		if ns.transport != nil {
			ns.transport.Close()
		}
		close(ns.changed)
		delete(m.nodes, name)
	}
	for name, n := range wantNodes {
		if _, ok := m.nodes[name]; ok {
			continue
		}
		nctx, cancel := context.WithCancel(ctx)
		n.State, n.Reason = fleet.NodeUnknown, ""
		ns := &nodeState{node: n, cancel: cancel, poke: make(chan struct{}, 1), changed: make(chan struct{})}
		m.nodes[name] = ns
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.watchNode(nctx, ns)
		}()
	}

	if lead == nil {
		return
	}
	for name, p := range wantWorkers {
		if _, ok := m.workers[name]; ok {
			continue
		}
		ws := m.newWorkerState(name, p)
		m.workers[name] = ws
		m.startSupervisor(lead, ws)
	}
	// Workers the store knew whose placement is gone: stop their engines.
	for _, w := range orphans {
		ws := m.newWorkerState(w.Name(), fleet.Placement{Node: w.Node, Model: w.Model, Engine: w.Engine})
		ws.retiring = true
		m.workers[w.Name()] = ws
		m.startSupervisor(lead, ws)
		ws.cancel(errRemoved)
	}
}

func (m *Manager) newWorkerState(name string, p fleet.Placement) *workerState {
	ws := &workerState{name: name, placement: p, poke: make(chan struct{}, 1), done: make(chan struct{})}
	ws.w = fleet.Worker{Node: p.Node, Model: p.Model, Engine: p.Engine, State: fleet.WorkerPending}
	if r, ok := m.restored[name]; ok {
		delete(m.restored, name)
		// With its GPUs: no other engine is given them while this one is
		// checked and adopted.
		ws.w = r
		// A stopped worker's PID is 0; a held one with a PID is a stop the
		// previous hub did not finish, which its supervisor carries out.
		if r.PID > 0 {
			ws.proc = enginectl.Process{PID: r.PID, PGID: r.PGID, StartedAt: r.StartedAt, ServedName: r.Model}
		}
		// A launch recorded without its PID: the engine may run.
		ws.inDoubt = r.PID == 0 && r.Launch > 0
		// What the store said is history until the engine is checked: a
		// restored worker is not ready before it has been adopted.
		if ws.w.State != fleet.WorkerStopped && ws.w.State != fleet.WorkerRejected {
			ws.w.State, ws.w.Reason = fleet.WorkerStarting, "checking the engine recorded before the hub restarted"
		}
	}
	return ws
}

// startSupervisor supervises ws in term t, then retires it if its placement
// was removed (ws.cancel(errRemoved)). ws.quit ends both for good.
func (m *Manager) startSupervisor(t *term, ws *workerState) {
	qctx, quit := context.WithCancelCause(t.ctx)
	wctx, cancel := context.WithCancelCause(qctx)
	ws.ctx, ws.quit, ws.cancel = qctx, quit, cancel
	m.wg.Add(1)
	t.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer t.wg.Done()
		defer close(ws.done)
		defer quit(nil)
		m.supervise(wctx, ws)
		if errors.Is(context.Cause(wctx), errRemoved) && qctx.Err() == nil {
			m.retire(qctx, ws)
		}
	}()
}
