package hub

// The state mirror: what the node manager reports, kept in memory, persisted,
// handed to the router, and read back as snapshots and target names.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/enginectl"
	"fleet/hub/admission"
	"fleet/router"
	"fleet/store"
)

// mirror is the hub's copy of the fleet: the workers and nodes as the node
// manager last reported them, and the models and placements as declared.
// The node manager's callbacks (onWorker, onNode, …) write it; snapshots
// read it, and admission reads it as its admission.Fleet.
type mirror struct {
	mu      sync.Mutex
	workers map[string]fleet.Worker // by worker name, as the manager last reported
	nodes   map[string]fleet.Node
	models  []fleet.Model
	// placements are the declared ones: a placed worker the manager has not
	// reported yet is one the router waits for.
	placements []fleet.Placement
	// bench is each worker's latest bench sweep of each split, kept here so snapshots
	// (twice a second per console) never parse stored runs.
	bench map[benchKey]admission.BenchSummary
	// routerDrained is what syncRouter last had the router drain, so that
	// it undrains a worker whose drain ended on another hub.
	routerDrained map[string]bool
}

// benchKey is a worker and a bench split (agent, else chat).
type benchKey struct {
	worker string
	agent  bool
}

// SetBench keeps a worker's latest bench sweep of one split.
func (ms *mirror) SetBench(worker string, b admission.BenchSummary) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.bench[benchKey{worker, b.Agent}] = b
}

// Worker is the worker of that name as the manager last reported it.
func (ms *mirror) Worker(name string) (fleet.Worker, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	w, ok := ms.workers[name]
	return w, ok
}

// Workers are the workers of the model with that ID.
func (ms *mirror) Workers(model string) []fleet.Worker {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var out []fleet.Worker
	for _, w := range ms.workers {
		if w.Model == model {
			out = append(out, w)
		}
	}
	return out
}

// ModelID is the ID of the model that name (an ID or an alias) names.
func (ms *mirror) ModelID(name string) (string, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, m := range ms.models {
		if m.Serves(name) {
			return m.ID, true
		}
	}
	return "", false
}

// Model is the declared model with that ID.
func (ms *mirror) Model(id string) (fleet.Model, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, m := range ms.models {
		if m.ID == id {
			return m, true
		}
	}
	return fleet.Model{}, false
}

// takesNoRequests says whether the router must send the worker no new
// request: an operator drained it (or a restart is draining it), or a
// `fleet stop` holds it and drains it before stopping. Every hub reads it
// from the worker's row, so a drain recorded by the leader reaches every
// router.
func takesNoRequests(w fleet.Worker) bool {
	return w.Drained || w.Held || w.State == fleet.WorkerDraining
}

// ready lists the workers that serve (ready or draining), for scraping.
func (ms *mirror) ready() []fleet.Worker {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var out []fleet.Worker
	for _, w := range ms.workers {
		if w.State == fleet.WorkerReady || w.State == fleet.WorkerDraining {
			out = append(out, w)
		}
	}
	return out
}

// nodeList is the nodes as this hub sees them.
func (ms *mirror) nodeList() []fleet.Node {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make([]fleet.Node, 0, len(ms.nodes))
	for _, n := range ms.nodes {
		out = append(out, n)
	}
	return out
}

// anyReady says whether the router has a worker to send requests to.
func (ms *mirror) anyReady() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, w := range ms.workers {
		if w.State == fleet.WorkerReady && !w.Drained {
			return true
		}
	}
	return false
}

func (h *Hub) onWorker(w fleet.Worker) {
	if err := h.recordWorker(context.Background(), w); err != nil {
		h.log.Error("could not persist worker state", "worker", w.Name(), "state", w.State, "err", err)
	}
}

// recordWorker keeps the worker the node manager reports, in memory and in
// the store, and says when the store did not take it. Writes of workers go
// one at a time (saveMu), each with the drain flag as it is then: a write
// that read the flag before a drain cannot land after the drain's own.
func (h *Hub) recordWorker(ctx context.Context, w fleet.Worker) error {
	w = sanitizeWorker(w)
	h.saveMu.Lock()
	defer h.saveMu.Unlock()
	h.state.mu.Lock()
	if old, ok := h.state.workers[w.Name()]; ok {
		w.Drained = old.Drained // the drain flag is the hub's, not the manager's
	}
	h.state.workers[w.Name()] = w
	h.state.mu.Unlock()
	defer h.syncRouter()
	saved, err := h.store.SaveWorker(ctx, w)
	if errors.Is(err, store.ErrNotFound) {
		// A retiring worker whose node or model left the fleet: its pending
		// stop, not a worker row, keeps it until its engine is stopped.
		h.log.Debug("not persisting a worker that left the fleet", "worker", w.Name(), "state", w.State)
		return nil
	}
	if err != nil {
		return err
	}
	h.state.mu.Lock()
	if cur, ok := h.state.workers[w.Name()]; ok {
		cur.ID = saved.ID
		h.state.workers[w.Name()] = cur
	}
	h.state.mu.Unlock()
	return nil
}

