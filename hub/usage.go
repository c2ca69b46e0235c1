package hub

// Usage per API key, model and worker (fleet usage), the keys' limits, and
// the hub's own series on /metrics (worker and node states).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"fleet"
	"fleet/enginectl"
	"fleet/router"
	"fleet/store"
)

// usageFlushInterval paces writing counted usage to SQLite: one
// transaction a few seconds, never one per request.
const usageFlushInterval = 2 * time.Second

// maxPendingUsage bounds the rows waiting for a flush. A row is one
// minute × key × model × worker, all from bounded sets (the key table, the
// fleet's models and workers), so only a store stuck for long reaches it;
// then new rows are dropped (and logged) rather than the hub's memory grown.
const maxPendingUsage = 10000

// Ledger keeps what API keys spend: the router's usage reports, summed in
// memory and written to the store, the keys' limits given to the router,
// and the usage figures the console shows. The hub composes one.
type Ledger struct {
	guard *guard
	store *store.Store
	log   *slog.Logger
	// router is told each key's limits and what it spent today; set once,
	// when the hub has built the router (which reports usage here).
	router *router.Router
	// keys checks the router's API keys from memory (keys.go);
	// keysReloaded, when set (by tests), is told of each reload watchKeys
	// made and how it went.
	keys         keyCache
	keysReloaded func(error)
	// usage sums the router's token counts until they are written.
	usage      usageRecorder
	usageCache usageCache
	// keysNotChecked is why the router checks no API key ("" when it
	// does): a key limit set then holds nothing, and says so.
	keysNotChecked string
}

// KeysNotChecked says why this hub's router checks no API key, and so
// applies no key limit; "" when it checks them.
func (lg *Ledger) KeysNotChecked() string { return lg.keysNotChecked }

type usageKey struct {
	bucket             int64
	key, model, worker string
}

// usageRecorder sums the router's usage reports in memory, off the request
// path but for a map update, until the flush loop writes them.
type usageRecorder struct {
	mu      sync.Mutex
	pending map[usageKey]*fleet.Usage
	dropped int
}

func (r *usageRecorder) add(u router.Usage) {
	if u.Model == "" || u.Worker == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addLocked(fleet.Usage{Bucket: u.At.Truncate(store.UsageBucket).UTC(), Key: u.Key, Model: u.Model, Worker: u.Worker, Requests: 1,
		PromptTokens: int64(u.PromptTokens), CachedTokens: int64(u.CachedTokens), CompletionTokens: int64(u.CompletionTokens)})
}

func (r *usageRecorder) addLocked(row fleet.Usage) {
	if r.pending == nil {
		r.pending = map[usageKey]*fleet.Usage{}
	}
	k := usageKey{row.Bucket.Unix(), row.Key, row.Model, row.Worker}
	p, ok := r.pending[k]
	if !ok {
		if len(r.pending) >= maxPendingUsage {
			r.dropped++
			return
		}
		p = &fleet.Usage{Bucket: row.Bucket, Key: row.Key, Model: row.Model, Worker: row.Worker}
		r.pending[k] = p
	}
	p.Requests += row.Requests
	p.PromptTokens += row.PromptTokens
	p.CachedTokens += row.CachedTokens
	p.CompletionTokens += row.CompletionTokens
}

// putBack keeps rows a flush could not write, for the next one.
func (r *usageRecorder) putBack(rows []fleet.Usage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, row := range rows {
		r.addLocked(row)
	}
}

// take empties the recorder.
func (r *usageRecorder) take() ([]fleet.Usage, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rows := make([]fleet.Usage, 0, len(r.pending))
	for _, row := range r.pending {
		rows = append(rows, *row)
	}
	clear(r.pending)
	dropped := r.dropped
	r.dropped = 0
	return rows, dropped
}

// flushUsage writes counted usage to the store every interval and once more
// when ctx ends. A failed write is put back, to be retried with the next.
func (lg *Ledger) flushUsage(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		done := false
		select {
		case <-t.C:
		case <-ctx.Done():
			done = true
		}
		lg.writeUsage(context.WithoutCancel(ctx))
		if done {
			return
		}
	}
}

