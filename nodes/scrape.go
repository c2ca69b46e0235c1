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
	w, err := m.supervised(worker)
	if err != nil {
		return enginectl.Load{}, fmt.Errorf("scrape %s: %w", worker, err)
	}
	return m.ScrapeWorker(ctx, w)
}

// ScrapeWorker is Scrape of a worker as the caller knows it: a following
// manager supervises no worker, and its hub knows them from the database.
func (m *Manager) ScrapeWorker(ctx context.Context, w fleet.Worker) (enginectl.Load, error) {
	t, err := m.servingTransport(w)
	if err != nil {
		return enginectl.Load{}, fmt.Errorf("scrape %s: %w", w.Name(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	l, err := enginectl.Scrape(ctx, t, w.Port, w.Engine)
	if err != nil {
		return enginectl.Load{}, fmt.Errorf("scrape %s: %w", w.Name(), err)
	}
	return l, nil
}

// EngineMetrics reads a serving worker's engine /metrics page through its
// node's transport, as Scrape reaches it. An engine without one returns an
// error wrapping enginectl.ErrNoMetrics.
func (m *Manager) EngineMetrics(ctx context.Context, worker string) (fleet.Worker, []byte, error) {
	w, err := m.supervised(worker)
	if err != nil {
		return w, nil, fmt.Errorf("engine metrics of %s: %w", worker, err)
	}
	text, err := m.WorkerMetrics(ctx, w)
	return w, text, err
}

// WorkerMetrics is EngineMetrics of a worker as the caller knows it (see
// ScrapeWorker).
func (m *Manager) WorkerMetrics(ctx context.Context, w fleet.Worker) ([]byte, error) {
	t, err := m.servingTransport(w)
	if err != nil {
		return nil, fmt.Errorf("engine metrics of %s: %w", w.Name(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	text, err := enginectl.MetricsText(ctx, t, w.Port, w.Engine)
	if err != nil {
		return nil, fmt.Errorf("engine metrics of %s: %w", w.Name(), err)
	}
	return text, nil
}

// supervised is the worker this manager supervises under that name.
func (m *Manager) supervised(worker string) (fleet.Worker, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ws, ok := m.workers[worker]
	if !ok || ws.retiring {
		return fleet.Worker{}, fmt.Errorf("no such worker; workers are named NODE/MODEL, see `fleet workers`")
	}
	return ws.w, nil
}

// servingTransport is the transport of a serving worker's node.
func (m *Manager) servingTransport(w fleet.Worker) (Transport, error) {
	m.mu.Lock()
	var t Transport
	var node fleet.Node
	if ns, ok := m.nodes[w.Node]; ok {
		t, node = ns.transport, ns.node
	}
	m.mu.Unlock()
	switch {
	case w.State != fleet.WorkerReady && w.State != fleet.WorkerDraining && w.State != fleet.WorkerProbation:
		return nil, fmt.Errorf("the worker is %s, so no engine of it is serving; scrape it once it is ready", w.State)
	case w.Port <= 0:
		return nil, fmt.Errorf("the worker has no engine port yet")
	case t == nil || node.State != fleet.NodeUp:
		return nil, fmt.Errorf("node %s is not connected: %s", w.Node, cmp.Or(node.Reason, string(node.State), "not probed yet"))
	}
	return t, nil
}
