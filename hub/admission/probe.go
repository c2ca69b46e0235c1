package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/bench"
	"fleet/bench/sweep"
	"fleet/router"
	"fleet/router/reasoning"
	"fleet/store"
)

// probe is what the Judge and the Runs share: the fleet they read, the
// measurements they take of one worker, and the lock on the models'
// reference shapes.
type probe struct {
	fleet  Fleet
	store  Store
	router Router
	nodes  Nodes
	log    *slog.Logger
	// event records an event of the fleet.
	event func(fleet.Event)
	// refMu serialises reading and retaking a model's reference shape.
	refMu sync.Mutex
}

// Admission shape requests are short: enough tokens to show where a reasoning model
// puts its thinking and to time decoding, not a benchmark.
const (
	admissionShapeTokens = 48
	admissionSpeedTokens = 64
	defaultTolerance     = 0.5
)

// workerTarget is a bench target that talks to one worker directly,
// bypassing the scheduler, through its node's transport (an SSH tunnel for a
// remote node).
func (p *probe) workerTarget(name string) (bench.Target, fleet.Worker, error) {
	w, ok := p.fleet.Worker(name)
	if !ok {
		resolved, err := p.fleet.Resolve([]string{name})
		if err != nil {
			return bench.Target{}, w, err
		}
		if len(resolved) != 1 {
			return bench.Target{}, w, fmt.Errorf("%s names %d workers (%s); name one as NODE/MODEL", name, len(resolved), strings.Join(resolved, ", "))
		}
		w, _ = p.fleet.Worker(resolved[0])
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
	dial := p.nodes.Dialer(w.Node)
	// Measurements are occasional: no keep-alive, so a per-call client leaves no
	// idle connection (or SSH channel) behind.
	var rt http.RoundTripper = &http.Transport{
		DialContext:       func(ctx context.Context, network, addr string) (net.Conn, error) { return dial(ctx, network, addr) },
		DisableKeepAlives: true,
	}
	// With a normalisation mode on the model, checks see the shape the
	// router's clients get, not the engine's raw one.
	if m, ok := p.fleet.Model(w.Model); ok && m.Reasoning != "" {
		mode, err := reasoning.ParseMode(m.Reasoning)
		if err != nil {
			return bench.Target{}, w, fmt.Errorf("model %s: %w", m.ID, err)
		}
		rt = router.NormalisingTransport(rt, mode)
	}
	// The router counts these requests as the worker's load.
	client := &http.Client{Transport: p.router.CountingTransport(rt, w.Name())}
	return bench.Target{
		Name:       w.Node,
		BaseURL:    fmt.Sprintf("http://127.0.0.1:%d/v1", w.Port),
		Model:      p.fleet.ServedName(w),
		HTTPClient: client,
	}, w, nil
}

// speedSamples is how many single-request measurements an admission speed
// figure is the best of: one sample against another decided verdicts on
// noise.
const speedSamples = 3

// idleWait bounds how long a sample waits for the router's requests on
// the worker to end: a worker busy with live traffic decodes a batch, and
// one request beside it measures the batch, not the worker; one never idle
// is measured as it is.
const idleWait = 3 * time.Second

// sampleSpeeds measures workers' single-request speeds with the
// same prompt. Each is first warmed up with one request that is discarded:
// the first requests after a load are slow on every engine (Metal compiles
// its shaders, CUDA its kernels, caches are cold), and a worker measured cold
// against a warm one was rejected at a twentieth of its speed. Then
// speedSamples requests each, interleaved (a, b, a, b, …) so that every
// sample of one is taken beside one of the others, each once the router has
// no request in flight on the worker (idleWait at most). It returns each
// worker's fastest sample, and teaches the router's speed model the median
// request. The fastest, not the median: whatever disturbs a sample (another
// engine on the machine, a live request, a scheduler's hiccup) only ever
// slows it, and two identical llama-servers on one machine measured 2 to 6
// times apart by their medians (issue 30). On an error, failed is the index
// of the worker whose measurement failed.
func (p *probe) sampleSpeeds(ctx context.Context, workers ...string) (speeds []float64, failed int, _ error) {
	targets := make([]bench.Target, len(workers))
	for i, name := range workers {
		t, _, err := p.workerTarget(name)
		if err != nil {
			return nil, i, err
		}
		targets[i] = t
	}
	runs := make([][]sweep.Result, len(workers))
	for round := range speedSamples + 1 { // round 0 warms up
		for i, t := range targets {
			idle, cancel := context.WithTimeout(ctx, idleWait)
			_ = p.router.WaitIdle(idle, workers[i]) // busy for idleWait: measured as it is
			cancel()
			res, err := oneRequest(ctx, t)
			if err != nil {
				return nil, i, fmt.Errorf("the speed measurement on %s failed: %w", workers[i], err)
			}
			if round > 0 {
				runs[i] = append(runs[i], res)
			}
		}
	}
	best := make([]float64, len(workers))
	for i, rs := range runs {
		slices.SortFunc(rs, func(a, b sweep.Result) int { return cmp.Compare(tokPerSec(a), tokPerSec(b)) })
		p.seedSpeed(workers[i], rs[len(rs)/2])
		best[i] = tokPerSec(rs[len(rs)-1])
	}
	return best, -1, nil
}

// oneRequest measures one request of admissionSpeedTokens on t.
func oneRequest(ctx context.Context, t bench.Target) (sweep.Result, error) {
	res, err := sweep.Sweep(ctx, t, sweep.Options{Levels: []int{1}, RequestsPerLevel: 1, Warmup: -1, OutputTokens: admissionSpeedTokens})
	if err != nil {
		return res, err
	}
	if len(res.Levels) == 0 || res.Levels[0].Failed > 0 || tokPerSec(res) <= 0 {
		msg := "no answer"
		if len(res.Levels) > 0 && len(res.Levels[0].Errors) > 0 {
			msg = strings.Join(res.Levels[0].Errors, "; ")
		}
		return res, errors.New(msg)
	}
	return res, nil
}

// tokPerSec is a one-request sweep's speed: its tokens over the whole
// request. Not 1 / TPOT: a client that reads a stream late (a busy
// machine, a tunnel) gets its tokens in one burst, and a tiny model's 64
// tokens then measured 67,000 tok/s beside its twin's 1,600. Over the
// whole request every disturbance only slows a sample, which is what
// makes the fastest of them the figure (sampleSpeeds).
func tokPerSec(res sweep.Result) float64 { return res.Levels[0].PerRequestTokPerS }

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// seedSpeed hands a bench result to the router's speed model: one point per
// concurrency level, so the scheduler knows the worker's curve before
// traffic teaches it.
func (p *probe) seedSpeed(worker string, res sweep.Result) {
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
	p.router.SeedSpeed(worker, points...)
}

// referenceWorker names the worker whose shape is model's reference.
func (p *probe) referenceWorker(ctx context.Context, model string) (string, error) {
	f, err := p.store.LoadFleet(ctx)
	if err != nil {
		return "", err
	}
	node := f.ReferenceNode(model)
	if node == "" {
		return "", fmt.Errorf("model %s is not placed on any node, so it has no reference worker", model)
	}
	return node + "/" + model, nil
}