// recordLaunch stores the worker with a new launch serial before its engine
// starts (store.RecordLaunch), with the hub's drain flag.
func (h *Hub) recordLaunch(ctx context.Context, w fleet.Worker) (fleet.Worker, error) {
	w = sanitizeWorker(w)
	h.saveMu.Lock()
	defer h.saveMu.Unlock()
	h.state.mu.Lock()
	if old, ok := h.state.workers[w.Name()]; ok {
		w.Drained = old.Drained
	}
	h.state.mu.Unlock()
	return h.store.RecordLaunch(ctx, w)
}

// fault is a point where a crash is worst; Options.Fault kills a test's hub there.
func (h *Hub) fault(point string) {
	if h.opts.Fault != nil {
		h.opts.Fault(point)
	}
}

// The manager's callbacks (onWorker, onNode, onEvent) and the log reads are
// where text from nodes and engines enters the hub: a reason quoting a
// node's error, an engine's version, a probe's GPU names, an installer's
// output. Each passes through fleet.Sanitize there, before the store, a
// terminal or a JSON reader sees it.

func sanitizeWorker(w fleet.Worker) fleet.Worker {
	w.Reason, w.EngineVersion = fleet.Sanitize(w.Reason), fleet.Sanitize(w.EngineVersion)
	return w
}

func sanitizeNode(n fleet.Node) fleet.Node {
	n.Reason = fleet.Sanitize(n.Reason)
	if n.Platform != nil {
		p := *n.Platform
		p.OS, p.Arch, p.Chip, p.Profile = fleet.Sanitize(p.OS), fleet.Sanitize(p.Arch), fleet.Sanitize(p.Chip), fleet.Sanitize(p.Profile)
		p.Engines = sanitizeEngines(p.Engines)
		p.GPUs = slices.Clone(p.GPUs)
		for i := range p.GPUs {
			p.GPUs[i].Name = fleet.Sanitize(p.GPUs[i].Name)
		}
		// A failing nvidia-smi's output, quoted.
		p.GPUError = fleet.Sanitize(p.GPUError)
		p.Notes = slices.Clone(p.Notes)
		for i := range p.Notes {
			p.Notes[i] = fleet.Sanitize(p.Notes[i])
		}
		n.Platform = &p
	}
	return n
}

func (h *Hub) onWorkerRemoved(w fleet.Worker) {
	h.state.mu.Lock()
	delete(h.state.workers, w.Name())
	h.state.mu.Unlock()
	if err := h.store.DeleteWorker(context.Background(), w.Node, w.Model); err != nil && !errors.Is(err, store.ErrNotFound) {
		h.log.Warn("could not forget a removed worker", "worker", w.Name(), "err", err)
	}
	if err := h.store.DeletePendingStop(context.Background(), w.Name()); err != nil {
		h.log.Warn("could not forget the pending stop of a stopped engine", "worker", w.Name(), "err", err)
	}
	h.syncRouter()
}

func (h *Hub) onNode(n fleet.Node) {
	n = sanitizeNode(n)
	h.state.mu.Lock()
	if _, declared := h.state.nodes[n.Name]; !declared {
		// A node that left the fleet, kept connected only to stop its engines.
		h.state.mu.Unlock()
		return
	}
	h.state.nodes[n.Name] = n
	h.state.mu.Unlock()
	if !h.cluster.stillLeading() {
		return // the leader records the nodes' state; this hub's link is its own
	}
	ctx := context.Background()
	if n.Platform != nil {
		if err := h.store.SetNodeProbe(ctx, n.Name, *n.Platform, n.ProbedAt); err != nil {
			h.log.Warn("could not persist node probe", "node", n.Name, "err", err)
		}
	}
	if err := h.store.SetNodeState(ctx, n.Name, n.State, n.Reason); err != nil {
		h.log.Warn("could not persist node state", "node", n.Name, "err", err)
	}
}

func (h *Hub) onEvent(e fleet.Event) {
	e.Subject, e.Message = fleet.Sanitize(e.Subject), fleet.Sanitize(e.Message)
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if _, err := h.store.AddEvent(context.Background(), e); err != nil {
		h.log.Warn("could not store event", "subject", e.Subject, "err", err)
	}
}

