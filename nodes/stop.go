package nodes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"fleet"
	"fleet/enginectl"
)

// stopEngine stops the worker's engine, if any. It must finish even while
// the supervisor is being cancelled, so it gets its own bounded context.
// A non-empty reason marks the worker stopped, with reason as its Reason.
func (m *Manager) stopEngine(ctx context.Context, ws *workerState, reason string) error {
	return m.stopEngineAnd(ctx, ws, func(w *fleet.Worker) {
		if reason != "" {
			w.State, w.Reason = fleet.WorkerStopped, reason
		}
	})
}

// stopEngineAnd is stopEngine with what to record of the worker besides its
// cleared PID, in the same update: no reader sees the one without the other.
func (m *Manager) stopEngineAnd(ctx context.Context, ws *workerState, record func(*fleet.Worker)) error {
	if ws.proc.PID > 0 {
		_, t, _, up := m.nodeFor(ws)
		if !up || t == nil {
			return fmt.Errorf("worker %s: cannot stop engine PID %d: node %s is not reachable", ws.name, ws.proc.PID, ws.placement.Node)
		}
		if !m.leads(ws, "stop") {
			return fmt.Errorf("worker %s: engine PID %d not stopped: %w", ws.name, ws.proc.PID, ErrNotLeading)
		}
		// A stop outlasts a hub's shutdown, but not leadership given up:
		// that leaves the engine as a hub killed mid-stop does, to the next
		// leader (a held worker's stop is recorded, and done again).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.opts.StopGrace+30*time.Second)
		defer cancel()
		if ws.ctx != nil {
			defer context.AfterFunc(ws.ctx, func() {
				if errors.Is(context.Cause(ws.ctx), ErrNotLeading) {
					cancel()
				}
			})()
		}
		if err := enginectl.Stop(sctx, t, ws.proc, m.opts.StopGrace, m.engineOptions()...); err != nil {
			return fmt.Errorf("worker %s: %w", ws.name, err)
		}
		m.fault("stop.signalled")
		m.workerEvent(ws, "info", fmt.Sprintf("stopped engine PID %d", ws.proc.PID))
		ws.proc = enginectl.Process{}
	}
	m.update(ws, func(w *fleet.Worker) {
		w.PID, w.PGID, w.GPUs = 0, 0, nil // its GPUs are free for others
		if !ws.inDoubt {
			w.Launch = 0 // its engine is stopped: nothing to look for
		}
		record(w)
	})
	return nil
}

// stopHeld stops the recorded engine of a held worker, after checking it
// still runs the worker's command (the PID may be someone else's by now).
func (m *Manager) stopHeld(ctx context.Context, ws *workerState, t Transport) error {
	if ws.inDoubt {
		node, _, _, _ := m.nodeFor(ws)
		if err := m.resolveLaunch(ctx, ws, node, t); err != nil {
			return err
		}
	}
	m.mu.Lock()
	launch := ws.w.LaunchArgv
	m.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ws.proc = m.withFiles(ws.proc, t, ws.placement.Node, ws.placement.Model)
	ours, err := enginectl.Adopt(actx, t, ws.proc, launch, m.engineOptions()...)
	cancel()
	if err != nil {
		return fmt.Errorf("checking engine PID %d before stopping it: %w", ws.proc.PID, err)
	}
	if !ours {
		ws.proc = enginectl.Process{} // gone, or the PID is someone else's now
	}
	return m.stopEngine(ctx, ws, "stopped by an operator")
}

// retire stops the engine of a worker whose placement is gone, then forgets
// the worker. An engine on a node that cannot be reached is waited for, not
// forgotten: the hub recorded it as a pending stop, so a hub restarted
// meanwhile picks it up again.
func (m *Manager) retire(ctx context.Context, ws *workerState) {
	for attempt := 1; ws.proc.PID > 0 || ws.inDoubt; attempt++ {
		node, t, changed, up := m.nodeFor(ws)
		if !up {
			reason := fmt.Sprintf("placement removed; engine PID %d is stopped once node %s is reachable again", ws.proc.PID, node.Name)
			if ws.proc.PID == 0 {
				reason = fmt.Sprintf("placement removed; the engine of launch %d is looked for, and stopped, once node %s is reachable again", ws.w.Launch, node.Name)
			}
			if ws.w.Reason != reason {
				m.setState(ws, fleet.WorkerFailed, reason)
				m.workerEvent(ws, "warn", reason)
			}
			attempt = 0
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			continue
		}
		var err error
		if ws.inDoubt {
			err = m.resolveLaunch(ctx, ws, node, t)
		}
		if err == nil && ws.proc.PID > 0 {
			m.mu.Lock()
			launch := ws.w.LaunchArgv
			m.mu.Unlock()
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			ws.proc = m.withFiles(ws.proc, t, node.Name, ws.placement.Model)
			var ours bool
			ours, err = enginectl.Adopt(actx, t, ws.proc, launch, m.engineOptions()...)
			cancel()
			if err == nil && !ours {
				ws.proc = enginectl.Process{} // gone, or the PID is someone else's now
			}
		}
		if err == nil {
			m.fault("retire.stopping")
			err = m.stopEngine(ctx, ws, "")
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		wait := m.opts.restartBackoff(attempt)
		m.workerEvent(ws, "error", fmt.Sprintf("placement removed but its engine would not stop: %v; trying again in %s", err, wait.Round(time.Second)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	m.update(ws, func(w *fleet.Worker) {
		w.State, w.Reason, w.PID, w.PGID = fleet.WorkerStopped, "placement removed", 0, 0
	})
	m.mu.Lock()
	if m.workers[ws.name] == ws {
		delete(m.workers, ws.name)
	}
	w := ws.w
	m.mu.Unlock()
	m.workerEvent(ws, "info", "placement removed: worker stopped and forgotten")
	if m.opts.OnWorkerRemoved != nil && m.mayReport(ws) {
		m.opts.OnWorkerRemoved(w)
	}
	signal(m.wake)
}
