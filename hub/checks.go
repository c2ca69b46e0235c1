package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/bench"
	"fleet/bench/shape"
	"fleet/bench/sweep"
	"fleet/cli"
	"fleet/nodes"
	"fleet/router"
	"fleet/router/reasoning"
	"fleet/store"
)

// Admission probes are short: enough tokens to show where a reasoning model
// puts its thinking and to time decoding, not a benchmark.
const (
	admissionShapeTokens = 48
	admissionSpeedTokens = 64
	defaultTolerance     = 0.5
)

// workerTarget is a bench target that talks to one worker directly,
// bypassing the scheduler, through its node's transport (an SSH tunnel for a
// remote node).
func (h *Hub) workerTarget(name string) (bench.Target, fleet.Worker, error) {
	h.mu.Lock()
	w, ok := h.workers[name]
	h.mu.Unlock()
	if !ok {
		resolved, err := h.resolve([]string{name})
		if err != nil {
			return bench.Target{}, w, err
		}
		if len(resolved) != 1 {
			return bench.Target{}, w, fmt.Errorf("%s names %d workers (%s); name one as NODE/MODEL", name, len(resolved), strings.Join(resolved, ", "))
		}
		h.mu.Lock()
		w = h.workers[resolved[0]]
		h.mu.Unlock()
	}
	if w.Port == 0 || (w.State != fleet.WorkerReady && w.State != fleet.WorkerProbation && w.State != fleet.WorkerDraining) {
		return bench.Target{}, w, fmt.Errorf("worker %s is %s, not answering; wait until it is ready (see 'workers')", w.Name(), w.State)
	}
	dial := h.mgr.Dialer(w.Node)
	// Checks are occasional: no keep-alive, so a per-call client leaves no
	// idle connection (or SSH channel) behind.
	var rt http.RoundTripper = &http.Transport{
		DialContext:       func(ctx context.Context, network, addr string) (net.Conn, error) { return dial(ctx, network, addr) },
		DisableKeepAlives: true,
	}
	// With a normalisation mode on the model, checks see the shape the
	// router's clients get, not the engine's raw one.
	if m, ok := h.model(w.Model); ok && m.Reasoning != "" {
		mode, err := reasoning.ParseMode(m.Reasoning)
		if err != nil {
			return bench.Target{}, w, fmt.Errorf("model %s: %w", m.ID, err)
		}
		rt = router.NormalisingTransport(rt, mode)
	}
	// The router counts these requests as the worker's load.
	client := &http.Client{Transport: h.router.CountingTransport(rt, w.Name())}
	return bench.Target{
		Name:       w.Node,
		BaseURL:    fmt.Sprintf("http://127.0.0.1:%d/v1", w.Port),
		Model:      h.servedName(w),
		HTTPClient: client,
	}, w, nil
}

// Shape probes two workers with the same prompts and diffs their response shapes.
func (h *Hub) Shape(ctx context.Context, u fleet.User, a, b string) (shape.Report, error) {
	if err := h.authorize(u, fleet.ActionRole("shape"), "shape", a+" "+b); err != nil {
		return shape.Report{}, err
	}
	done, err := h.checks.start(u, "shape")
	if err != nil {
		return shape.Report{}, err
	}
	defer done()
	var shapes [2]shape.Shape
	var errs [2]error
	var wg sync.WaitGroup
	for i, name := range []string{a, b} {
		t, _, err := h.workerTarget(name)
		if err != nil {
			return shape.Report{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			shapes[i], errs[i] = shape.Probe(ctx, t)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return shape.Report{}, fmt.Errorf("probing %s: %w", []string{a, b}[i], err)
		}
	}
	return shape.Diff(shapes[0], shapes[1]), nil
}

// ShapeAll checks every ready worker of a model against its reference shape.
func (h *Hub) ShapeAll(ctx context.Context, u fleet.User, model string) ([]shape.Report, error) {
	if err := h.authorize(u, fleet.ActionRole("shape --all"), "shape --all", model); err != nil {
		return nil, err
	}
	done, err := h.checks.start(u, "shape --all")
	if err != nil {
		return nil, err
	}
	defer done()
	ref, err := h.referenceShape(ctx, model)
	if err != nil {
		return nil, err
	}
	// The pool is the ready, undrained workers; a full Snapshot would also
	// read events and router figures this does not need.
	var pool []string
	h.mu.Lock()
	for name, w := range h.workers {
		if w.Model == model && w.State == fleet.WorkerReady && !w.Drained {
			pool = append(pool, name)
		}
	}
	h.mu.Unlock()
	slices.Sort(pool)
	var reports []shape.Report
	for _, name := range pool {
		t, _, err := h.workerTarget(name)
		if err != nil {
			return nil, err
		}
		got, err := shape.Probe(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("probing %s: %w", name, err)
		}
		reports = append(reports, shape.Diff(ref, got))
	}
	return reports, nil
}

// PinShape makes a worker's current shape its model's reference. An admin's
// attempt is audited whether or not it got as far as the worker.
func (h *Hub) PinShape(ctx context.Context, u fleet.User, worker string) (string, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "shape pin", worker); err != nil {
		return "", err
	}
	done, err := h.checks.start(u, "shape pin")
	if err != nil {
		return "", err
	}
	defer done()
	msg, err := h.pinShape(ctx, worker)
	if err != nil {
		h.audit(u, "shape pin", worker, "failed: "+err.Error())
		return "", err
	}
	h.audit(u, "shape pin", worker, "ok")
	return msg, nil
}

