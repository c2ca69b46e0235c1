package hub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"fleet"
	"fleet/store"
)

// stopStart carries out `fleet stop` and `fleet start` on workers at once
// (a whole fleet waits for its slowest worker, not for the sum of them) and
// audits each worker. A stop drains first, like restart; the hold it records
// outlives the hub, so a restarted hub launches none of these workers until
// `fleet start`.
func (h *Hub) stopStart(ctx context.Context, u fleet.User, a fleet.Action, names []string) (string, error) {
	msgs := make([]string, len(names))
	errs := make([]error, len(names))
	lines := make([]*auditLine, len(names))
	for i, name := range names {
		// The audit line comes first: an action it cannot record is not done.
		line, err := h.guard.begin(u, a, name)
		if err != nil {
			errs[i] = err
			continue
		}
		// A stop is accepted once its hold is durable, before any drain: a
		// hub killed during the drains stops these engines when it starts
		// again, instead of bringing them back. On a follower the leader
		// holds and stops each (cluster.carryOut).
		if a.Name == "stop" && h.cluster.stillLeading() {
			if err := h.mgr.Hold(ctx, name); err != nil {
				errs[i] = fmt.Errorf("stopping %s: %w", name, err)
				line.endErr(errs[i])
				continue
			}
		}
		lines[i] = line
	}
	if a.Name == "stop" {
		h.fault("stop.accepted")
	}
	var wg sync.WaitGroup
	for i, name := range names {
		line := lines[i]
		if line == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs[i], errs[i] = h.cluster.onLeader(ctx, u, a.Name, name, nil, func() (string, error) {
				if a.Name == fleet.ActionStop {
					return h.stopWorker(ctx, name)
				}
				return h.startWorker(ctx, name)
			})
			line.endErr(errs[i])
		}()
	}
	wg.Wait()
	var out []string
	for _, m := range msgs {
		if m != "" {
			out = append(out, m)
		}
	}
	return strings.Join(out, "\n"), errors.Join(errs...)
}

func (h *Hub) stopWorker(ctx context.Context, name string) (string, error) {
	h.router.Drain(name)
	inflight := h.router.InFlight(name)
	h.onEvent(fleet.Event{Level: "info", Subject: name, Message: fmt.Sprintf("stopping: draining first, %d in flight", inflight)})
	wait, cancel := context.WithTimeout(ctx, h.opts.DrainTimeout)
	err := h.cluster.waitIdle(wait, name)
	cancel()
	if err != nil {
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: fmt.Sprintf("stop: drain timed out after %s; stopping with requests in flight: %v", h.opts.DrainTimeout, err)})
	}
	h.fault("stop.drained")
	err = h.mgr.StopWorker(ctx, name)
	// The router's drain served the stop; an operator's own drain stays.
	h.state.mu.Lock()
	drained := h.state.workers[name].Drained
	h.state.mu.Unlock()
	if !drained {
		h.router.Undrain(name)
	}
	if err != nil {
		return "", fmt.Errorf("stopping %s: %w", name, err)
	}
	return fmt.Sprintf("stopped %s: it stays stopped, across hub restarts, until `fleet start %s`", name, name), nil
}

func (h *Hub) startWorker(ctx context.Context, name string) (string, error) {
	if err := h.mgr.StartWorker(ctx, name); err != nil {
		return "", fmt.Errorf("starting %s: %w", name, err)
	}
	h.state.mu.Lock()
	w := h.state.workers[name]
	h.state.mu.Unlock()
	return fmt.Sprintf("started %s: %s, PID %d", name, w.State, w.PID), nil
}

// restorePendingStops hands the node manager the engines of removed
// placements that a previous hub had not stopped yet. One whose worker the
// fleet places again is that worker's engine now: its record moves to the
// worker, which adopts it.
func (h *Hub) restorePendingStops(ctx context.Context, f fleet.Fleet) error {
	ps, err := h.store.PendingStops(ctx)
	if err != nil {
		return err
	}
	placed := map[string]bool{}
	for _, p := range f.Placements {
		placed[p.Node+"/"+p.Model] = true
	}
	for _, p := range ps {
		h.mgr.RestoreRemoved(p.Worker, p.Node)
		if placed[p.Worker.Name()] {
			if err := h.store.DeletePendingStop(ctx, p.Worker.Name()); err != nil {
				return err
			}
			continue
		}
		h.log.Info("engine of a removed placement still to stop", "worker", p.Worker.Name(), "pid", p.Worker.PID, "node", p.Node.Name)
	}
	return nil
}

// pendingHostKey is the pinned key recorded with a pending stop, for a node
// that left the fleet with engines still to stop.
func pendingHostKey(ctx context.Context, st *store.Store, node string) (string, error) {
	ps, err := st.PendingStops(ctx)
	if err != nil {
		return "", err
	}
	for _, p := range ps {
		if p.Node.Name == node && p.Node.HostKey != "" {
			return p.Node.HostKey, nil
		}
	}
	return "", nil
}