func (lg *Ledger) writeUsage(ctx context.Context) {
	rows, dropped := lg.usage.take()
	if dropped > 0 {
		lg.log.Warn("usage rows dropped: the store fell behind", "dropped", dropped)
	}
	if err := lg.store.AddUsage(ctx, rows); err != nil {
		lg.log.Warn("could not store usage; keeping it for the next try", "rows", len(rows), "err", err)
		lg.usage.putBack(rows)
	}
}

// Usage totals the usage counted since since, by key, model or worker.
// By key needs an admin, as key names do.
func (lg *Ledger) Usage(ctx context.Context, u fleet.User, since time.Time, by string) (us []fleet.Usage, err error) {
	action := fleet.ActionUsage
	if by == string(store.UsageByKey) {
		action = fleet.ActionUsageByKey
	}
	err = lg.guard.do(u, action, by, func() (string, error) {
		// What the router counted in the last seconds is not lost to a
		// reader who asks now.
		lg.writeUsage(ctx)
		us, err = lg.store.Usage(ctx, since, store.UsageBy(by))
		return "", err
	})
	return us, err
}

// SetKeyLimits sets an API key's limits (0: none), at once on the router.
func (lg *Ledger) SetKeyLimits(ctx context.Context, u fleet.User, name string, l fleet.KeyLimits) error {
	target := fmt.Sprintf("%s (%s requests/min, %s tokens/day)", name, fleet.LimitText(int64(l.RequestsPerMinute)), fleet.LimitText(l.TokensPerDay))
	return lg.guard.do(u, fleet.ActionKeyLimit, target, func() (string, error) {
		if err := lg.store.SetAPIKeyLimits(ctx, name, l); err != nil {
			return "", err
		}
		return "", lg.loadKeyLimits(ctx)
	})
}

// reloadKeys reads the keys again after one was created or revoked, here
// or on another hub: the keys the router takes and their limits. What
// cannot be read stays as it was.
func (lg *Ledger) reloadKeys(ctx context.Context) error {
	return errors.Join(lg.keys.reload(ctx), lg.loadKeyLimits(ctx))
}

// loadKeyLimits gives the router every live key's limits and, so that a
// restarted hub does not forget them, the tokens each spent today (UTC).
// The seed replaces the router's own count, so what the router counted
// since the last flush is written first, or it would be forgotten.
func (lg *Ledger) loadKeyLimits(ctx context.Context) error {
	lg.writeUsage(ctx)
	keys, err := lg.store.APIKeys(ctx)
	if err != nil {
		return err
	}
	limits := map[string]fleet.KeyLimits{}
	for _, k := range keys {
		if k.Revoked.IsZero() {
			limits[k.Name] = k.KeyLimits
		}
	}
	lg.router.SetKeyLimits(limits)
	now := time.Now().UTC()
	day := now.Truncate(24 * time.Hour)
	used, err := lg.store.KeyTokensSince(ctx, day)
	if err != nil {
		return err
	}
	lg.router.SeedKeyTokens(now, used)
	return nil
}

// hubCollector serves the hub's own view on /metrics: each worker's state
// and each node's, one series per worker or node and state (all bounded
// by the fleet), read when Prometheus scrapes.
type hubCollector struct {
	h          *Hub
	workerDesc *prometheus.Desc
	nodeDesc   *prometheus.Desc
}

var workerStates = []fleet.WorkerState{fleet.WorkerPending, fleet.WorkerInstalling, fleet.WorkerStarting, fleet.WorkerProbation,
	fleet.WorkerReady, fleet.WorkerDraining, fleet.WorkerStopped, fleet.WorkerFailed, fleet.WorkerRejected}

var nodeStates = []fleet.NodeState{fleet.NodeUnknown, fleet.NodeUp, fleet.NodeUnreachable}

