package nodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"fleet"
	"fleet/enginectl"
)

// adopt checks whether the engine recorded for ws still runs its stored
// LaunchArgv and serves; if so the worker is ready again with the same PID.
func (m *Manager) adopt(ctx context.Context, ws *workerState, node fleet.Node, t Transport) (bool, error) {
	eo := m.engineOptions()
	m.mu.Lock()
	w := ws.w
	proc := ws.proc
	m.mu.Unlock()
	proc = m.withFiles(proc, t, node.Name, w.Model)
	ok, err := enginectl.Adopt(ctx, t, proc, w.LaunchArgv, eo...)
	if err != nil {
		return false, err
	}
	if !ok {
		m.workerEvent(ws, "info", fmt.Sprintf("engine PID %d is no longer running its command; launching a new one", proc.PID))
		return false, nil
	}
	if w.State != fleet.WorkerReady && w.State != fleet.WorkerRejected {
		m.setState(ws, fleet.WorkerStarting, fmt.Sprintf("adopting engine PID %d", proc.PID))
	}
	model, _ := m.model(ws.placement.Model)
	rctx, cancel := context.WithTimeout(ctx, m.readyTimeout(model, w.Engine))
	defer cancel()
	defer m.watchDownload(rctx, ws, t, proc)()
	ws.proc = proc
	if err := enginectl.WaitReady(rctx, t, w.Port, proc, w.Engine, eo...); err != nil {
		if ctx.Err() != nil {
			return false, err
		}
		// It is ours (Adopt checked its argv) but does not serve: stop it so
		// the relaunch does not run beside it.
		m.workerEvent(ws, "warn", fmt.Sprintf("engine PID %d runs but does not serve (%v); stopping it and launching a new one", proc.PID, err))
		if serr := m.stopEngine(ctx, ws, ""); serr != nil {
			return false, serr
		}
		return false, nil
	}
	state := fleet.WorkerReady
	reason := ""
	if w.State == fleet.WorkerRejected {
		state, reason = fleet.WorkerRejected, w.Reason
	}
	m.setState(ws, state, reason)
	m.workerEvent(ws, "info", fmt.Sprintf("adopted running engine PID %d on port %d", proc.PID, w.Port))
	return true, nil
}

// withFiles fills in the paths of an engine's log and pid files, which a
// Process rebuilt from the store lacks: the pid file (and the argv file
// beside it) let Adopt know an engine whose wrapper exec'd another
// executable.
func (m *Manager) withFiles(proc enginectl.Process, t Transport, node, model string) enginectl.Process {
	if proc.LogPath == "" {
		proc.LogPath = logPath(m.stateDir(t), node, model)
	}
	if proc.PIDPath == "" {
		proc.PIDPath = strings.TrimSuffix(proc.LogPath, ".log") + ".pid"
	}
	return proc
}

// resolveLaunch looks on the node for the engine of a launch recorded
// before its start whose PID was never stored (ws.inDoubt): the hub was
// killed between the two, or the start failed after the fork. Found, it is
// the worker's engine, to be adopted or stopped like any recorded one; not
// found, nothing of that launch runs.
func (m *Manager) resolveLaunch(ctx context.Context, ws *workerState, node fleet.Node, t Transport) error {
	m.mu.Lock()
	w := ws.w
	m.mu.Unlock()
	if m.opts.FleetID == "" || w.Launch == 0 {
		ws.inDoubt = false
		return nil
	}
	pidPaths, err := m.launchPIDPaths(ctx, t, node.Name, w.Model)
	if err != nil {
		return fmt.Errorf("looking for the engine of launch %d, recorded before the hub stopped: %w", w.Launch, err)
	}
	var (
		proc  enginectl.Process
		found bool
	)
	for _, pidPath := range pidPaths {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		proc, found, err = enginectl.FindLaunch(fctx, t, pidPath, enginectl.Owner{FleetID: m.opts.FleetID, Launch: w.Launch}, m.engineOptions()...)
		cancel()
		if err != nil {
			return fmt.Errorf("looking for the engine of launch %d, recorded before the hub stopped: %w", w.Launch, err)
		}
		if found {
			break
		}
	}
	ws.inDoubt = false
	if !found {
		m.update(ws, func(w *fleet.Worker) { w.Launch = 0 })
		return nil
	}
	proc.ServedName = w.Model
	proc.StartedAt = time.Now()
	ws.proc = proc
	m.update(ws, func(w *fleet.Worker) { w.PID, w.PGID, w.StartedAt = proc.PID, proc.PGID, proc.StartedAt })
	m.workerEvent(ws, "warn", fmt.Sprintf("found engine PID %d of launch %d, started just before the hub stopped and not recorded then; it is checked now, not launched twice", proc.PID, w.Launch))
	return nil
}

// launchPIDPaths is where the pid file of a launch on node may be: under
// this hub's state dir for the node and, on a local or sim node, under each
// other hub's data dir on this machine (a former leader's launch).
func (m *Manager) launchPIDPaths(ctx context.Context, t Transport, node, model string) ([]string, error) {
	paths := []string{m.withFiles(enginectl.Process{}, t, node, model).PIDPath}
	if s, ok := t.(interface{ StateDir() string }); !ok || s.StateDir() == "" || m.opts.OtherDataDirs == nil {
		return paths, nil
	}
	dirs, err := m.opts.OtherDataDirs(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the other hubs' data dirs: %w", err)
	}
	for _, d := range dirs {
		p := strings.TrimSuffix(logPath(NodeStateDir(d, node), node, model), ".log") + ".pid"
		if !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	return paths, nil
}