func (h *Hub) pinShape(ctx context.Context, worker string) (string, error) {
	t, w, err := h.workerTarget(worker)
	if err != nil {
		return "", err
	}
	got, err := shape.Probe(ctx, t)
	if err != nil {
		return "", fmt.Errorf("probing %s: %w", worker, err)
	}
	data, err := json.Marshal(got)
	if err != nil {
		return "", err
	}
	if err := h.store.SetReferenceShape(ctx, w.Model, data, true); err != nil {
		return "", err
	}
	return fmt.Sprintf("the reference shape of %s is now %s's", w.Model, w.Name()), nil
}

func (h *Hub) referenceShape(ctx context.Context, model string) (shape.Shape, error) {
	data, _, err := h.store.ReferenceShape(ctx, model)
	if err != nil {
		return shape.Shape{}, fmt.Errorf("model %s has no reference shape yet (its first admitted worker sets it; or run 'shape pin WORKER'): %w", model, err)
	}
	var ref shape.Shape
	if err := json.Unmarshal(data, &ref); err != nil {
		return shape.Shape{}, fmt.Errorf("the stored reference shape of %s is unreadable (run 'shape pin WORKER' to replace it): %w", model, err)
	}
	return ref, nil
}

// Bench runs a closed-loop concurrency sweep against a worker (directly) or
// a model (through the router), stores the result and feeds the samples.
func (h *Hub) Bench(ctx context.Context, u fleet.User, target string, o cli.BenchOptions, progress io.Writer) (sweep.Result, error) {
	if err := h.authorize(u, fleet.RoleOperator, "bench", target); err != nil {
		return sweep.Result{}, err
	}
	done, err := h.checks.start(u, "bench")
	if err != nil {
		h.audit(u, "bench", target, "refused: "+err.Error())
		return sweep.Result{}, err
	}
	defer done()
	var t bench.Target
	worker := ""
	if h.knownModel(target) {
		t = bench.Target{Name: target + " via router", BaseURL: "http://" + h.routerAddr() + "/v1", Model: target}
	} else {
		var w fleet.Worker
		var err error
		if t, w, err = h.workerTarget(target); err != nil {
			h.audit(u, "bench", target, "failed: "+err.Error())
			return sweep.Result{}, err
		}
		worker = w.Name()
	}
	opts := sweep.Options{Levels: o.Levels, Split: o.Split, Turns: o.Turns, RequestsPerLevel: o.Requests, OutputTokens: o.Tokens, Logger: h.log}
	if progress != nil {
		opts.Progress = func(done, total int) {
			const width = 30
			filled := width * done / max(total, 1)
			fmt.Fprintf(progress, "\r[%s%s] %d/%d requests", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total)
			if done == total {
				fmt.Fprintln(progress)
			}
		}
	}
	res, err := sweep.Sweep(ctx, t, opts)
	if err != nil {
		h.audit(u, "bench", target, "failed: "+err.Error())
		return res, err
	}
	h.audit(u, "bench", target, "ok")
	if worker != "" {
		if data, err := json.Marshal(res); err == nil {
			if err := h.store.AddBenchRun(ctx, worker, data); err != nil {
				h.log.Warn("could not store the bench run", "worker", worker, "err", err)
			}
		}
		if err := h.store.AddSamples(ctx, res.Samples(worker)); err != nil {
			h.log.Warn("could not store bench samples", "worker", worker, "err", err)
		}
		h.seedSpeed(worker, res)
		h.mu.Lock()
		h.bench[worker] = summarise(res)
		h.mu.Unlock()
	}
	return res, nil
}

