package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/bench"
	"fleet/bench/shape"
	"fleet/bench/sweep"
	"fleet/store"
)

// Runs are the shape and bench runs users start (shape, shape --all,
// shape pin, bench, bench --history), each authorized and audited through
// the Guard and bounded per user (MaxRunsPerUser). The hub composes one
// and offers it to the command tree and the console.
type Runs struct {
	*probe
	// judge re-judges a model's workers when a run pins its reference.
	judge *Judge
	guard Guard
	// running bounds each user's runs (see limits.go).
	running userRuns
	// routerAddr is where the router listens once the hub runs.
	routerAddr func() string
	// onLeader runs an action that changes the fleet on the leading hub.
	onLeader func(ctx context.Context, u fleet.User, action fleet.ActionName, target string, args any, local func() (string, error)) (string, error)
}

// Shape sends two workers the same shape requests and diffs their response shapes.
func (ru *Runs) Shape(ctx context.Context, u fleet.User, a, b string) (r shape.Report, err error) {
	act, err := ru.guard.Authorize(u, fleet.ActionShape, a+" "+b)
	if err != nil {
		return r, err
	}
	done, err := ru.running.start(u, string(act.Name))
	if err != nil {
		return r, err
	}
	defer done()
	err = ru.guard.Run(u, act, a+" "+b, func() (string, error) {
		r, err = ru.shape(ctx, a, b)
		return "", err
	})
	return r, err
}

