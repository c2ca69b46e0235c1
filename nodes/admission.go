package nodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/enginectl"
)

// rejectedStoppedNote marks the reason of a rejected worker whose engine
// was stopped after RejectedGrace, so a restarted hub keeps it down too.
const rejectedStoppedNote = "its engine was stopped after"

// gateError is a rejection before launch: no engine was started.
type gateError struct{ err error }

func (e gateError) Error() string { return e.err.Error() }
func (e gateError) Unwrap() error { return e.err }

// Held is what other engines on a node hold that a fresh probe may not
// show: the memory of launches that passed the gate and whose engines are
// not up yet, and the GPUs the gate gave engines still launching or
// running (a simulated node's GPUs never show their engines' use).
type Held struct {
	Bytes uint64
	GPUs  []int
}

// memoryHolds is the memory of launches that passed the gate and whose
// engines are not up yet, per node and worker. A fresh probe does not see an
// engine that is still installing or loading its weights, so without it two
// launches gated on one node at once would both count the same free memory.
type memoryHolds struct {
	mu     sync.Mutex // also held across each Gate call, so check and hold are one step
	byNode map[string]map[string]uint64
}

// heldOn is the memory held on node by launches other than worker's.
func (h *memoryHolds) heldOn(node, worker string) uint64 {
	var sum uint64
	for w, b := range h.byNode[node] {
		if w != worker {
			sum += b
		}
	}
	return sum
}

func (h *memoryHolds) hold(node, worker string, bytes uint64) {
	if bytes == 0 {
		return
	}
	if h.byNode == nil {
		h.byNode = map[string]map[string]uint64{}
	}
	if h.byNode[node] == nil {
		h.byNode[node] = map[string]uint64{}
	}
	h.byNode[node][worker] = bytes
}

// release ends worker's hold on node; releasing twice is harmless.
func (h *memoryHolds) release(node, worker string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.byNode[node], worker)
	if len(h.byNode[node]) == 0 {
		delete(h.byNode, node)
	}
}

// gpusTaken are the GPUs of node given to other workers whose engines
// launch or run: a worker keeps its GPUs (Worker.GPUs, stored, so an
// adopted engine keeps them across a hub restart) from its gate until its
// engine stops (stopEngineAnd clears them) or a later gate refuses it.
func (m *Manager) gpusTaken(node, worker string) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var taken []int
	for _, o := range m.workers {
		if o.placement.Node == node && o.name != worker {
			taken = append(taken, o.w.GPUs...)
		}
	}
	slices.Sort(taken)
	return slices.Compact(taken)
}