// benchSummary is what the console charts of a bench sweep.
type benchSummary struct {
	at     time.Time
	points []fleet.BenchPoint
}

func summarise(res sweep.Result) benchSummary {
	b := benchSummary{at: res.StartedAt}
	for _, l := range res.Levels {
		b.points = append(b.points, fleet.BenchPoint{
			Concurrency:         l.Concurrency,
			TotalTokPerSec:      l.TotalTokPerSec,
			PerRequestTokPerSec: l.PerRequestTokPerS,
			TTFTp50ms:           l.TTFT.P50,
		})
	}
	return b
}

// loadBenchRuns reads each worker's latest stored sweep at start.
func (h *Hub) loadBenchRuns(ctx context.Context) error {
	runs, err := h.store.LatestBenchRuns(ctx)
	if err != nil {
		return err
	}
	for _, r := range runs {
		var res sweep.Result
		if err := json.Unmarshal(r.Run, &res); err != nil {
			h.log.Warn("skipping an unreadable stored bench run", "worker", r.Worker, "id", r.ID, "err", err)
			continue
		}
		h.bench[r.Worker] = summarise(res)
	}
	return nil
}

func (h *Hub) knownModel(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.models {
		if m.Serves(name) {
			return true
		}
	}
	return false
}

func (h *Hub) model(id string) (fleet.Model, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.models {
		if m.ID == id {
			return m, true
		}
	}
	return fleet.Model{}, false
}

// admit is the admission check between probation and ready, the first
// seed's three rules: enough free memory, single-request speed within the
// model's tolerance of its best ready worker, and the model's response shape.
func (h *Hub) admit(ctx context.Context, w fleet.Worker, node fleet.Node) error {
	m, ok := h.model(w.Model)
	if !ok {
		return fmt.Errorf("model %s is no longer declared", w.Model)
	}
	if err := checkMemory(w, m, node); err != nil {
		return err
	}
	if err := h.checkSpeed(ctx, w, m); err != nil {
		return err
	}
	return h.checkShape(ctx, w)
}

// checkMemory compares the model's memory with what the node had usable
// before the engine launched (see nodes.ManagerOptions.Admit).
func checkMemory(w fleet.Worker, m fleet.Model, n fleet.Node) error {
	if m.MemoryGB <= 0 || n.Platform == nil {
		return nil // no figure to check, or a node launched on before any probe
	}
	need := uint64(m.MemoryGB * (1 << 30))
	usable := nodes.UsableMemory(*n.Platform)
	if usable < need {
		how := "free memory"
		if n.Platform.OS == "darwin" {
			how = "three quarters of free + inactive + speculative memory"
		} else if len(n.Platform.GPUs) > 0 {
			how = "free GPU memory"
		}
		return fmt.Errorf("memory: %s needs %.1f GB but %s has %.1f GB usable (%s); free memory on the node or place the model elsewhere",
			m.ID, m.MemoryGB, w.Node, float64(usable)/(1<<30), how)
	}
	return nil
}

// singleRequestSpeed measures one request's decode speed on a worker and
// teaches the router's speed model what it saw, so a new worker's curve
// starts from a measurement rather than a prior.
func (h *Hub) singleRequestSpeed(ctx context.Context, worker string) (float64, error) {
	t, _, err := h.workerTarget(worker)
	if err != nil {
		return 0, err
	}
	res, err := sweep.Sweep(ctx, t, sweep.Options{Levels: []int{1}, RequestsPerLevel: 1, Warmup: -1, OutputTokens: admissionSpeedTokens})
	if err != nil {
		return 0, err
	}
	if len(res.Levels) == 0 || res.Levels[0].Failed > 0 || res.Levels[0].PerRequestTokPerS <= 0 {
		msg := "no answer"
		if len(res.Levels) > 0 && len(res.Levels[0].Errors) > 0 {
			msg = strings.Join(res.Levels[0].Errors, "; ")
		}
		return 0, fmt.Errorf("the speed probe on %s failed: %s", worker, msg)
	}
	h.seedSpeed(worker, res)
	return res.Levels[0].PerRequestTokPerS, nil
}