// syncRouter hands the router the ready set, with drained workers marked.
func (h *Hub) syncRouter() {
	h.state.mu.Lock()
	var bs []router.Backend
	var drained []string
	for name, w := range h.state.workers {
		if w.State != fleet.WorkerReady && w.State != fleet.WorkerDraining {
			continue
		}
		var kvPool int
		if w.Engine == fleet.EngineLlamaCpp {
			// Its slots share one cache of -c tokens (router/kvpool.go).
			kvPool = enginectl.SharedKVPool(w.Argv)
		}
		bs = append(bs, router.Backend{
			Name:       name,
			Model:      w.Model,
			ServedName: h.state.servedNameLocked(w),
			Engine:     w.Engine,
			Addr:       net.JoinHostPort("127.0.0.1", fmt.Sprint(w.Port)),
			Dial:       h.mgr.Dialer(w.Node),
			Context:    w.Context,
			Slots:      w.Slots,
			KVPool:     kvPool,
		})
		if takesNoRequests(w) {
			drained = append(drained, name)
		}
	}
	outlook := h.state.outlookLocked()
	was := h.state.routerDrained
	now := make(map[string]bool, len(drained))
	for _, name := range drained {
		now[name] = true
	}
	h.state.routerDrained = now
	h.state.mu.Unlock()
	h.router.SetBackendsAndOutlook(bs, outlook)
	for _, name := range drained {
		h.router.Drain(name)
	}
	// A drain that ended (an undrain, a restart done, a stop undone), on
	// this hub or on the leader, ends in this router too.
	for name := range was {
		if !now[name] {
			h.router.Undrain(name)
		}
	}
}

// drainedInFlight is this router's requests in flight on each worker that
// takes no new request: what this hub publishes for the leader's drains to
// wait for (cluster.publishDrains). A worker that is not ready (starting,
// stopped) is there too, with none, so that a drain or stop of it is not
// held up waiting for this hub's word.
func (h *Hub) drainedInFlight() map[string]int {
	h.state.mu.Lock()
	var names []string
	for name, w := range h.state.workers {
		if takesNoRequests(w) {
			names = append(names, name)
		}
	}
	h.state.mu.Unlock()
	out := make(map[string]int, len(names))
	for _, name := range names {
		out[name] = h.router.InFlight(name)
	}
	return out
}

// outlookLocked tells the router, per model, which placed workers are on
// their way and which cannot serve: a placement whose worker the manager
// has not reported yet is pending, and a worker stopped on its way to a
// restart (not held by 'fleet stop') is coming back.
func (ms *mirror) outlookLocked() map[string]router.Outlook {
	states := map[string][]fleet.WorkerState{}
	// The largest context of a model's coming workers, so that a request
	// too long for its ready workers waits for one that holds it.
	comingContext := map[string]int{}
	for _, p := range ms.placements {
		state := fleet.WorkerPending
		if w, ok := ms.workers[p.Node+"/"+p.Model]; ok {
			state = w.State
			if state == fleet.WorkerStopped && !w.Held {
				state = fleet.WorkerStarting
			}
		}
		states[p.Model] = append(states[p.Model], state)
		if router.Coming(state) {
			if i := slices.IndexFunc(ms.models, func(m fleet.Model) bool { return m.ID == p.Model }); i >= 0 {
				comingContext[p.Model] = max(comingContext[p.Model], p.ContextOf(ms.models[i]))
			}
		}
	}
	out := make(map[string]router.Outlook, len(states))
	for m, ss := range states {
		o := router.OutlookOf(ss)
		o.ComingContext = comingContext[m]
		out[m] = o
	}
	return out
}

// ServedName is the name w's engine answers to.
func (ms *mirror) ServedName(w fleet.Worker) string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.servedNameLocked(w)
}

// servedNameLocked is the name w's engine answers to, which the router and
// the checks send it (an Ollama tag differs from the model ID).
func (ms *mirror) servedNameLocked(w fleet.Worker) string {
	for _, m := range ms.models {
		if m.ID == w.Model {
			return enginectl.ServedName(m, w.Engine)
		}
	}
	return w.Model
}

// enginePorts are the engine ports of nodes that set none of their own.
func (h *Hub) enginePorts() fleet.PortRange {
	return h.opts.EnginePorts.Or(fleet.DefaultEnginePorts)
}