func (ru *Runs) shape(ctx context.Context, a, b string) (shape.Report, error) {
	var shapes [2]shape.Shape
	var errs [2]error
	var wg sync.WaitGroup
	for i, name := range []string{a, b} {
		t, _, err := ru.workerTarget(name)
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
func (ru *Runs) ShapeAll(ctx context.Context, u fleet.User, model string) (rs []shape.Report, err error) {
	act, err := ru.guard.Authorize(u, fleet.ActionShapeAll, model)
	if err != nil {
		return nil, err
	}
	done, err := ru.running.start(u, string(act.Name))
	if err != nil {
		return nil, err
	}
	defer done()
	err = ru.guard.Run(u, act, model, func() (string, error) {
		rs, err = ru.shapeAll(ctx, model)
		return "", err
	})
	return rs, err
}

func (ru *Runs) shapeAll(ctx context.Context, model string) ([]shape.Report, error) {
	ref, err := ru.referenceShape(ctx, model)
	if err != nil {
		return nil, err
	}
	// The pool is the ready, undrained workers; a full Snapshot would also
	// read events and router figures this does not need.
	var pool []string
	for _, w := range ru.fleet.Workers(model) {
		if w.State == fleet.WorkerReady && !w.Drained {
			pool = append(pool, w.Name())
		}
	}
	slices.Sort(pool)
	var reports []shape.Report
	for _, name := range pool {
		t, _, err := ru.workerTarget(name)
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
func (ru *Runs) PinShape(ctx context.Context, u fleet.User, worker string) (msg string, err error) {
	act, err := ru.guard.Authorize(u, fleet.ActionShapePin, worker)
	if err != nil {
		return "", err
	}
	done, err := ru.running.start(u, string(act.Name))
	if err != nil {
		return "", err
	}
	defer done()
	err = ru.guard.Run(u, act, worker, func() (string, error) {
		msg, err = ru.onLeader(ctx, u, act.Name, worker, nil, func() (string, error) { return ru.judge.Pin(ctx, worker) })
		return "", err
	})
	return msg, err
}

func (ru *Runs) referenceShape(ctx context.Context, model string) (shape.Shape, error) {
	r, err := ru.store.Reference(ctx, model)
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
func (ru *Runs) Bench(ctx context.Context, u fleet.User, target string, o fleet.BenchOptions, progress io.Writer) (sweep.Result, error) {
	a, err := ru.guard.Authorize(u, fleet.ActionBench, target)
	if err != nil {
		return sweep.Result{}, err
	}
	done, err := ru.running.start(u, string(a.Name))
	if err != nil {
		ru.guard.Refuse(u, a.Name, target, "refused: "+err.Error())
		return sweep.Result{}, err
	}
	defer done()
	var t bench.Target
	// worker is the stored run's key: the worker measured, or the model's
	// key for a run through the router, so `bench --history MODEL` finds it.
	worker, viaRouter := "", false
	if id, ok := ru.fleet.ModelID(target); ok {
		t = bench.Target{Name: target + " via router", BaseURL: "http://" + ru.routerAddr() + "/v1", Model: target}
		worker, viaRouter = routerBenchKey(id), true
	} else {
		var w fleet.Worker
		var err error
		if t, w, err = ru.workerTarget(target); err != nil {
			ru.guard.Failed(u, a, target, err)
			return sweep.Result{}, err
		}
		worker = w.Name()
	}
	opts := sweep.Options{Levels: o.Levels, Split: o.Split, Turns: o.Turns, RequestsPerLevel: o.Requests, OutputTokens: o.Tokens, Logger: ru.log}
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
	if err := ru.guard.Run(u, a, target, func() (_ string, err error) {
		res, err = sweep.Sweep(ctx, t, opts)
		return "", err
	}); err != nil {
		return res, err
	}
	if data, err := json.Marshal(res); err == nil {
		if err := ru.store.AddBenchRun(ctx, worker, data); err != nil {
			ru.log.Warn("could not store the bench run", "target", worker, "err", err)
		}
	}
	if !viaRouter {
		if err := ru.store.AddSamples(ctx, res.Samples(worker)); err != nil {
			ru.log.Warn("could not store bench samples", "worker", worker, "err", err)
		}
		ru.seedSpeed(worker, res)
		ru.fleet.SetBench(worker, summarise(res))
	}
	return res, nil
}

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
func (ru *Runs) BenchHistory(ctx context.Context, u fleet.User, target string, limit int) ([]sweep.Result, error) {
	var out []sweep.Result
	err := ru.guard.Do(u, fleet.ActionBenchHistory, target, func() (string, error) {
		keys, err := ru.benchKeys(target)
		if err != nil {
			return "", err
		}
		limit = min(max(limit, 1), MaxBenchHistory)
		var runs []store.BenchRun
		for _, k := range keys {
			rs, err := ru.store.BenchRuns(ctx, k, limit)
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
				ru.log.Warn("skipping an unreadable stored bench run", "target", r.Worker, "id", r.ID, "err", err)
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
func (ru *Runs) benchKeys(target string) ([]string, error) {
	if strings.Contains(target, "/") {
		return []string{target}, nil
	}
	if id, ok := ru.fleet.ModelID(target); ok {
		keys := []string{routerBenchKey(id)}
		for _, w := range ru.fleet.Workers(id) {
			keys = append(keys, w.Name())
		}
		return keys, nil
	}
	names, err := ru.fleet.Resolve([]string{target})
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

// BenchSummary is what the console charts of a bench sweep. A worker's
// latest sweep of each split is kept, so the console shows the agent run
// beside the chat one.
type BenchSummary struct {
	// Agent: the sweep's split is agent; else chat.
	Agent  bool
	At     time.Time
	Points []fleet.BenchPoint
}

func summarise(res sweep.Result) BenchSummary {
	b := BenchSummary{Agent: splitOf(res) == sweep.SplitAgent, At: res.StartedAt}
	for _, l := range res.Levels {
		b.Points = append(b.Points, fleet.BenchPoint{
			Concurrency:         l.Concurrency,
			TotalTokPerSec:      l.TotalTokPerSec,
			PerRequestTokPerSec: l.PerRequestTokPerS,
			TTFTp50ms:           l.TTFT.P50,
		})
	}
	return b
}

// loadBenchRuns reads each worker's latest stored sweep (New, at start).
func (ru *Runs) loadBenchRuns(ctx context.Context) error {
	runs, err := ru.store.LatestBenchRuns(ctx)
	if err != nil {
		return err
	}
	for _, r := range runs {
		var res sweep.Result
		if err := json.Unmarshal(r.Run, &res); err != nil {
			ru.log.Warn("skipping an unreadable stored bench run", "worker", r.Worker, "id", r.ID, "err", err)
			continue
		}
		ru.fleet.SetBench(r.Worker, summarise(res))
	}
	return nil
}