// gate runs the before-launch admission check (memory) on the node as
// probed now, less what other launches on it hold. A worker that fails it is
// rejected and no engine starts; one that passes holds its model's memory on
// the node until the caller releases it (m.holds.release), once its engine
// is up or its launch failed, and the GPUs the check gave it until its
// engine stops.
func (m *Manager) gate(ctx context.Context, ws *workerState, node fleet.Node, t Transport, spec enginectl.Spec, cmd enginectl.Command) error {
	if m.opts.Gate == nil {
		return nil
	}
	need := MemoryNeed(spec.Model)
	if ws.forced {
		// Unchecked, but its engine takes the memory all the same.
		m.holds.mu.Lock()
		m.holds.hold(node.Name, ws.name, need)
		m.holds.mu.Unlock()
		return nil
	}
	// A fresh probe: the last one may predate the stop of this worker's
	// previous engine, or another worker's launch on the same node.
	p, err := Probe(ctx, t)
	if err != nil {
		return fmt.Errorf("probing node %s before the launch: %w", node.Name, err)
	}
	node.Platform, node.ProbedAt = &p, time.Now()
	m.mu.Lock()
	w := ws.w
	m.mu.Unlock()
	w.Engine, w.Argv, w.LaunchArgv, w.Simulated, w.Context, w.Slots = spec.Engine, cmd.Argv, cmd.LaunchArgv, cmd.Simulated, cmd.Context, cmd.Slots
	m.holds.mu.Lock()
	held := Held{Bytes: m.holds.heldOn(node.Name, ws.name), GPUs: m.gpusTaken(node.Name, ws.name)}
	gpus, gerr := m.opts.Gate(ctx, w, node, held)
	if gerr == nil {
		m.holds.hold(node.Name, ws.name, need)
		// Taken before another gate on the node reads gpusTaken; the
		// update below reports it.
		m.mu.Lock()
		ws.w.GPUs = gpus
		m.mu.Unlock()
	}
	m.holds.mu.Unlock()
	if gerr == nil {
		m.update(ws, func(x *fleet.Worker) { x.GPUs = gpus })
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	again := ws.w.State == fleet.WorkerRejected && ws.w.Reason == gerr.Error()
	m.update(ws, func(x *fleet.Worker) {
		x.State, x.Reason, x.PID, x.PGID, x.GPUs = fleet.WorkerRejected, gerr.Error(), 0, 0, nil
		x.Engine, x.Argv, x.LaunchArgv, x.Simulated, x.Context, x.Slots = w.Engine, w.Argv, w.LaunchArgv, w.Simulated, w.Context, w.Slots
	})
	if !again {
		m.workerEvent(ws, "warn", fmt.Sprintf("rejected before launch, no engine started: %v (checked again every %s)", gerr, m.opts.ProbeInterval))
	}
	return gateError{gerr}
}

// applyVerdict carries out a Judge request on a worker whose engine runs.
func (m *Manager) applyVerdict(ws *workerState) error {
	m.mu.Lock()
	verdict := ws.verdict
	ws.verdict = nil
	m.mu.Unlock()
	if ws.proc.PID == 0 {
		return fmt.Errorf("worker %s is %s and its engine is not running: nothing to judge", ws.name, ws.w.State)
	}
	if !m.leads(ws, "verdict") {
		return fmt.Errorf("worker %s: not judged: %w", ws.name, ErrNotLeading)
	}
	switch {
	case verdict != nil && (ws.w.State == fleet.WorkerReady || ws.w.State == fleet.WorkerDraining):
		ws.rejectedAt = time.Now()
		m.setState(ws, fleet.WorkerRejected, verdict.Error())
		m.workerEvent(ws, "warn", fmt.Sprintf("rejected on re-judgement: %v; its engine stays up for %s to be looked at, then stops", verdict, m.opts.RejectedGrace))
	case verdict == nil && ws.w.State == fleet.WorkerRejected:
		ws.rejectedAt = time.Time{}
		m.setState(ws, fleet.WorkerReady, "")
		m.workerEvent(ws, "info", "admitted on re-judgement")
	case verdict != nil && ws.w.State == fleet.WorkerRejected:
		if ws.w.Reason != verdict.Error() {
			m.setState(ws, fleet.WorkerRejected, verdict.Error())
		}
	case verdict == nil && ws.w.State == fleet.WorkerReady:
	default:
		return fmt.Errorf("worker %s is %s: only a ready or rejected worker is re-judged", ws.name, ws.w.State)
	}
	return nil
}

// stopRejected stops the engine of a worker rejected longer than
// RejectedGrace; the worker stays rejected, and parked, until asked for.
func (m *Manager) stopRejected(ctx context.Context, ws *workerState) {
	pid := ws.proc.PID
	// The note goes in with the cleared PID: a reader that saw the engine
	// gone but not why read a rejection without it (a CI-like run did).
	note := fmt.Sprintf("%s %s rejected", rejectedStoppedNote, m.opts.RejectedGrace)
	err := m.stopEngineAnd(ctx, ws, func(w *fleet.Worker) {
		if !strings.Contains(w.Reason, rejectedStoppedNote) {
			w.Reason += "; " + note
		}
	})
	if err != nil {
		m.workerEvent(ws, "warn", fmt.Sprintf("rejected for %s, but its engine PID %d would not stop: %v", m.opts.RejectedGrace, pid, err))
		return
	}
	ws.parked = true
	m.workerEvent(ws, "info", fmt.Sprintf("%s: engine PID %d stopped; `fleet start %s` launches and judges it again, `fleet admit --force %s` launches it unchecked",
		note, pid, ws.name, ws.name))
}

// commandChanged reports whether a parked worker's desired command line
// differs from the one it was rejected with.
func (m *Manager) commandChanged(ws *workerState) bool {
	node, t, _, up := m.nodeFor(ws)
	if !up {
		return false
	}
	_, cmd, err := m.desiredCommand(ws, node, t)
	return err != nil || !slices.Equal(cmd.Argv, ws.w.Argv)
}
