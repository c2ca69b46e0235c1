package hub

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"fleet/nodes"
	"fleet/router"
	"fleet/router/reasoning"
	"fleet/store"
)

// Admission shape requests are short: enough tokens to show where a reasoning model
// puts its thinking and to time decoding, not a benchmark.
const (
	admissionShapeTokens = 48
	admissionSpeedTokens = 64
	defaultTolerance     = 0.5
)

// Checks runs the measurements of workers: the shape and bench commands,
// and the shape and speed probes admission takes. The hub composes one; it
// reads the fleet from the hub's mirror and teaches the router what it
// measured.
type Checks struct {
	state  *mirror
	store  *store.Store
	log    *slog.Logger
	router *router.Router
	mgr    *nodes.Manager
	guard  *guard
	// running bounds each user's shape and bench runs (see limits.go).
	running userChecks
	// refMu serialises reading and retaking a model's reference shape
	// (shared with admission).
	refMu *sync.Mutex
	// event records an event of the fleet; routerAddr is where the router
	// listens once the hub runs.
	event      func(fleet.Event)
	routerAddr func() string
	// rejudge and referenceWorker are admission's (admission.go): pinning a
	// reference shape re-judges the workers it rejected.
	rejudge         func(ctx context.Context, model, skip string, onlyRejected bool) []string
	referenceWorker func(ctx context.Context, model string) (string, error)
	// onLeader runs an action that changes the fleet on the leading hub
	// (cluster.onLeader).
	onLeader func(ctx context.Context, u fleet.User, action fleet.ActionName, target string, args any, local func() (string, error)) (string, error)
}

// workerTarget is a bench target that talks to one worker directly,
// bypassing the scheduler, through its node's transport (an SSH tunnel for a
// remote node).
func (ck *Checks) workerTarget(name string) (bench.Target, fleet.Worker, error) {
	ck.state.mu.Lock()
	w, ok := ck.state.workers[name]
	ck.state.mu.Unlock()
	if !ok {
		resolved, err := ck.state.resolve([]string{name})
		if err != nil {
			return bench.Target{}, w, err
		}
		if len(resolved) != 1 {
			return bench.Target{}, w, fmt.Errorf("%s names %d workers (%s); name one as NODE/MODEL", name, len(resolved), strings.Join(resolved, ", "))
		}
		ck.state.mu.Lock()
		w = ck.state.workers[resolved[0]]
		ck.state.mu.Unlock()
	}
	// Any worker whose engine runs can be looked at, a rejected one
	// included: that is what its engine is kept up for.
	switch {
	case w.PID > 0 && w.Port > 0 && (w.State == fleet.WorkerReady || w.State == fleet.WorkerProbation || w.State == fleet.WorkerDraining || w.State == fleet.WorkerRejected):
	case w.State == fleet.WorkerRejected:
		return bench.Target{}, w, fmt.Errorf("worker %s is rejected and its engine is down (%s); nothing answers to measure: 'start %s' launches it again", w.Name(), w.Reason, w.Name())
	default:
		why := ""
		if w.Reason != "" {
			why = " (" + w.Reason + ")"
		}
		return bench.Target{}, w, fmt.Errorf("worker %s is %s and its engine is not answering%s; wait until it is ready (see 'workers')", w.Name(), w.State, why)
	}
	dial := ck.mgr.Dialer(w.Node)
	// Checks are occasional: no keep-alive, so a per-call client leaves no
	// idle connection (or SSH channel) behind.
	var rt http.RoundTripper = &http.Transport{
		DialContext:       func(ctx context.Context, network, addr string) (net.Conn, error) { return dial(ctx, network, addr) },
		DisableKeepAlives: true,
	}
	// With a normalisation mode on the model, checks see the shape the
	// router's clients get, not the engine's raw one.
	if m, ok := ck.state.model(w.Model); ok && m.Reasoning != "" {
		mode, err := reasoning.ParseMode(m.Reasoning)
		if err != nil {
			return bench.Target{}, w, fmt.Errorf("model %s: %w", m.ID, err)
		}
		rt = router.NormalisingTransport(rt, mode)
	}
	// The router counts these requests as the worker's load.
	client := &http.Client{Transport: ck.router.CountingTransport(rt, w.Name())}
	return bench.Target{
		Name:       w.Node,
		BaseURL:    fmt.Sprintf("http://127.0.0.1:%d/v1", w.Port),
		Model:      ck.state.servedName(w),
		HTTPClient: client,
	}, w, nil
}

