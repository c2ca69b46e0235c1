package nodes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"fleet"
	"fleet/enginectl"
)

// outcome is why a worker stopped being watched.
type outcome int

const (
	outcomeDone     outcome = iota // the supervisor's context ended
	outcomeRequest                 // an operator request is waiting
	outcomeNodeDown                // the node cannot be reached
	outcomeCrashed                 // the engine died or stopped answering
	outcomeChanged                 // the desired command line changed
	outcomeRecheck                 // the node was lost and is back: adopt again
	outcomeExpired                 // a rejected worker's engine ran out its RejectedGrace
)

// stableReady is how long a worker must stay ready before its consecutive
// failure count, and so its restart backoff, starts over.
const stableReady = 10 * time.Minute

// supervise drives one worker through its lifecycle until ctx ends. It is
// the only writer of ws.w and ws.proc.
func (m *Manager) supervise(ctx context.Context, ws *workerState) {
	var (
		failures     int       // consecutive failed launches or crashes
		backoffUntil time.Time // no relaunch before this
		pending      []chan error
		readySince   time.Time
		portLosses   int // launches in a row whose port another process took
	)
	m.mu.Lock()
	ws.held = ws.w.Held
	if ws.w.State == fleet.WorkerRejected && ws.w.PID == 0 && strings.Contains(ws.w.Reason, rejectedStoppedNote) {
		ws.parked = true
	}
	m.mu.Unlock()
	answer := func(err error) {
		for _, c := range pending {
			c <- err
		}
		pending = nil
	}
	defer func() {
		answer(fmt.Errorf("worker %s: %w", ws.name, cmp.Or(context.Cause(ctx), errors.New("supervisor ended"))))
	}()

	fail := func(reason string) {
		failures++
		m.update(ws, func(w *fleet.Worker) { w.State, w.Reason, w.Restarts = fleet.WorkerFailed, reason, w.Restarts+1 })
		wait := m.opts.restartBackoff(failures)
		backoffUntil = time.Now().Add(wait)
		m.workerEvent(ws, "error", fmt.Sprintf("%s; relaunching in %s (attempt %d)", reason, wait.Round(time.Second), failures))
	}

	// resume is set after a request that left a running engine as it was:
	// the next round goes back to watching it without adopting it again
	// (any other way round, such as the node going down, adopts it).
	resume := false
	for ctx.Err() == nil {
		skipAdopt := resume
		resume = false
		req, waiters := m.takeRequest(ws)
		if req != "" {
			answer(fmt.Errorf("worker %s: superseded by a %s request", ws.name, req))
		}
		switch req {
		case "stop":
			// Held is recorded before the engine stops: a hub killed in
			// between finds a held worker with a PID and stops it then.
			ws.held = true
			m.update(ws, func(w *fleet.Worker) { w.Held = true })
			m.fault("stop.held")
			err := m.stopEngine(ctx, ws, "stopped by an operator")
			if err != nil && ws.proc.PID > 0 {
				m.setState(ws, fleet.WorkerFailed, fmt.Sprintf("stopped by an operator, but %v; it is stopped once the node is reachable", err))
				err = fmt.Errorf("%w; it is stopped once the node is reachable again", err)
			}
			for _, c := range waiters {
				c <- err
			}
			continue
		case "restart", "start":
			if req == "restart" || ws.w.State != fleet.WorkerReady {
				if err := m.stopEngine(ctx, ws, "restarting"); err != nil {
					for _, c := range waiters {
						c <- err
					}
					continue
				}
			}
			if ws.held {
				m.update(ws, func(w *fleet.Worker) { w.Held = false })
			}
			ws.held, backoffUntil, failures = false, time.Time{}, 0
			ws.parked, ws.forced = false, false
			pending = waiters
		case "admit":
			var err error
			switch {
			case ws.w.State != fleet.WorkerRejected:
				err = fmt.Errorf("worker %s is %s, not rejected: nothing to admit", ws.name, ws.w.State)
			case !m.leads(ws, "admit"):
				err = fmt.Errorf("worker %s: not admitted: %w", ws.name, ErrNotLeading)
			case ws.proc.PID > 0:
				m.setState(ws, fleet.WorkerReady, "")
				m.workerEvent(ws, "warn", "admitted by an operator despite its failed admission check")
				resume = true
			default:
				// Rejected before its engine started, or its engine was
				// stopped since: launch it without the checks.
				m.workerEvent(ws, "warn", "launching without admission checks, by an operator's admit --force")
				ws.forced, ws.parked, backoffUntil = true, false, time.Time{}
				pending, waiters = waiters, nil
			}
			for _, c := range waiters {
				c <- err
			}
			if pending == nil {
				continue
			}
		case "verdict":
			err := m.applyVerdict(ws)
			for _, c := range waiters {
				c <- err
			}
			resume = true
			continue
		}

		if ws.held && ws.proc.PID == 0 && !ws.inDoubt {
			m.sleep(ctx, ws, nil, 0)
			continue
		}
		if ws.parked {
			if !m.commandChanged(ws) {
				m.sleep(ctx, ws, nil, m.opts.ReconcileInterval)
				continue
			}
			ws.parked = false
			m.workerEvent(ws, "info", "the desired command line changed; launching the rejected worker again to judge it")
		}
		node, t, changed, up := m.nodeFor(ws)
		if !up && node.State == fleet.NodeUnknown {
			// Not probed yet: nothing has failed.
			if ws.w.State != fleet.WorkerPending && ws.w.State != fleet.WorkerStarting {
				m.setState(ws, fleet.WorkerPending, "waiting for node "+node.Name+" to be probed")
			}
			m.sleep(ctx, ws, changed, 0)
			continue
		}
		if !up {
			reason := fmt.Sprintf("node %s is %s", node.Name, node.State)
			if node.Reason != "" {
				reason += ": " + node.Reason
			}
			switch {
			case ws.held && ws.proc.PID > 0:
				reason += fmt.Sprintf("; stopped by an operator: engine PID %d is stopped when the node returns", ws.proc.PID)
			case ws.proc.PID > 0:
				reason += "; its engine will be adopted when the node returns"
			}
			if ws.w.State != fleet.WorkerFailed || ws.w.Reason != reason {
				m.setState(ws, fleet.WorkerFailed, reason)
			}
			answer(errors.New(reason))
			m.sleep(ctx, ws, changed, 0)
			continue
		}
		if ws.held {
			// Held with an engine recorded: a stop that could not finish
			// (node unreachable, hub killed). Stop it if it is still ours.
			if err := m.stopHeld(ctx, ws, t); err != nil {
				failures++
				wait := m.opts.restartBackoff(failures)
				m.workerEvent(ws, "warn", fmt.Sprintf("%v; trying again in %s", err, wait.Round(time.Second)))
				m.sleep(ctx, ws, changed, wait)
			}
			continue
		}
		if wait := time.Until(backoffUntil); wait > 0 && len(pending) == 0 {
			m.sleep(ctx, ws, nil, wait)
			continue
		}

		if ws.inDoubt {
			if err := m.resolveLaunch(ctx, ws, node, t); err != nil {
				if ctx.Err() != nil {
					return
				}
				if !m.reachable(ctx, t) {
					m.markNodeSuspect(node.Name)
					m.sleep(ctx, ws, changed, m.opts.ReconcileInterval)
					continue
				}
				fail(err.Error())
				continue
			}
		}
		if ws.proc.PID > 0 && !skipAdopt {
			adopted, err := m.adopt(ctx, ws, node, t)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				if !m.reachable(ctx, t) {
					m.markNodeSuspect(node.Name)
					m.sleep(ctx, ws, changed, m.opts.ReconcileInterval)
					continue
				}
				if ws.proc.PID > 0 {
					fail(fmt.Sprintf("cannot check engine PID %d: %v", ws.proc.PID, err))
					continue
				}
			}
			if !adopted {
				ws.proc = enginectl.Process{}
			}
		}

		if ws.proc.PID == 0 {
			actx, cancel := context.WithCancel(ctx)
			m.mu.Lock()
			ws.attempt = cancel
			m.mu.Unlock()
			err := m.launch(actx, ws, node, t)
			m.mu.Lock()
			ws.attempt = nil
			interrupted := ws.request != ""
			m.mu.Unlock()
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil && interrupted && actx.Err() != nil {
				continue // an operator request cut the launch short
			}
			var lost *portLostError
			if errors.As(err, &lost) && portLosses < maxPortLosses {
				portLosses++
				m.workerEvent(ws, "warn", err.Error()+"; launching again on another port")
				continue
			}
			portLosses = 0
			if g := (gateError{}); errors.As(err, &g) {
				// Nothing runs: try the gate again when the node may have
				// room, or sooner on a request or a node change.
				answer(err)
				m.sleep(ctx, ws, changed, m.opts.ProbeInterval)
				continue
			}
			if err != nil {
				answer(err)
				if !m.reachable(ctx, t) {
					m.markNodeSuspect(node.Name)
					m.sleep(ctx, ws, changed, m.opts.ReconcileInterval)
					continue
				}
				fail(err.Error())
				continue
			}
			answer(nil)
		} else {
			answer(nil)
		}
		readySince = time.Now()

		out, reason := m.monitor(ctx, ws, node, t)
		if time.Since(readySince) >= stableReady {
			failures = 0
		}
		switch out {
		case outcomeDone:
			return
		case outcomeRequest:
		case outcomeNodeDown:
			m.markNodeSuspect(node.Name)
			why := fmt.Sprintf("node %s unreachable: %s; its engine will be adopted when the node returns", node.Name, reason)
			m.setState(ws, fleet.WorkerFailed, why)
			m.workerEvent(ws, "error", "left the ready set: "+why)
		case outcomeExpired:
			m.stopRejected(ctx, ws)
		case outcomeChanged:
			ws.forced = false // a new command line is judged anew
			m.workerEvent(ws, "info", "the desired command line changed ("+reason+"); restarting the engine with the new one")
			if err := m.stopEngine(ctx, ws, "restarting with the new command line"); err != nil {
				fail(fmt.Sprintf("stopping engine PID %d for its new command line: %v", ws.proc.PID, err))
			}
		case outcomeCrashed:
			if ws.proc.PID > 0 {
				// Alive but not answering: it must go before a new one starts.
				_ = m.stopEngine(ctx, ws, "")
			}
			fail(reason)
		}
	}
}

