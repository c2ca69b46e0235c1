package nodes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/enginectl"
)

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
	m.mu.Lock()
	p := ws.placement // its engine and context change with the fleet file (sync)
	m.mu.Unlock()
	model, ok := m.model(p.Model)
	if !ok {
		return enginectl.Spec{}, enginectl.Command{}, fmt.Errorf("model %s is not defined in the fleet", p.Model)
	}
	// A placement's own, smaller context reaches every engine's flag (-c,
	// --max-model-len, OLLAMA_CONTEXT_LENGTH) and the worker's Context,
	// which the router checks prompts against.
	model.Context = p.ContextOf(model)
	engine, err := enginectl.EngineFor(*node.Platform, model, p.Engine)
	if err != nil {
		return enginectl.Spec{}, enginectl.Command{}, err
	}
	port := ws.w.Port
	if port == 0 {
		port = m.enginePorts(node).Min
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
	// Each act below (admission, install, clearing the port, the launch's
	// record, the start, the verdict) asks first whether this hub still
	// leads: one that lost its lease while busy here stops short.
	notLeading := func() error { return fmt.Errorf("worker %s: not launched: %w", ws.name, ErrNotLeading) }
	if !m.leads(ws, "admission check") {
		return notLeading()
	}
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
	// Its memory stays held until the engine is up: a launch that fails on
	// the way releases it too.
	defer m.holds.release(node.Name, ws.name)
	m.update(ws, func(w *fleet.Worker) {
		w.State, w.Reason = fleet.WorkerPending, ""
		w.Engine, w.Port, w.PID, w.PGID = spec.Engine, port, 0, 0
		w.Argv, w.LaunchArgv, w.Simulated = cmd.Argv, cmd.LaunchArgv, cmd.Simulated
		w.Context, w.Slots = cmd.Context, cmd.Slots
	})

	where, err := enginectl.Locate(ctx, t, cmd.Bin)
	if err != nil {
		return err
	}
	if where != "" && !cmd.Simulated {
		m.workerEvent(ws, "info", fmt.Sprintf("%s found on the node at %s", cmd.Bin, where))
	}
	if where == "" {
		if !m.leads(ws, "install") {
			return notLeading()
		}
		m.setState(ws, fleet.WorkerInstalling, "")
		ictx, cancel := context.WithTimeout(ctx, m.opts.InstallTimeout)
		if script, err := enginectl.InstallCommand(spec); err == nil {
			m.workerEvent(ws, "info", "install command: "+script)
		}
		lastPct, lastTenth := 0.0, 0.0
		// Whole percents only: installers redraw their bars far more
		// often than a worker change is worth persisting.
		setPct := func(line string) bool {
			pct, ok := enginectl.ProgressPercent(line)
			if !ok || math.Floor(pct) == lastPct {
				return false
			}
			lastPct = math.Floor(pct)
			m.update(ws, func(w *fleet.Worker) { w.Progress = lastPct })
			return true
		}
		lw := &lineEvents{
			emit: func(line string) {
				m.workerEvent(ws, "info", "install: "+line)
				setPct(line)
			},
			// A bar redrawn in place (curl, pip, tqdm) is an event at
			// every tenth, as a download's is.
			redraw: func(bar string) {
				if setPct(bar) && math.Floor(lastPct/10) != lastTenth {
					lastTenth = math.Floor(lastPct / 10)
					m.workerEvent(ws, "info", "install: "+bar)
				}
			},
		}
		err := enginectl.Install(ictx, t, spec, lw, eo...)
		lw.Flush()
		cancel()
		m.update(ws, func(w *fleet.Worker) { w.Progress = 0 })
		if err != nil {
			return fmt.Errorf("installing %s on %s failed (see the worker's events for its output): %w", spec.Engine.Label(), node.Name, err)
		}
	}

	// CheckPort stops a stale engine of ours that holds the port.
	if !m.leads(ws, "clear the port") {
		return notLeading()
	}
	owner, err := enginectl.CheckPort(ctx, t, port, cmd.Bin, eo...)
	// A remote node's ports cannot be test-bound from the hub, so a port
	// fleet just picked may turn out to belong to an unrelated service, and
	// the worker's own previous port may have been taken while it was
	// stopped (another program on the node took one twice, and `start`
	// failed into backoff for 40-50 s). Leave the stranger alone and take
	// the next port, instead of failing on it. (A stale engine of ours on
	// the port was stopped by CheckPort: it runs from the engine's binary.)
	// Each attempt looks at a bounded number of ports; the skipped ones are
	// remembered, so the next attempt goes on from where this one stopped.
	for tries := 0; errors.Is(err, enginectl.ErrPortTaken); tries++ {
		m.skipStrangerPort(ws, port)
		if tries == 16 {
			break
		}
		m.workerEvent(ws, "warn", err.Error()+"; leaving it alone and taking another port")
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
		if !m.leads(ws, "clear the port") {
			return notLeading()
		}
		owner, err = enginectl.CheckPort(ctx, t, port, cmd.Bin, eo...)
	}
	if owner.Message != "" {
		m.workerEvent(ws, "warn", owner.Message)
	}
	if err != nil {
		return err
	}

	if err := m.recordLaunch(ctx, ws); err != nil {
		return err
	}
	m.mu.Lock()
	spec.Owner = enginectl.Owner{FleetID: m.opts.FleetID, Launch: ws.w.Launch}
	m.mu.Unlock()
	m.fault("launch.recorded")
	if !m.leads(ws, "launch") {
		// Recorded, not started: the next leader looks for it, finds
		// nothing, and launches.
		return notLeading()
	}
	m.mu.Lock()
	cmd.Env = gpuEnv(cmd.Env, ws.w.GPUs)
	m.mu.Unlock()
	proc, err := enginectl.Start(ctx, t, spec, cmd, eo...)
	if err != nil {
		// The engine may have started before the failure (a connection
		// lost after the fork): it is looked for before the next launch.
		ws.inDoubt = spec.Owner.FleetID != "" && spec.Owner.Launch > 0
		return err
	}
	m.fault("launch.started")
	ws.proc = proc
	m.update(ws, func(w *fleet.Worker) {
		w.PID, w.PGID, w.StartedAt = proc.PID, proc.PGID, proc.StartedAt
	})
	m.fault("launch.saved")
	note := ""
	if cmd.Simulated {
		note = fmt.Sprintf(" (simulated: runs %s)", strings.Join(cmd.LaunchArgv, " "))
	}
	m.workerEvent(ws, "info", fmt.Sprintf("launched PID %d on port %d: %s%s", proc.PID, port, strings.Join(cmd.Argv, " "), note))

	wait := m.readyTimeout(spec.Model, spec.Engine)
	rctx, cancel := context.WithTimeout(ctx, wait)
	stopWatch := m.watchDownload(rctx, ws, t, proc)
	err = enginectl.WaitReady(rctx, t, port, proc, spec.Engine, eo...)
	stopWatch()
	// Up (a probe now sees its memory) or failed (and stopped below).
	m.holds.release(node.Name, ws.name)
	timedOut := rctx.Err() != nil
	cancel()
	if err != nil && ctx.Err() == nil && timedOut {
		err = fmt.Errorf("%w; the ready timeout is %s (a recipe's ready_timeout: sets it, for first starts that download weights)", err, wait)
	}
	if err != nil {
		if ctx.Err() == nil {
			// Ours, but not serving: it must not linger holding memory.
			if serr := m.stopEngine(ctx, ws, ""); serr != nil {
				m.workerEvent(ws, "warn", fmt.Sprintf("stopping engine PID %d after it failed to become ready: %v", proc.PID, serr))
			}
		}
		if errors.Is(err, enginectl.ErrNotOurs) || errors.Is(err, enginectl.ErrPortInUse) {
			// Another process took the port fleet had just found free,
			// before the engine bound it, or holds it without listening:
			// the host's ports are shared with more than this fleet. Skip
			// the port, not the next 10 s. (A server answering in our
			// engine's place is never taken for it: the stale server of
			// docs/field-reports.md.)
			m.skipStrangerPort(ws, port)
			return &portLostError{err: err}
		}
		return err
	}

	m.setState(ws, fleet.WorkerProbation, "")
	if !m.leads(ws, "admission check") {
		return fmt.Errorf("worker %s: engine PID %d not judged: %w", ws.name, proc.PID, ErrNotLeading)
	}
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
			m.workerEvent(ws, "warn", fmt.Sprintf("rejected: %v; its engine stays up for %s to be looked at (shape, bench, logs), then stops", err, m.opts.RejectedGrace))
			return nil
		}
	}
	m.setState(ws, fleet.WorkerReady, "")
	m.workerEvent(ws, "info", fmt.Sprintf("ready on port %d (PID %d)", port, proc.PID))
	return nil
}

// lineEvents turns an installer's output into one event per line. Progress
// bars redraw in place with \r and end their line only when done (curl's
// "\r###   45.2%"), so each redraw, the one still being written included,
// goes to redraw (when set) as soon as it arrives.
type lineEvents struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	emit   func(string)
	redraw func(string)
}

func (l *lineEvents) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		b := l.buf.Bytes()
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 || (b[i] == '\r' && i+1 == len(b)) {
			break // no break yet, or a \r whose \n may be in the next write
		}
		text, end := string(b[:i]), i+1
		if b[i] == '\r' && b[i+1] == '\n' {
			end++
		}
		lineEnd := b[end-1] == '\n'
		l.buf.Next(end)
		switch s := strings.TrimSpace(text); {
		case s == "":
		case lineEnd:
			l.emit(s)
		case l.redraw != nil:
			l.redraw(s)
		}
	}
	if s := strings.TrimSpace(l.buf.String()); s != "" && l.redraw != nil {
		l.redraw(s)
	}
	return len(p), nil
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
