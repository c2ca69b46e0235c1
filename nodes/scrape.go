package nodes

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"fleet"
	"fleet/enginectl"
)

// scrapeTimeout bounds one scrape, so a node whose tunnel stalls cannot hold
// a caller that scrapes every worker on an interval past its next round.
const scrapeTimeout = 4 * time.Second

// Scrape reads the load a worker's engine reports about itself (running and
// waiting requests, slots, KV fill) through its node's transport, the same
// way the health probe reaches it. The worker must be serving: ready,
// draining or on probation. An engine with no load figures (Ollama) returns
// an error that wraps enginectl.ErrNoLoadSignal, which a periodic caller
// should treat as "nothing to learn here" rather than a fault.
func (m *Manager) Scrape(ctx context.Context, worker string) (enginectl.Load, error) {
	w, t, err := m.scrapeTarget(worker)
	if err != nil {
		return enginectl.Load{}, fmt.Errorf("scrape %s: %w", worker, err)
	}
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	l, err := enginectl.Scrape(ctx, t, w.Port, w.Engine)
	if err != nil {
		return enginectl.Load{}, fmt.Errorf("scrape %s: %w", worker, err)
	}
	return l, nil
}

// EngineMetrics reads a serving worker's engine /metrics page through its
// node's transport, as Scrape reaches it. An engine without one returns an
// error wrapping enginectl.ErrNoMetrics.
func (m *Manager) EngineMetrics(ctx context.Context, worker string) (fleet.Worker, []byte, error) {
	w, t, err := m.scrapeTarget(worker)
	if err != nil {
		return w, nil, fmt.Errorf("engine metrics of %s: %w", worker, err)
	}
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	text, err := enginectl.MetricsText(ctx, t, w.Port, w.Engine)
	if err != nil {
		return w, nil, fmt.Errorf("engine metrics of %s: %w", worker, err)
	}
	return w, text, nil
}

// scrapeTarget is a serving worker and its node's transport.
func (m *Manager) scrapeTarget(worker string) (fleet.Worker, Transport, error) {
	m.mu.Lock()
	ws, ok := m.workers[worker]
	var w fleet.Worker
	var ns *nodeState
	if ok {
		w = ws.w
		ns = m.nodes[ws.placement.Node]
	}
	var t Transport
	var node fleet.Node
	if ns != nil {
		t, node = ns.transport, ns.node
	}
	m.mu.Unlock()

	switch {
	case !ok || ws.retiring:
		return w, nil, fmt.Errorf("no such worker; workers are named NODE/MODEL, see `fleet workers`")
	case w.State != fleet.WorkerReady && w.State != fleet.WorkerDraining && w.State != fleet.WorkerProbation:
		return w, nil, fmt.Errorf("the worker is %s, so no engine of it is serving; scrape it once it is ready", w.State)
	case w.Port <= 0:
		return w, nil, fmt.Errorf("the worker has no engine port yet")
	case t == nil || node.State != fleet.NodeUp:
		return w, nil, fmt.Errorf("node %s is not connected: %s", w.Node, cmp.Or(node.Reason, string(node.State), "not probed yet"))
	}
	return w, t, nil
}