func (o ManagerOptions) restartBackoff(n int) time.Duration {
	if o.RestartBackoff != nil {
		return o.RestartBackoff(n)
	}
	return fleet.RestartBackoff(n)
}

func (m *Manager) takeRequest(ws *workerState) (string, []chan error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, w := ws.request, ws.waiters
	ws.request, ws.waiters = "", nil
	return r, w
}

func (m *Manager) hasRequest(ws *workerState) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return ws.request != ""
}

// sleep waits for d (forever when 0), a poke, a node change or ctx.
func (m *Manager) sleep(ctx context.Context, ws *workerState, changed <-chan struct{}, d time.Duration) {
	var timer <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
	case <-ws.poke:
	case <-changed:
	case <-timer:
	}
}

// reachable tells a node problem from an engine problem after an error.
func (m *Manager) reachable(ctx context.Context, t Transport) bool {
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return t.Run(rctx, []string{"true"}, nil, nil, nil) == nil
}

// monitor watches a serving worker until something needs the supervisor.
func (m *Manager) monitor(ctx context.Context, ws *workerState, node fleet.Node, t Transport) (outcome, string) {
	healthFails := 0
	tick := time.NewTicker(m.opts.ReconcileInterval)
	defer tick.Stop()
	// A check in progress is cut short when the node's state changes: a
	// lost connection takes the worker out of the ready set at once, not
	// after a command on the dead connection has timed out.
	_, _, changed, _ := m.nodeFor(ws)
	nodeChanged, cancelChecks := context.WithCancel(ctx)
	defer cancelChecks()
	go func() {
		select {
		case <-changed:
			cancelChecks()
		case <-nodeChanged.Done():
		}
	}()
	nodeDown := func() (outcome, string, bool) {
		cur, _, _, up := m.nodeFor(ws)
		if !up {
			return outcomeNodeDown, cmp.Or(cur.Reason, string(cur.State)), true
		}
		return 0, "", false
	}
	for {
		select {
		case <-ctx.Done():
			return outcomeDone, ""
		case <-ws.poke:
		case <-nodeChanged.Done():
		case <-tick.C:
		}
		if ctx.Err() != nil {
			return outcomeDone, ""
		}
		if m.hasRequest(ws) {
			return outcomeRequest, ""
		}
		if ws.w.State == fleet.WorkerRejected {
			if ws.rejectedAt.IsZero() {
				ws.rejectedAt = time.Now() // adopted rejected after a hub restart: its grace starts now
			}
			if time.Since(ws.rejectedAt) >= m.opts.RejectedGrace {
				return outcomeExpired, ""
			}
		}
		if out, reason, down := nodeDown(); down {
			return out, reason
		}
		if nodeChanged.Err() != nil {
			return outcomeRecheck, ""
		}
		cur, _, _, _ := m.nodeFor(ws)
		if _, cmd, err := m.desiredCommand(ws, cur, t); err != nil {
			return outcomeChanged, err.Error()
		} else if !slices.Equal(cmd.Argv, ws.w.Argv) {
			return outcomeChanged, "now: " + strings.Join(cmd.Argv, " ")
		}
		cctx, cancel := context.WithTimeout(nodeChanged, 30*time.Second)
		alive, err := enginectl.Alive(cctx, t, ws.proc.PID)
		cancel()
		if ctx.Err() != nil {
			return outcomeDone, ""
		}
		if out, reason, down := nodeDown(); down {
			return out, reason
		}
		if nodeChanged.Err() != nil {
			return outcomeRecheck, ""
		}
		if err != nil {
			if !m.reachable(nodeChanged, t) {
				if out, reason, down := nodeDown(); down {
					return out, reason
				}
				return outcomeNodeDown, err.Error()
			}
			continue
		}
		if !alive {
			pid := ws.proc.PID
			ws.proc = enginectl.Process{}
			return outcomeCrashed, fmt.Sprintf("engine PID %d exited", pid)
		}
		hctx, cancel := context.WithTimeout(nodeChanged, 15*time.Second)
		err = healthy(hctx, t, ws.w.Port, ws.w.Engine)
		cancel()
		if err == nil {
			healthFails = 0
			continue
		}
		if out, reason, down := nodeDown(); down {
			return out, reason
		}
		if nodeChanged.Err() != nil {
			return outcomeRecheck, ""
		}
		if m.nodeSuspect(ws.placement.Node) {
			continue // the node, not the engine, is not answering
		}
		healthFails++
		if healthFails >= m.opts.HealthFailures {
			return outcomeCrashed, fmt.Sprintf("engine PID %d failed %d health checks in a row: %v", ws.proc.PID, healthFails, err)
		}
	}
}

// healthy asks the engine's health endpoint through the node's transport.
func healthy(ctx context.Context, t Transport, port int, engine fleet.EngineKind) error {
	path := "/health"
	if engine == fleet.EngineOllama {
		path = "/api/version"
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: t.DialContext, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered %s", path, resp.Status)
	}
	return nil
}