// Shape sends two workers the same shape requests and diffs their response shapes.
func (ck *Checks) Shape(ctx context.Context, u fleet.User, a, b string) (r shape.Report, err error) {
	act, err := ck.guard.authorize(u, fleet.ActionShape, a+" "+b)
	if err != nil {
		return r, err
	}
	done, err := ck.running.start(u, string(act.Name))
	if err != nil {
		return r, err
	}
	defer done()
	err = ck.guard.run(u, act, a+" "+b, func() (string, error) {
		r, err = ck.shape(ctx, a, b)
		return "", err
	})
	return r, err
}

func (ck *Checks) shape(ctx context.Context, a, b string) (shape.Report, error) {
	var shapes [2]shape.Shape
	var errs [2]error
	var wg sync.WaitGroup
	for i, name := range []string{a, b} {
		t, _, err := ck.workerTarget(name)
		if err != nil {
			return shape.Report{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			shapes[i], errs[i] = shape.Measure(ctx, t)
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
func (ck *Checks) ShapeAll(ctx context.Context, u fleet.User, model string) (rs []shape.Report, err error) {
	act, err := ck.guard.authorize(u, fleet.ActionShapeAll, model)
	if err != nil {
		return nil, err
	}
	done, err := ck.running.start(u, string(act.Name))
	if err != nil {
		return nil, err
	}
	defer done()
	err = ck.guard.run(u, act, model, func() (string, error) {
		rs, err = ck.shapeAll(ctx, model)
		return "", err
	})
	return rs, err
}

func (ck *Checks) shapeAll(ctx context.Context, model string) ([]shape.Report, error) {
	ref, err := ck.referenceShape(ctx, model)
	if err != nil {
		return nil, err
	}
	// The pool is the ready, undrained workers; a full Snapshot would also
	// read events and router figures this does not need.
	var pool []string
	ck.state.mu.Lock()
	for name, w := range ck.state.workers {
		if w.Model == model && w.State == fleet.WorkerReady && !w.Drained {
			pool = append(pool, name)
		}
	}
	ck.state.mu.Unlock()
	slices.Sort(pool)
	var reports []shape.Report
	for _, name := range pool {
		t, _, err := ck.workerTarget(name)
		if err != nil {
			return nil, err
		}
		got, err := shape.Measure(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("probing %s: %w", name, err)
		}
		reports = append(reports, shape.Diff(ref, got))
	}
	return reports, nil
}

// PinShape makes a worker's current shape its model's reference. An admin's
// attempt is audited whether or not it got as far as the worker.
func (ck *Checks) PinShape(ctx context.Context, u fleet.User, worker string) (msg string, err error) {
	act, err := ck.guard.authorize(u, fleet.ActionShapePin, worker)
	if err != nil {
		return "", err
	}
	done, err := ck.running.start(u, string(act.Name))
	if err != nil {
		return "", err
	}
	defer done()
	err = ck.guard.run(u, act, worker, func() (string, error) {
		msg, err = ck.onLeader(ctx, u, act.Name, worker, nil, func() (string, error) { return ck.pinShape(ctx, worker) })
		return "", err
	})
	return msg, err
}

func (ck *Checks) pinShape(ctx context.Context, worker string) (string, error) {
	t, w, err := ck.workerTarget(worker)
	if err != nil {
		return "", err
	}
	got, err := shape.Measure(ctx, t)
	if err != nil {
		return "", fmt.Errorf("probing %s: %w", worker, err)
	}
	data, err := json.Marshal(got)
	if err != nil {
		return "", err
	}
	// The pin holds until the reference node's worker runs another command
	// line: its argv now is recorded with the pin.
	refWorker, err := ck.referenceWorker(ctx, w.Model)
	if err != nil {
		return "", err
	}
	ck.state.mu.Lock()
	argv := ck.state.workers[refWorker].Argv
	ck.state.mu.Unlock()
	ck.refMu.Lock()
	err = ck.store.SetReference(ctx, w.Model, store.Reference{Shape: data, Pinned: true, Source: w.Name(), Argv: argv})
	ck.refMu.Unlock()
	if err != nil {
		return "", err
	}
	ck.event(fleet.Event{Level: "info", Subject: w.Name(), Message: "its shape is now the pinned reference of " + w.Model + "; every worker of the model is judged again"})
	until := fmt.Sprintf("pinned until %s runs another command line; a new command line on %s retakes it with its new shape", refWorker, w.Name())
	if w.Name() == refWorker {
		until = fmt.Sprintf("pinned until %s runs another command line", refWorker)
	}
	msg := fmt.Sprintf("the reference shape of %s is now %s's (%s)", w.Model, w.Name(), until)
	// Every worker, the ready ones too: one model serving two shapes is
	// what the reference is there to prevent.
	if lines := ck.rejudge(ctx, w.Model, "", false); len(lines) > 0 {
		msg += "\nre-judged the model's workers:\n  " + strings.Join(lines, "\n  ")
	}
	return msg, nil
}

func (ck *Checks) referenceShape(ctx context.Context, model string) (shape.Shape, error) {
	r, err := ck.store.Reference(ctx, model)
	if err != nil {
		return shape.Shape{}, fmt.Errorf("model %s has no reference shape yet (its reference worker sets it; or run 'shape pin WORKER'): %w", model, err)
	}
	var ref shape.Shape
	if err := json.Unmarshal(r.Shape, &ref); err != nil {
		return shape.Shape{}, fmt.Errorf("the stored reference shape of %s is unreadable (run 'shape pin WORKER' to replace it): %w", model, err)
	}
	return ref, nil
}

// Bench runs a closed-loop concurrency sweep against a worker (directly) or
// a model (through the router), stores the result and feeds the samples.
func (ck *Checks) Bench(ctx context.Context, u fleet.User, target string, o fleet.BenchOptions, progress io.Writer) (sweep.Result, error) {
	a, err := ck.guard.authorize(u, fleet.ActionBench, target)
	if err != nil {
		return sweep.Result{}, err
	}
	done, err := ck.running.start(u, string(a.Name))
	if err != nil {
		ck.guard.refuse(u, a.Name, target, "refused: "+err.Error())
		return sweep.Result{}, err
	}
	defer done()
	var t bench.Target
	// worker is the stored run's key: the worker measured, or the model's
	// key for a run through the router, so `bench --history MODEL` finds it.
	worker, viaRouter := "", false
	if id, ok := ck.state.modelID(target); ok {
		t = bench.Target{Name: target + " via router", BaseURL: "http://" + ck.routerAddr() + "/v1", Model: target}
		worker, viaRouter = routerBenchKey(id), true
	} else {
		var w fleet.Worker
		var err error
		if t, w, err = ck.workerTarget(target); err != nil {
			ck.guard.failed(u, a, target, err)
			return sweep.Result{}, err
		}
		worker = w.Name()
	}
	opts := sweep.Options{Levels: o.Levels, Split: o.Split, Turns: o.Turns, RequestsPerLevel: o.Requests, OutputTokens: o.Tokens, Logger: ck.log}
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
	var res sweep.Result
	if err := ck.guard.run(u, a, target, func() (_ string, err error) {
		res, err = sweep.Sweep(ctx, t, opts)
		return "", err
	}); err != nil {
		return res, err
	}
	if data, err := json.Marshal(res); err == nil {
		if err := ck.store.AddBenchRun(ctx, worker, data); err != nil {
			ck.log.Warn("could not store the bench run", "target", worker, "err", err)
		}
	}
	if !viaRouter {
		if err := ck.store.AddSamples(ctx, res.Samples(worker)); err != nil {
			ck.log.Warn("could not store bench samples", "worker", worker, "err", err)
		}
		ck.seedSpeed(worker, res)
		ck.state.mu.Lock()
		ck.state.bench[benchKey{worker, splitOf(res)}] = summarise(res)
		ck.state.mu.Unlock()
	}
	return res, nil
}

// benchKey is a worker and a bench split: each split's latest sweep is
// kept, so the console shows the agent run beside the chat one.
type benchKey struct{ worker, split string }

// splitOf is a sweep's split; chat, the default, when it says none.
func splitOf(res sweep.Result) string {
	if res.Split == "" {
		return sweep.SplitChat
	}
	return res.Split
}

// MaxBenchHistory is the most runs `bench --history` lists.
const MaxBenchHistory = 200

// BenchHistory lists stored bench sweeps, newest first (at most limit, up
// to MaxBenchHistory), of what `bench` accepts: a worker (a node with one
// worker stands for it; a NODE/MODEL name is taken as it is, so the runs of
// a worker that has left the fleet can still be read), or a model (an
// alias too): its runs through the router and its current workers' runs.
func (ck *Checks) BenchHistory(ctx context.Context, u fleet.User, target string, limit int) ([]sweep.Result, error) {
	var out []sweep.Result
	err := ck.guard.do(u, fleet.ActionBenchHistory, target, func() (string, error) {
		keys, err := ck.benchKeys(target)
		if err != nil {
			return "", err
		}
		limit = min(max(limit, 1), MaxBenchHistory)
		var runs []store.BenchRun
		for _, k := range keys {
			rs, err := ck.store.BenchRuns(ctx, k, limit)
			if err != nil {
				return "", err
			}
			runs = append(runs, rs...)
		}
		slices.SortStableFunc(runs, func(a, b store.BenchRun) int { return cmp.Or(b.At.Compare(a.At), cmp.Compare(b.ID, a.ID)) })
		runs = runs[:min(len(runs), limit)]
		out = []sweep.Result{}
		for _, r := range runs {
			var res sweep.Result
			if err := json.Unmarshal(r.Run, &res); err != nil {
				ck.log.Warn("skipping an unreadable stored bench run", "target", r.Worker, "id", r.ID, "err", err)
				continue
			}
			res.Split = splitOf(res)
			out = append(out, res)
		}
		return "", nil
	})
	return out, err
}

// benchKeys are the keys under which the runs of a bench target are
// stored: a worker's name, or a model's runs through the router
// (routerBenchKey) and the names of the model's workers.
func (ck *Checks) benchKeys(target string) ([]string, error) {
	if strings.Contains(target, "/") {
		return []string{target}, nil
	}
	if id, ok := ck.state.modelID(target); ok {
		keys := []string{routerBenchKey(id)}
		ck.state.mu.Lock()
		for name, w := range ck.state.workers {
			if w.Model == id {
				keys = append(keys, name)
			}
		}
		ck.state.mu.Unlock()
		return keys, nil
	}
	names, err := ck.state.resolve([]string{target})
	if err != nil {
		return nil, fmt.Errorf("%w; or name a model (bench --history MODEL)", err)
	}
	if len(names) != 1 {
		return nil, fmt.Errorf("node %s runs %d workers; name one of %s, or their model", target, len(names), strings.Join(names, ", "))
	}
	return names, nil
}

// routerBenchKey is the key of a model's bench runs through the router. No
// worker is named so: a node's name has no colon.
func routerBenchKey(modelID string) string { return "model:" + modelID }

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
func (ck *Checks) loadBenchRuns(ctx context.Context) error {
	runs, err := ck.store.LatestBenchRuns(ctx)
	if err != nil {
		return err
	}
	for _, r := range runs {
		var res sweep.Result
		if err := json.Unmarshal(r.Run, &res); err != nil {
			ck.log.Warn("skipping an unreadable stored bench run", "worker", r.Worker, "id", r.ID, "err", err)
			continue
		}
		ck.state.bench[benchKey{r.Worker, splitOf(res)}] = summarise(res)
	}
	return nil
}

// modelID is the ID of the model that name (an ID or an alias) names.
func (ms *mirror) modelID(name string) (string, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, m := range ms.models {
		if m.Serves(name) {
			return m.ID, true
		}
	}
	return "", false
}

func (ms *mirror) model(id string) (fleet.Model, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, m := range ms.models {
		if m.ID == id {
			return m, true
		}
	}
	return fleet.Model{}, false
}

// speedSamples is how many single-request measurements an admission speed
// figure is the median of: one sample against another decided verdicts on
// noise, and a median of three needs only two to agree.
const speedSamples = 3

// measureSpeed is a worker's admission speed figure: the median of
// speedSamples single-request decode speeds on a warm engine (see
// sampleSpeeds).
func (ck *Checks) measureSpeed(ctx context.Context, worker string) (float64, error) {
	speeds, _, err := ck.sampleSpeeds(ctx, worker)
	if err != nil {
		return 0, err
	}
	return speeds[0], nil
}

// sampleSpeeds measures workers' single-request decode speeds with the
// same prompt. Each is first warmed up with one request that is discarded:
// the first requests after a load are slow on every engine (Metal compiles
// its shaders, CUDA its kernels, caches are cold), and a worker measured cold
// against a warm one was rejected at a twentieth of its speed. Then
// speedSamples requests each, interleaved (a, b, a, b, …) so that every
// sample of one is taken beside one of the others; it returns each worker's
// median, and teaches the router's speed model the median request. On an
// error, failed is the index of the worker whose measurement failed.
func (ck *Checks) sampleSpeeds(ctx context.Context, workers ...string) (medians []float64, failed int, _ error) {
	targets := make([]bench.Target, len(workers))
	for i, name := range workers {
		t, _, err := ck.workerTarget(name)
		if err != nil {
			return nil, i, err
		}
		targets[i] = t
	}
	runs := make([][]sweep.Result, len(workers))
	for round := range speedSamples + 1 { // round 0 warms up
		for i, t := range targets {
			res, err := oneRequest(ctx, t)
			if err != nil {
				return nil, i, fmt.Errorf("the speed measurement on %s failed: %w", workers[i], err)
			}
			if round > 0 {
				runs[i] = append(runs[i], res)
			}
		}
	}
	medians = make([]float64, len(workers))
	for i, rs := range runs {
		slices.SortFunc(rs, func(a, b sweep.Result) int { return cmp.Compare(tokPerSec(a), tokPerSec(b)) })
		median := rs[len(rs)/2]
		ck.seedSpeed(workers[i], median)
		medians[i] = tokPerSec(median)
	}
	return medians, -1, nil
}

// oneRequest measures one request of admissionSpeedTokens on t.
func oneRequest(ctx context.Context, t bench.Target) (sweep.Result, error) {
	res, err := sweep.Sweep(ctx, t, sweep.Options{Levels: []int{1}, RequestsPerLevel: 1, Warmup: -1, OutputTokens: admissionSpeedTokens})
	if err != nil {
		return res, err
	}
	if len(res.Levels) == 0 || res.Levels[0].Failed > 0 || res.Levels[0].PerRequestTokPerS <= 0 {
		msg := "no answer"
		if len(res.Levels) > 0 && len(res.Levels[0].Errors) > 0 {
			msg = strings.Join(res.Levels[0].Errors, "; ")
		}
		return res, errors.New(msg)
	}
	return res, nil
}

// tokPerSec is a one-request sweep's decode speed.
func tokPerSec(res sweep.Result) float64 { return res.Levels[0].PerRequestTokPerS }

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// seedSpeed hands a bench result to the router's speed model: one point per
// concurrency level, so the scheduler knows the worker's curve before
// traffic teaches it.
func (ck *Checks) seedSpeed(worker string, res sweep.Result) {
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
	ck.router.SeedSpeed(worker, points...)
}