// snapshot is the whole fleet now, unredacted: for the hub itself; a user
// gets Snapshot.
func (h *Hub) snapshot(ctx context.Context) fleet.Snapshot {
	stats := map[string]router.BackendStats{}
	for _, s := range h.router.Stats() {
		stats[s.Name] = s
	}
	h.state.mu.Lock()
	snap := fleet.Snapshot{At: time.Now(), Models: slices.Clone(h.state.models), EnginePorts: h.enginePorts()}
	if h.cluster.on {
		role, leader := h.cluster.role()
		snap.Hub = &fleet.HubRole{Name: h.cluster.name, Role: role, Leader: leader}
	}
	for _, n := range h.state.nodes {
		snap.Nodes = append(snap.Nodes, n)
	}
	for name, w := range h.state.workers {
		v := fleet.WorkerView{Worker: w, Host: "?", GPU: "?"}
		if w.Drained && w.State == fleet.WorkerReady {
			v.State = fleet.WorkerDraining // ready ⇄ draining: the hub's drain flag is the state people see
		}
		if n, ok := h.state.nodes[w.Node]; ok && n.Platform != nil {
			v.Host, v.GPU = n.Platform.HostLabel(), n.Platform.GPULabel()
		}
		if b, ok := h.state.bench[benchKey{name, false}]; ok {
			v.Bench, v.BenchAt = b.Points, b.At
		}
		if b, ok := h.state.bench[benchKey{name, true}]; ok {
			v.AgentBench, v.AgentBenchAt = b.Points, b.At
		}
		if s, ok := stats[name]; ok {
			v.InFlight = s.InFlight
			v.TTFTms = s.TTFTms
			if s.SpeedMeasured {
				// Before, the figures are the router's prior, the same for
				// every worker: shown as "-", not as a measurement.
				v.TokPerSec, v.ITLms = s.TokPerSec, s.ITLms
				v.PredictedTTFTms = s.PredictedTTFTms
			}
			v.TTFTHistory, v.ITLHistory = s.TTFTHistory, s.ITLHistory
			if s.CacheHitKnown {
				v.CacheHit = &s.CacheHit
			}
		}
		v.EngineBin = engineBin(w, h.state.nodes[w.Node].Platform)
		snap.Workers = append(snap.Workers, v)
	}
	h.state.mu.Unlock()
	sort.Slice(snap.Nodes, func(i, j int) bool { return snap.Nodes[i].Name < snap.Nodes[j].Name })
	sort.Slice(snap.Workers, func(i, j int) bool { return snap.Workers[i].Name() < snap.Workers[j].Name() })
	if evs, err := h.store.Events(ctx, "", 0, 100); err == nil {
		snap.Events = evs
	}
	return snap
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// Resolve turns names typed by an operator into worker names: a node name is
// every worker on it; NODE/MODEL is one worker; "all" is every worker.
func (ms *mirror) Resolve(targets []string) ([]string, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var out []string
	for _, t := range targets {
		if t == "all" {
			if len(ms.workers) == 0 {
				return nil, errors.New("the fleet has no workers yet; place a model in the fleet file")
			}
			for name := range ms.workers {
				out = append(out, name)
			}
			continue
		}
		if _, ok := ms.workers[t]; ok {
			out = append(out, t)
			continue
		}
		var found bool
		for name, w := range ms.workers {
			if w.Node == t {
				out = append(out, name)
				found = true
			}
		}
		if !found {
			known := make([]string, 0, len(ms.workers))
			for name := range ms.workers {
				known = append(known, name)
			}
			sort.Strings(known)
			if _, isNode := ms.nodes[t]; isNode {
				return nil, fmt.Errorf("node %q has no workers yet; place a model on it in the fleet file (known workers: %s)", t, listOrNone(known))
			}
			return nil, fmt.Errorf("no worker or node named %q; known workers: %s", t, listOrNone(known))
		}
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// Events lists recent events, oldest first.
func (h *Hub) Events(ctx context.Context, u fleet.User, subject string, afterID int64, limit int) ([]fleet.Event, error) {
	evs, err := h.store.Events(ctx, subject, afterID, limit)
	if !u.Role.Allows(fleet.RoleAdmin) {
		// Engines' and installers' lines may carry credentials.
		evs = fleet.RedactEvents(evs)
	}
	return evs, err
}

// Snapshot is the fleet as u may see it: secrets (recipe env values,
// --api-key values, credentials quoted in a reason) only for admins, who can
// set them. What leaves the hub for a user is redacted here, for the
// command tree and the console alike (and Audit, Export, Logs, the
// console's texts likewise), so no frontend applies the rule itself.
func (h *Hub) Snapshot(ctx context.Context, u fleet.User) fleet.Snapshot {
	snap := h.snapshot(ctx)
	if !u.Role.Allows(fleet.RoleAdmin) {
		snap = fleet.RedactSnapshot(snap)
	}
	return snap
}

// WorkerLog returns the last lines of a worker's engine log.
func (h *Hub) WorkerLog(ctx context.Context, name string, lines int) ([]string, error) {
	var buf bytes.Buffer
	if err := h.mgr.WorkerLog(ctx, name, lines, &buf); err != nil {
		return nil, fmt.Errorf("reading the log of %s: %w (%s)", name, err, fleet.Sanitize(strings.TrimSpace(buf.String())))
	}
	return fleet.SanitizeLines(strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")), nil
}
