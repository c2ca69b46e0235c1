package nodes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
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
		answer(fmt.Errorf("worker %s: %w", ws.name, cmpErr(context.Cause(ctx), errors.New("supervisor ended"))))
	}()

	fail := func(reason string) {
		failures++
		m.update(ws, func(w *fleet.Worker) { w.State, w.Reason, w.Restarts = fleet.WorkerFailed, reason, w.Restarts+1 })
		wait := m.opts.restartBackoff(failures)
		backoffUntil = time.Now().Add(wait)
		m.event("error", ws.name, fmt.Sprintf("%s; relaunching in %s (attempt %d)", reason, wait.Round(time.Second), failures))
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
			case ws.proc.PID > 0:
				m.setState(ws, fleet.WorkerReady, "")
				m.event("warn", ws.name, "admitted by an operator despite its failed admission check")
				resume = true
			default:
				// Rejected before its engine started, or its engine was
				// stopped since: launch it without the checks.
				m.event("warn", ws.name, "launching without admission checks, by an operator's admit --force")
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

		if ws.held && ws.proc.PID == 0 {
			m.sleep(ctx, ws, nil, 0)
			continue
		}
		if ws.parked {
			if !m.commandChanged(ws) {
				m.sleep(ctx, ws, nil, m.opts.ReconcileInterval)
				continue
			}
			ws.parked = false
			m.event("info", ws.name, "the desired command line changed; launching the rejected worker again to judge it")
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
				m.event("warn", ws.name, fmt.Sprintf("%v; trying again in %s", err, wait.Round(time.Second)))
				m.sleep(ctx, ws, changed, wait)
			}
			continue
		}
		if wait := time.Until(backoffUntil); wait > 0 && len(pending) == 0 {
			m.sleep(ctx, ws, nil, wait)
			continue
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
				m.event("warn", ws.name, err.Error()+"; launching again on another port")
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
			m.event("error", ws.name, "left the ready set: "+why)
		case outcomeExpired:
			m.stopRejected(ctx, ws)
		case outcomeChanged:
			ws.forced = false // a new command line is judged anew
			m.event("info", ws.name, "the desired command line changed ("+reason+"); restarting the engine with the new one")
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

func cmpErr(err, fallback error) error {
	if err != nil {
		return err
	}
	return fallback
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

func (m *Manager) spec(node fleet.Node, model fleet.Model, engine fleet.EngineKind, port int, t Transport) enginectl.Spec {
	spec := enginectl.Spec{Node: node, Model: model, Engine: engine, Port: port, FleetBin: m.opts.FleetBin, StateDir: m.stateDir(t)}
	if m.opts.SimMimic != nil {
		profile, _ := node.SimProfile()
		if r, ok := model.Recipes[engine]; ok && engine == fleet.EngineSim && r.Profile != "" {
			profile = r.Profile
		}
		if profile != "" {
			spec.SimMimic = m.opts.SimMimic(profile)
		}
	}
	return spec
}

// readyTimeout is how long an engine of model on engine may take from
// launch to serving: its recipe's ready_timeout, else the manager's.
func (m *Manager) readyTimeout(model fleet.Model, engine fleet.EngineKind) time.Duration {
	if d := model.Recipes[engine].ReadyTimeout; d > 0 {
		return d
	}
	return m.opts.ReadyTimeout
}

// desiredCommand is what the worker should run now on its current port.
func (m *Manager) desiredCommand(ws *workerState, node fleet.Node, t Transport) (enginectl.Spec, enginectl.Command, error) {
	model, ok := m.model(ws.placement.Model)
	if !ok {
		return enginectl.Spec{}, enginectl.Command{}, fmt.Errorf("model %s is not defined in the fleet", ws.placement.Model)
	}
	// A placement's own, smaller context reaches every engine's flag (-c,
	// --max-model-len, OLLAMA_CONTEXT_LENGTH) and the worker's Context,
	// which the router checks prompts against.
	model.Context = ws.placement.ContextOf(model)
	engine, err := enginectl.EngineFor(*node.Platform, model, ws.placement.Engine)
	if err != nil {
		return enginectl.Spec{}, enginectl.Command{}, err
	}
	port := ws.w.Port
	if port == 0 {
		port = m.opts.PortMin
	}
	spec := m.spec(node, model, engine, port, t)
	cmd, err := enginectl.BuildCommand(spec)
	return spec, cmd, err
}

// launch takes a worker from pending to ready (or rejected): install if
// needed, clear a stale engine off the port, start detached, wait until our
// process answers, then the admission check.
func (m *Manager) launch(ctx context.Context, ws *workerState, node fleet.Node, t Transport) error {
	eo := m.engineOptions()
	prevPort := ws.w.Port
	port, err := m.allocatePort(ws, node)
	if err != nil {
		return err
	}
	m.mu.Lock()
	ws.w.Port = port
	m.mu.Unlock()
	spec, cmd, err := m.desiredCommand(ws, node, t)
	if err != nil {
		return err
	}
	if err := m.gate(ctx, ws, node, t, spec, cmd); err != nil {
		return err
	}
	m.update(ws, func(w *fleet.Worker) {
		w.State, w.Reason = fleet.WorkerPending, ""
		w.Engine, w.Port, w.PID, w.PGID = spec.Engine, port, 0, 0
		w.Argv, w.LaunchArgv, w.Simulated = cmd.Argv, cmd.LaunchArgv, cmd.Simulated
		w.Context, w.Slots = cmd.Context, cmd.Slots
	})

	installed, err := enginectl.Installed(ctx, t, cmd)
	if err != nil {
		return err
	}
	if !installed {
		m.setState(ws, fleet.WorkerInstalling, "")
		ictx, cancel := context.WithTimeout(ctx, m.opts.InstallTimeout)
		if script, err := enginectl.InstallCommand(spec); err == nil {
			m.event("info", ws.name, "install command: "+script)
		}
		lastPct := 0.0
		lw := &lineEvents{emit: func(line string) {
			m.event("info", ws.name, "install: "+line)
			// Whole percents only: installers redraw their bars far more
			// often than a worker change is worth persisting.
			if pct, ok := enginectl.ProgressPercent(line); ok && math.Floor(pct) != lastPct {
				lastPct = math.Floor(pct)
				m.update(ws, func(w *fleet.Worker) { w.Progress = lastPct })
			}
		}}
		err := enginectl.Install(ictx, t, spec, lw, eo...)
		lw.Flush()
		cancel()
		m.update(ws, func(w *fleet.Worker) { w.Progress = 0 })
		if err != nil {
			return fmt.Errorf("installing %s on %s failed (see the worker's events for its output): %w", spec.Engine.Label(), node.Name, err)
		}
	}

	owner, err := enginectl.CheckPort(ctx, t, port, cmd.Bin, eo...)
	// A remote node's ports cannot be test-bound from the hub, so a port
	// fleet just picked may turn out to belong to an unrelated service.
	// Nobody asked for that port: leave the stranger alone and take the
	// next one, instead of failing on it forever. The worker's own previous
	// port is different: a stranger there is refused (the stale server of
	// docs/field-reports.md).
	// Each attempt looks at a bounded number of ports; the skipped ones are
	// remembered, so the next attempt goes on from where this one stopped.
	for tries := 0; errors.Is(err, enginectl.ErrPortTaken) && port != prevPort; tries++ {
		m.mu.Lock()
		if ws.strangerPorts == nil {
			ws.strangerPorts = map[int]bool{}
		}
		ws.strangerPorts[port] = true
		m.mu.Unlock()
		if tries == 16 {
			break
		}
		m.event("warn", ws.name, err.Error()+"; leaving it alone and taking another port")
		if port, err = m.allocatePort(ws, node); err != nil {
			return err
		}
		m.mu.Lock()
		ws.w.Port = port
		m.mu.Unlock()
		if spec, cmd, err = m.desiredCommand(ws, node, t); err != nil {
			return err
		}
		m.update(ws, func(w *fleet.Worker) {
			w.Port, w.Argv, w.LaunchArgv = port, cmd.Argv, cmd.LaunchArgv
		})
		owner, err = enginectl.CheckPort(ctx, t, port, cmd.Bin, eo...)
	}
	if owner.Message != "" {
		m.event("warn", ws.name, owner.Message)
	}
	if err != nil {
		return err
	}

	m.setState(ws, fleet.WorkerStarting, "")
	proc, err := enginectl.Start(ctx, t, spec, cmd, eo...)
	if err != nil {
		return err
	}
	ws.proc = proc
	m.update(ws, func(w *fleet.Worker) {
		w.PID, w.PGID, w.StartedAt = proc.PID, proc.PGID, proc.StartedAt
	})
	note := ""
	if cmd.Simulated {
		note = fmt.Sprintf(" (simulated: runs %s)", strings.Join(cmd.LaunchArgv, " "))
	}
	m.event("info", ws.name, fmt.Sprintf("launched PID %d on port %d: %s%s", proc.PID, port, strings.Join(cmd.Argv, " "), note))

	wait := m.readyTimeout(spec.Model, spec.Engine)
	rctx, cancel := context.WithTimeout(ctx, wait)
	stopWatch := m.watchDownload(rctx, ws, t, proc)
	err = enginectl.WaitReady(rctx, t, port, proc, spec.Engine, eo...)
	stopWatch()
	cancel()
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("%w; the ready timeout is %s (a recipe's ready_timeout: sets it, for first starts that download weights)", err, wait)
	}
	if err != nil {
		if ctx.Err() == nil {
			// Ours, but not serving: it must not linger holding memory.
			if serr := m.stopEngine(ctx, ws, ""); serr != nil {
				m.event("warn", ws.name, fmt.Sprintf("stopping engine PID %d after it failed to become ready: %v", proc.PID, serr))
			}
		}
		if errors.Is(err, enginectl.ErrNotOurs) && port != prevPort {
			// Another process took the port fleet had just found free,
			// before the engine bound it: the host's ports are shared with
			// more than this fleet. Skip the port, not the next 10 s.
			m.mu.Lock()
			if ws.strangerPorts == nil {
				ws.strangerPorts = map[int]bool{}
			}
			ws.strangerPorts[port] = true
			m.mu.Unlock()
			return &portLostError{err: err}
		}
		return err
	}

	m.setState(ws, fleet.WorkerProbation, "")
	if m.opts.Admit != nil && !ws.forced {
		m.mu.Lock()
		w := ws.w
		m.mu.Unlock()
		if err := m.opts.Admit(ctx, w); err != nil {
			if ctx.Err() != nil {
				return err
			}
			ws.rejectedAt = time.Now()
			m.setState(ws, fleet.WorkerRejected, err.Error())
			m.event("warn", ws.name, fmt.Sprintf("rejected: %v; its engine stays up for %s to be looked at (shape, bench, logs), then stops", err, m.opts.RejectedGrace))
			return nil
		}
	}
	m.setState(ws, fleet.WorkerReady, "")
	m.event("info", ws.name, fmt.Sprintf("ready on port %d (PID %d)", port, proc.PID))
	return nil
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
			return outcomeNodeDown, cmpString(cur.Reason, string(cur.State)), true
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

func cmpString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (m *Manager) engineOptions() []enginectl.Option {
	return append([]enginectl.Option{enginectl.WithLogger(m.logger)}, m.opts.EngineOptions...)
}

// lineEvents turns an installer's output into one event per line.
type lineEvents struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	emit func(string)
}

func (l *lineEvents) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line) // incomplete: keep for the next write
			return len(p), nil
		}
		// Progress bars redraw with \r: keep the last state of the line.
		if i := strings.LastIndexByte(strings.TrimRight(line, "\r\n"), '\r'); i >= 0 {
			line = line[i+1:]
		}
		if s := strings.TrimSpace(line); s != "" {
			l.emit(s)
		}
	}
}

// Flush emits a last line that had no newline.
func (l *lineEvents) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := strings.TrimSpace(l.buf.String()); s != "" {
		l.emit(s)
	}
	l.buf.Reset()
}