func (h *Hub) checkSpeed(ctx context.Context, w fleet.Worker, m fleet.Model) error {
	newSpeed, err := h.singleRequestSpeed(ctx, w.Name())
	if err != nil {
		return fmt.Errorf("speed: %w", err)
	}
	// The best ready worker is the one the router predicts fastest for one
	// request; it is measured again now, with the same prompt.
	var best string
	var bestSpeed float64
	h.mu.Lock()
	candidates := map[string]bool{}
	for name, o := range h.workers {
		if o.Model == w.Model && o.State == fleet.WorkerReady && name != w.Name() {
			candidates[name] = true
		}
	}
	h.mu.Unlock()
	if len(candidates) == 0 {
		h.onEvent(fleet.Event{Level: "info", Subject: w.Name(), Message: fmt.Sprintf("admission speed: %.1f tok/s for one request; first ready worker of %s, it sets the bar", newSpeed, w.Model)})
		return nil
	}
	for _, s := range h.router.Stats() {
		if candidates[s.Name] && (best == "" || s.TokPerSec > bestSpeed) {
			best, bestSpeed = s.Name, s.TokPerSec
		}
	}
	if best == "" {
		for name := range candidates {
			best = name
		}
	}
	bestSpeed, err = h.singleRequestSpeed(ctx, best)
	if err != nil {
		return nil // the reference worker failed its probe; do not blame the newcomer
	}
	tol := m.SpeedTolerance
	if tol <= 0 {
		tol = defaultTolerance
	}
	h.onEvent(fleet.Event{Level: "info", Subject: w.Name(), Message: fmt.Sprintf("admission speed: %.1f tok/s vs %.1f tok/s on %s (same prompt, one request; needs %.0f%%)", newSpeed, bestSpeed, best, tol*100)})
	if newSpeed < tol*bestSpeed {
		return fmt.Errorf("speed: %.1f tok/s for one request is below %.0f%% of %s's %.1f tok/s with the same prompt; it would slow every request it takes (override: admit --force %s)",
			newSpeed, tol*100, best, bestSpeed, w.Name())
	}
	return nil
}

func (h *Hub) checkShape(ctx context.Context, w fleet.Worker) error {
	t, _, err := h.workerTarget(w.Name())
	if err != nil {
		return err
	}
	got, err := shape.ProbeWith(ctx, t, shape.Options{MaxTokens: admissionShapeTokens})
	if err != nil {
		return fmt.Errorf("shape: probing: %w", err)
	}
	h.refMu.Lock()
	defer h.refMu.Unlock()
	data, _, err := h.store.ReferenceShape(ctx, w.Model)
	if err != nil {
		if !isNotFound(err) {
			return fmt.Errorf("shape: %w", err)
		}
		// The first admitted worker's shape becomes the model's reference.
		ref, err := json.Marshal(got)
		if err != nil {
			return err
		}
		if err := h.store.SetReferenceShape(ctx, w.Model, ref, false); err != nil {
			return fmt.Errorf("shape: storing the reference: %w", err)
		}
		h.onEvent(fleet.Event{Level: "info", Subject: w.Name(), Message: "admission shape: first worker of " + w.Model + ", its shape is the reference"})
		return nil
	}
	var ref shape.Shape
	if err := json.Unmarshal(data, &ref); err != nil {
		return fmt.Errorf("shape: the stored reference of %s is unreadable (run 'shape pin WORKER'): %w", w.Model, err)
	}
	ok, report := shape.Matches(ref, got)
	if !ok {
		h.onEvent(fleet.Event{Level: "error", Subject: w.Name(), Message: "admission shape differs from the reference of " + w.Model + ":\n" + report.Text(100, false)})
		var what []string
		for _, d := range report.Differences {
			if d.Material {
				what = append(what, d.String())
			}
		}
		return fmt.Errorf("shape: differs from %s's reference: %s (see 'events --subject %s' for the diff)", w.Model, strings.Join(what, "; "), w.Name())
	}
	h.onEvent(fleet.Event{Level: "info", Subject: w.Name(), Message: "admission shape: same as the reference of " + w.Model})
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// seedSpeed hands a bench result to the router's speed model: one point per
// concurrency level, so the scheduler knows the worker's curve before
// traffic teaches it.
func (h *Hub) seedSpeed(worker string, res sweep.Result) {
	var points []router.SpeedPoint
	for _, l := range res.Levels {
		if l.Requests == l.Failed || l.TPOT.Mean <= 0 {
			continue
		}
		points = append(points, router.SpeedPoint{
			Concurrency:  l.Concurrency,
			TTFT:         time.Duration(l.TTFT.P50 * float64(time.Millisecond)),
			PromptTokens: l.PromptTokens / max(l.Requests-l.Failed, 1),
			ITL:          time.Duration(l.TPOT.Mean * float64(time.Millisecond)),
		})
	}
	h.router.SeedSpeed(worker, points...)
}