func newHubCollector(h *Hub) *hubCollector {
	return &hubCollector{
		h: h,
		workerDesc: prometheus.NewDesc("fleet_worker_state", "1 for the state each worker is in, 0 for the others.",
			[]string{"node", "worker", "model", "engine", "state"}, nil),
		nodeDesc: prometheus.NewDesc("fleet_node_state", "1 for the state each node is in, 0 for the others.",
			[]string{"node", "state"}, nil),
	}
}

func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.workerDesc
	ch <- c.nodeDesc
}

func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.state.mu.Lock()
	workers := make([]fleet.Worker, 0, len(c.h.state.workers))
	for _, w := range c.h.state.workers {
		workers = append(workers, w)
	}
	nodes := make([]fleet.Node, 0, len(c.h.state.nodes))
	for _, n := range c.h.state.nodes {
		nodes = append(nodes, n)
	}
	c.h.state.mu.Unlock()
	for _, w := range workers {
		for _, s := range workerStates {
			ch <- prometheus.MustNewConstMetric(c.workerDesc, prometheus.GaugeValue, b2f(w.State == s), w.Node, w.Name(), w.Model, string(w.Engine), string(s))
		}
	}
	for _, n := range nodes {
		for _, s := range nodeStates {
			ch <- prometheus.MustNewConstMetric(c.nodeDesc, prometheus.GaugeValue, b2f(n.State == s), n.Name, string(s))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// scrapeEngineMetrics passes a worker's engine /metrics page to the router,
// which serves it relabelled. An engine without one is nothing to report.
func (h *Hub) scrapeEngineMetrics(ctx context.Context, w fleet.Worker) {
	at, worker := time.Now(), w.Name()
	text, err := h.mgr.WorkerMetrics(ctx, w)
	if err != nil {
		if !errors.Is(err, enginectl.ErrNoMetrics) && ctx.Err() == nil {
			h.log.Debug("engine metrics scrape failed", "worker", worker, "err", err)
		}
		return
	}
	if err := h.router.ObserveEngineMetrics(w.Node, worker, w.Engine, text, at); err != nil {
		h.log.Warn("engine metrics not served", "worker", worker, "err", err)
	}
}

// recentUsageTTL is how long the console's usage figures are reused: every
// console asks twice a second, SQLite need not answer that often.
const recentUsageTTL = 10 * time.Second

type usageCache struct {
	mu       sync.Mutex
	at       time.Time
	reading  bool // one console reads the store; the others show the last figures meanwhile
	byWorker []fleet.Usage
	byKey    []fleet.Usage
}

// recentUsage is the last 24 hours' usage by worker and, with byKey, by
// key, for the console's usage view; a failed read shows none. The store is
// read outside the cache's lock, by one caller at a time: a slow read holds
// up that console's snapshot only, not every console's.
func (lg *Ledger) recentUsage(ctx context.Context, byKey bool) []fleet.Usage {
	c := &lg.usageCache
	c.mu.Lock()
	now := time.Now()
	read := !c.reading && now.Sub(c.at) > recentUsageTTL
	c.reading = c.reading || read
	c.mu.Unlock()
	if read {
		since := now.Add(-24 * time.Hour)
		workers, err := lg.store.Usage(ctx, since, store.UsageByWorker)
		keys, kerr := lg.store.Usage(ctx, since, store.UsageByKey)
		for i := range workers {
			if _, m, ok := strings.Cut(workers[i].Worker, "/"); ok {
				workers[i].Model = m
			}
		}
		err = errors.Join(err, kerr)
		c.mu.Lock()
		c.reading = false
		switch {
		case err != nil && ctx.Err() != nil:
			// This console left mid-read: the figures are not wrong, only
			// not refreshed; the next snapshot reads again.
		default:
			if err != nil {
				lg.log.Warn("reading usage for the console", "err", err)
			}
			c.at, c.byWorker, c.byKey = now, workers, keys
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.byWorker)
	if byKey {
		out = append(out, c.byKey...)
	}
	return out
}
