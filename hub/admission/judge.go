package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"fleet"
	"fleet/bench/shape"
	"fleet/nodes"
	"fleet/store"
)

// DefaultWait bounds how long a worker on probation waits for its model's
// reference worker and for a peer measured faster whose shape is being
// checked, unless Config.Wait says otherwise.
const DefaultWait = 2 * time.Minute

// Judge judges the workers leaving probation: the memory gate before a
// launch (Gate), then the response shape against the model's reference
// and the speed against the model's other workers (Admit), and re-judging
// when a reference moves (ReferencesMoved, Pin). It reads the fleet
// through Fleet and measures through the probe it shares with the Runs.
type Judge struct {
	*probe
	// detach runs work that outlives the call that started it.
	detach func(ctx context.Context, f func(ctx context.Context))
	// wait bounds how long a worker on probation waits (Config.Wait).
	wait time.Duration
	// admissions counts the verdicts on /metrics.
	admissions *prometheus.CounterVec

	// mu guards speeds and duels.
	mu sync.Mutex
	// speeds are admission speed measurements, by worker.
	speeds map[string]speedRecord
	// duels holds, per model, the turn of the one pair of its workers being
	// measured against each other (headToHead).
	duels map[string]chan struct{}
}

// speedRecord is a worker's admission measurement for one launch.
type speedRecord struct {
	tokS    float64
	started time.Time // the launch it belongs to (Worker.StartedAt)
	// shape is the launch's shape verdict: 0 not yet known, 1 same as the
	// reference, 2 unchecked (no reference answered in time), -1 different.
	// Only a peer whose shape did not fail can set its model's speed bar.
	shape int
}

func (j *Judge) admissionWait() time.Duration {
	if j.wait > 0 {
		return j.wait
	}
	return DefaultWait
}

// coming reports whether a worker is on its way to being judged.
func coming(w fleet.Worker) bool {
	switch w.State {
	case fleet.WorkerPending, fleet.WorkerInstalling, fleet.WorkerStarting, fleet.WorkerProbation:
		return true
	}
	return false
}

// waitUntil polls cond until it holds, the deadline passes or ctx ends; it
// reports whether cond held.
func waitUntil(ctx context.Context, deadline time.Time, cond func() bool) bool {
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
	return true
}

// Gate is the admission check before launch: the model's memory against
// what the node, probed just before, has usable, less what launches on it
// that passed their gate hold until their engines are up. A worker that
// fails it never starts an engine. It returns the GPUs a vLLM engine is to
// take.
func (j *Judge) Gate(_ context.Context, w fleet.Worker, node fleet.Node, held nodes.Held) ([]int, error) {
	m, ok := j.fleet.Model(w.Model)
	if !ok {
		return nil, fmt.Errorf("model %s is no longer declared", w.Model)
	}
	return CheckMemory(w, m, node, held)
}

// CheckMemory compares the model's memory with what the node has usable
// once held (other launches' memory, not yet visible to a probe) is taken
// off. A vLLM engine holds its weights on the GPUs its recipe spreads them
// over (tensor × pipeline parallel, times data parallel copies, among its
// CUDA_VISIBLE_DEVICES): it is given the first such group of GPUs, not
// held by another engine, with its share of the memory free on each, and
// those GPUs are returned. Other engines (llama.cpp splits a model over
// every GPU it sees) are compared with the free memory of all GPUs
// together. vLLM is refused on a node whose nvidia-smi fails.
func CheckMemory(w fleet.Worker, m fleet.Model, n fleet.Node, held nodes.Held) ([]int, error) {
	if n.Platform == nil {
		return nil, nil // a node launched on before any probe
	}
	p := n.Platform
	need := nodes.MemoryNeed(m)
	var gpus []int
	if w.Engine == fleet.EngineVLLM {
		if p.GPUError != "" {
			return nil, fmt.Errorf("gpu: vLLM needs the NVIDIA GPUs of %s, and %s", w.Node, p.GPUError)
		}
		if len(p.GPUs) > 0 {
			d, err := nodes.RecipeGPUDemand(m.Recipes[w.Engine])
			if err != nil {
				return nil, fmt.Errorf("memory: %s's vllm recipe: %w", m.ID, err)
			}
			if gpus, err = nodes.PlaceOnGPUs(*p, w.Node, m.ID, need, d, held.GPUs); err != nil {
				return nil, err
			}
			if p.GPUs[gpus[0]].MemTotalMiB > 0 {
				return gpus, nil // checked GPU by GPU
			}
			// A unified-memory part: its GPUs are the system's memory.
		}
	}
	if need == 0 {
		return gpus, nil // no figure to check
	}
	usable := p.UsableMemory()
	how := "free memory"
	if p.OS == "darwin" {
		how = "three quarters of free + inactive + speculative memory"
	} else if slices.ContainsFunc(p.GPUs, func(g fleet.GPU) bool { return g.MemFreeMiB > 0 }) {
		how = "free GPU memory" // what UsableMemory counts then
	}
	if held.Bytes > 0 {
		how += fmt.Sprintf(", less %s held for launches in progress on it", fleet.GiB(held.Bytes))
		usable -= min(held.Bytes, usable)
	}
	if usable < need {
		return nil, fmt.Errorf("memory: %s needs %s but %s has %s usable (%s); free memory on the node or place the model elsewhere",
			m.ID, fleet.GiB(need), w.Node, fleet.GiB(usable), how)
	}
	return gpus, nil
}

// admit is the admission check between probation and ready: the response
// shape against the model's reference (which the reference worker sets),
// then single-request speed against the best worker of the model measured
// so far. A peer that is not measured yet does not hold it up: a slower one
// is judged when it is measured, and a faster one judges the ready workers
// again when it is admitted.
func (j *Judge) admit(ctx context.Context, w fleet.Worker) error {
	m, ok := j.fleet.Model(w.Model)
	if !ok {
		return fmt.Errorf("model %s is no longer declared", w.Model)
	}
	speed, err := j.measureOne(ctx, w.Model, w.Name())
	if err != nil {
		j.recordSpeed(w, 0, -1)
		return fmt.Errorf("speed: %w", err)
	}
	j.recordSpeed(w, speed, 0)
	// Against the workers measured so far first: a worker already too slow
	// for them need not have its shape measured. Not on the reference
	// worker: its shape is the reference however fast it is.
	if ref, err := j.referenceWorker(ctx, w.Model); err == nil && ref != w.Name() {
		if speed, err = j.speedVerdict(ctx, w, m, speed, speedCheck{fresh: true}); err != nil {
			j.recordSpeed(w, speed, -1)
			return err
		}
	}
	unchecked, err := j.checkShape(ctx, w)
	if err != nil {
		j.recordSpeed(w, speed, -1)
		return err
	}
	if unchecked {
		j.recordSpeed(w, speed, 2)
	} else {
		j.recordSpeed(w, speed, 1)
	}
	if speed, err = j.checkSpeed(ctx, w, m, speed); err != nil {
		return err
	}
	j.detach(ctx, func(ctx context.Context) { j.rejudgeSlower(ctx, w, m, speed) })
	return nil
}

func (j *Judge) recordSpeed(w fleet.Worker, tokS float64, shapeVerdict int) {
	j.mu.Lock()
	j.speeds[w.Name()] = speedRecord{tokS: tokS, started: w.StartedAt, shape: shapeVerdict}
	j.mu.Unlock()
}

// updateSpeed replaces a worker's recorded figure with a fresher one. A
// ready worker with none (adopted after a hub restart, or forced) gets one,
// so it is not measured again for every newcomer.
func (j *Judge) updateSpeed(worker string, tokS float64) {
	o, _ := j.fleet.Worker(worker)
	j.mu.Lock()
	defer j.mu.Unlock()
	r, ok := j.speeds[worker]
	switch {
	case ok && r.started.Equal(o.StartedAt):
		r.tokS = tokS
	case o.State == fleet.WorkerReady:
		r = speedRecord{tokS: tokS, started: o.StartedAt, shape: 1}
	default:
		return
	}
	j.speeds[worker] = r
}

func tolerance(m fleet.Model) float64 {
	if m.SpeedTolerance > 0 {
		return m.SpeedTolerance
	}
	return defaultTolerance
}

// checkSpeed judges w, measured at speed and shape-checked, against the
// best worker of its model measured so far. It waits (bounded) only for
// peers measured fast enough to reject w whose shape is still being
// checked: they set the bar if it passes. Peers not measured yet do not
// hold it up, so a starved node cannot stall the others' start.
func (j *Judge) checkSpeed(ctx context.Context, w fleet.Worker, m fleet.Model, speed float64) (float64, error) {
	var waiting []string
	settled := func() bool {
		waiting = j.fasterPending(w, speed, tolerance(m))
		return len(waiting) == 0
	}
	if !waitUntil(ctx, time.Now().Add(j.admissionWait()), settled) {
		if ctx.Err() != nil {
			return speed, ctx.Err()
		}
		j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: fmt.Sprintf("admission speed: the shape of %s, measured faster, was not judged within %s; judged against the workers measured so far (and judged again when a faster one is admitted)",
			strings.Join(waiting, ", "), j.admissionWait())})
	}
	return j.speedVerdict(ctx, w, m, speed, speedCheck{final: true})
}

// fasterPending lists, sorted, the peers of w on probation measured in
// this launch fast enough to reject w at speed (speed below tol of theirs)
// whose shape has no verdict yet: if it passes they set w's bar. A peer not
// measured yet, or slower, is not listed.
func (j *Judge) fasterPending(w fleet.Worker, speed, tol float64) []string {
	var names []string
	peers := j.fleet.Workers(w.Model)
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, o := range peers {
		name := o.Name()
		if name == w.Name() || o.State != fleet.WorkerProbation {
			continue
		}
		if r, ok := j.speeds[name]; ok && r.started.Equal(o.StartedAt) && r.shape == 0 && speed < tol*r.tokS {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// bestMeasured is the fastest worker of w's model measured so far, with its
// figure: the ready, undrained workers (their admission figure, else the
// router's estimate) and the peers on probation measured in this launch
// whose shape did not fail. A ready worker with no figure at all counts as
// the fastest, so that it is measured before w is judged against it.
func (j *Judge) bestMeasured(w fleet.Worker) (best string, bestSpeed float64) {
	estimates := map[string]float64{}
	for _, s := range j.router.Stats() {
		estimates[s.Name] = s.TokPerSec
	}
	peers := j.fleet.Workers(w.Model)
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, o := range peers {
		name := o.Name()
		if name == w.Name() {
			continue
		}
		r, ok := j.speeds[name]
		measured := ok && !o.StartedAt.IsZero() && r.started.Equal(o.StartedAt) && r.tokS > 0
		var figure float64
		switch {
		case o.State == fleet.WorkerReady && !o.Drained:
			figure = estimates[name]
			if measured {
				figure = r.tokS
			}
			if figure <= 0 {
				figure = math.Inf(1)
			}
		case o.State == fleet.WorkerProbation && measured && r.shape > 0:
			figure = r.tokS
		default:
			continue
		}
		if best == "" || figure > bestSpeed || figure == bestSpeed && name < best {
			best, bestSpeed = name, figure
		}
	}
	return best, bestSpeed
}

// speedCheck says when a speed verdict is taken.
type speedCheck struct {
	// fresh: w's figure was measured just now, so the best worker measured
	// right after it makes the two back to back.
	fresh bool
	// final: the verdict that admits w, which its events tell.
	final bool
}

// speedVerdict compares w's speed figure with the best worker of its model
// measured so far. Figures taken apart (another moment, another load on
// the machine) decide nothing against w: when they say w is too slow, the
// best worker is measured again right after w (a fresh figure of w), or
// both are, interleaved, and w is rejected only if its median is still
// below the bar. It returns w's latest figure.
func (j *Judge) speedVerdict(ctx context.Context, w fleet.Worker, m fleet.Model, speed float64, v speedCheck) (float64, error) {
	tol := tolerance(m)
	best, bestSpeed := j.bestMeasured(w)
	if best == "" || speed >= tol*bestSpeed {
		if v.final {
			j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: fmt.Sprintf("admission speed: %.1f tok/s for one request (best of %d, warm)%s", speed, speedSamples, bestNote(w.Model, best, bestSpeed, speed))})
		}
		return speed, nil
	}
	var speeds []float64
	var failed int
	var err error
	if v.fresh {
		speeds, failed, err = j.headToHead(ctx, w.Model, best)
		speeds, failed = append([]float64{speed}, speeds...), failed+1
	} else {
		speeds, failed, err = j.headToHead(ctx, w.Model, w.Name(), best)
	}
	switch {
	case err != nil && failed == 0:
		return speed, fmt.Errorf("speed: %w", err)
	case err != nil:
		// Nothing to judge against: the best worker went away or stopped
		// answering. A faster worker admitted later judges w again.
		j.event(fleet.Event{Level: "warn", Subject: w.Name(), Message: fmt.Sprintf("admission speed: could not measure %s after it (%v); judged against the workers that answer", best, err)})
		return speed, nil
	}
	speed, bestSpeed = speeds[0], speeds[1]
	j.updateSpeed(w.Name(), speed)
	j.updateSpeed(best, bestSpeed)
	j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: fmt.Sprintf("admission speed: %.1f tok/s vs %.1f tok/s on %s (same prompt, one request, best of %d each, measured back to back; needs %.0f%%)", speed, bestSpeed, best, speedSamples, tol*100)})
	if speed < tol*bestSpeed {
		return speed, fmt.Errorf("speed: %.1f tok/s for one request is below %.0f%% of %s's %.1f tok/s with the same prompt (best of %d each, measured back to back); it would slow every request it takes (override: admit --force %s)",
			speed, tol*100, best, bestSpeed, speedSamples, w.Name())
	}
	return speed, nil
}

// bestNote says how a passing figure compares with the best measured.
func bestNote(model, best string, bestSpeed, speed float64) string {
	if best == "" || math.IsInf(bestSpeed, 1) || bestSpeed <= speed {
		return fmt.Sprintf(", the best of %s's workers measured", model)
	}
	return fmt.Sprintf(", against %.1f tok/s on %s, the best of %s's workers measured", bestSpeed, best, model)
}

// headToHead measures workers of model with sampleSpeeds, one such
// measurement per model at a time, so that two verdicts do not load the
// same best worker at once and slow it for both.
func (j *Judge) headToHead(ctx context.Context, model string, workers ...string) ([]float64, int, error) {
	j.mu.Lock()
	turn, ok := j.duels[model]
	if !ok {
		turn = make(chan struct{}, 1)
		j.duels[model] = turn
	}
	j.mu.Unlock()
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	defer func() { <-turn }()
	return j.sampleSpeeds(ctx, workers...)
}

// measureOne is worker's admission speed figure: the best of speedSamples
// single-request speeds on a warm engine (sampleSpeeds), taken in
// its model's turn as headToHead's are: two admissions of one model
// measuring at once load each other's engines, on a shared machine its
// CPU.
func (j *Judge) measureOne(ctx context.Context, model, worker string) (float64, error) {
	speeds, _, err := j.headToHead(ctx, model, worker)
	if err != nil {
		return 0, err
	}
	return speeds[0], nil
}

// rejudgeSlower rejects the ready workers of w's model that a newly
// admitted w shows to be too slow, such as one admitted first when nothing
// could be compared. Each is measured again beside w before it is judged.
func (j *Judge) rejudgeSlower(ctx context.Context, w fleet.Worker, m fleet.Model, speed float64) {
	tol := tolerance(m)
	var slower []string
	peers := j.fleet.Workers(w.Model)
	j.mu.Lock()
	for _, o := range peers {
		name := o.Name()
		if r, ok := j.speeds[name]; ok && name != w.Name() && o.State == fleet.WorkerReady && r.started.Equal(o.StartedAt) && r.tokS < tol*speed {
			slower = append(slower, name)
		}
	}
	j.mu.Unlock()
	sort.Strings(slower)
	for _, name := range slower {
		speeds, _, err := j.headToHead(ctx, w.Model, name, w.Name())
		if err != nil {
			j.log.Info("could not measure a slower worker beside a new one", "worker", name, "new", w.Name(), "err", err)
			continue
		}
		j.updateSpeed(name, speeds[0])
		j.updateSpeed(w.Name(), speeds[1])
		if speeds[0] >= tol*speeds[1] {
			continue
		}
		verdict := fmt.Errorf("speed: %.1f tok/s for one request is below %.0f%% of the %.1f tok/s of %s, which arrived since (best of %d each, measured back to back); it would slow every request it takes (override: admit --force %s)",
			speeds[0], tol*100, speeds[1], w.Name(), speedSamples, name)
		if err := j.nodes.Judge(ctx, name, verdict); err != nil {
			j.log.Warn("could not re-judge a slower worker", "worker", name, "err", err)
		}
	}
}

// checkShape measures w's response shape. On the model's reference worker
// it becomes the reference, unless an operator pinned one and this worker
// still runs the command line the pin was made with; every other worker is
// compared with it, once the reference worker has answered; unchecked
// says it had not within the admission wait.
func (j *Judge) checkShape(ctx context.Context, w fleet.Worker) (unchecked bool, _ error) {
	t, _, err := j.workerTarget(w.Name())
	if err != nil {
		return false, err
	}
	got, err := shape.MeasureWith(ctx, t, shape.Options{MaxTokens: admissionShapeTokens})
	if err != nil {
		return false, fmt.Errorf("shape: probing: %w", err)
	}
	refWorker, err := j.referenceWorker(ctx, w.Model)
	if err != nil {
		return false, fmt.Errorf("shape: %w", err)
	}
	retake := j.retakePin
	if w.Name() == refWorker {
		retake = j.retakeReference
	}
	if retaken, err := retake(ctx, w, got); err != nil || retaken {
		return false, err
	}

	var ref store.Reference
	usable := func() bool {
		j.refMu.Lock()
		defer j.refMu.Unlock()
		r, err := j.store.Reference(ctx, w.Model)
		if err != nil {
			return false
		}
		rw, known := j.fleet.Worker(refWorker)
		if !r.Pinned && r.Source != refWorker {
			return false // taken from another worker (an older rule, or another reference node)
		}
		// The reference worker is relaunching with a new command line: its
		// new shape, not the recorded one, is the reference.
		if known && coming(rw) && rw.Name() != w.Name() && !slices.Equal(r.Argv, rw.Argv) {
			return false
		}
		ref = r
		return true
	}
	// A failed reference worker is relaunched after its backoff: it is
	// still coming, so its model's others wait for it (bounded) rather
	// than pass unchecked because of, say, a port another process took.
	refComing := func() bool {
		rw, ok := j.fleet.Worker(refWorker)
		return ok && (coming(rw) || rw.State == fleet.WorkerFailed)
	}
	deadline := time.Now().Add(j.admissionWait())
	if !waitUntil(ctx, deadline, func() bool { return usable() || !refComing() }) && ctx.Err() != nil {
		return false, ctx.Err()
	}
	if ref.Shape == nil && !usable() {
		j.event(fleet.Event{Level: "warn", Subject: w.Name(), Message: fmt.Sprintf("admission shape: not checked, the reference worker %s of %s has not answered (it is judged again when %s does)", refWorker, w.Model, refWorker)})
		return true, nil
	}
	return false, j.compareShape(w.Name(), w.Model, refWorker, ref, got)
}

// compareShape judges got against a stored reference.
func (j *Judge) compareShape(worker, model, refWorker string, r store.Reference, got shape.Shape) error {
	var ref shape.Shape
	if err := json.Unmarshal(r.Shape, &ref); err != nil {
		return fmt.Errorf("shape: the stored reference of %s is unreadable (run 'shape pin WORKER'): %w", model, err)
	}
	from := refWorker
	if r.Pinned {
		from = r.Source + ", pinned"
	}
	ok, report := shape.Matches(ref, got)
	if !ok {
		j.event(fleet.Event{Level: "error", Subject: worker, Message: "admission shape differs from the reference of " + model + " (" + from + "):\n" + report.Text(100, false)})
		var what []string
		for _, d := range report.Differences {
			if d.Material {
				what = append(what, d.String())
			}
		}
		return fmt.Errorf("shape: differs from %s's reference (%s): %s (see 'events --subject %s' for the diff)", model, from, strings.Join(what, "; "), worker)
	}
	j.event(fleet.Event{Level: "info", Subject: worker, Message: "admission shape: same as the reference of " + model + " (" + from + ")"})
	return nil
}

// retakeReference makes the reference worker's shape its model's reference,
// unless a pin made with its current command line holds; it reports whether
// it did. Every other worker of the model is then judged again.
func (j *Judge) retakeReference(ctx context.Context, w fleet.Worker, got shape.Shape) (bool, error) {
	data, err := json.Marshal(got)
	if err != nil {
		return false, err
	}
	j.refMu.Lock()
	old, err := j.store.Reference(ctx, w.Model)
	switch {
	case err != nil && !isNotFound(err):
		j.refMu.Unlock()
		return false, fmt.Errorf("shape: %w", err)
	case err == nil && old.Pinned && slices.Equal(old.Argv, w.Argv):
		j.refMu.Unlock()
		return false, nil // the pin holds: judged against it like any worker
	}
	// Workers judged against an older reference (or none) are judged
	// again when it changed; those still coming read the new one themselves.
	changed := err != nil || old.Source != w.Name() || !bytes.Equal(old.Shape, data)
	peers := j.fleet.Workers(w.Model)
	j.mu.Lock()
	for _, o := range peers {
		if r, ok := j.speeds[o.Name()]; ok && r.shape == 2 && r.started.Equal(o.StartedAt) {
			changed = true // admitted before any reference answered
		}
	}
	j.mu.Unlock()
	err = j.store.SetReference(ctx, w.Model, store.Reference{Shape: data, Source: w.Name(), Argv: w.Argv})
	j.refMu.Unlock()
	if err != nil {
		return false, fmt.Errorf("shape: storing the reference of %s failed; the stored one is as it was ('restart %s' judges it again): %w", w.Model, w.Name(), err)
	}
	if !changed {
		j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: "admission shape: reference worker of " + w.Model + ", its shape is the reference (unchanged)"})
		return true, nil
	}
	j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: "admission shape: reference worker of " + w.Model + ", its shape is the reference; the model's other workers are judged again"})
	j.detach(ctx, func(ctx context.Context) { j.rejudge(ctx, w.Model, w.Name(), false) })
	return true, nil
}

// retakePin makes the shape of the worker an operator pinned its model's
// pinned reference again, as the reference worker retakes the reference:
// relaunched with a new command line, it is not judged against its old
// self. It reports whether w is that worker; when its shape changed, every
// other worker of the model is judged again.
func (j *Judge) retakePin(ctx context.Context, w fleet.Worker, got shape.Shape) (bool, error) {
	data, err := json.Marshal(got)
	if err != nil {
		return false, err
	}
	j.refMu.Lock()
	old, err := j.store.Reference(ctx, w.Model)
	if err != nil || !old.Pinned || old.Source != w.Name() {
		j.refMu.Unlock()
		if err != nil && !isNotFound(err) {
			return false, fmt.Errorf("shape: %w", err)
		}
		return false, nil
	}
	// Materially: the pin was measured by 'shape pin', longer than an
	// admission's, so its bytes differ even for the same engine.
	var pinned shape.Shape
	changed := true
	if json.Unmarshal(old.Shape, &pinned) == nil {
		same, _ := shape.Matches(pinned, got)
		changed = !same
	}
	if changed {
		// Argv stays the reference worker's: its new command line still
		// ends the pin.
		err = j.store.SetReference(ctx, w.Model, store.Reference{Shape: data, Pinned: true, Source: w.Name(), Argv: old.Argv})
	}
	j.refMu.Unlock()
	if err != nil {
		return false, fmt.Errorf("shape: storing the pinned reference of %s failed; the stored one is as it was ('restart %s' judges it again): %w", w.Model, w.Name(), err)
	}
	if !changed {
		j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: "admission shape: its shape is the pinned reference of " + w.Model + " (unchanged)"})
		return true, nil
	}
	j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: "admission shape: pinned worker of " + w.Model + ", it retakes the pinned reference with its new shape; the model's other workers are judged again"})
	j.detach(ctx, func(ctx context.Context) { j.rejudge(ctx, w.Model, w.Name(), false) })
	return true, nil
}

// rejudge judges the workers of model (all but skip; only the rejected ones
// when onlyRejected) against its reference again, without restarting them:
// a ready worker whose shape now differs is rejected, a rejected one whose
// shape and speed now pass is admitted, and a rejected one whose engine was
// stopped is launched again to be judged. Workers still coming judge
// themselves against the reference they find. It returns one line per
// worker.
func (j *Judge) rejudge(ctx context.Context, model, skip string, onlyRejected bool) []string {
	refWorker, err := j.referenceWorker(ctx, model)
	if err != nil {
		return []string{err.Error()}
	}
	m, ok := j.fleet.Model(model)
	if !ok {
		return nil
	}
	var names []string
	for _, w := range j.fleet.Workers(model) {
		if w.Name() != skip {
			names = append(names, w.Name())
		}
	}
	sort.Strings(names)
	var lines []string
	for _, name := range names {
		w, ok := j.fleet.Worker(name)
		if !ok {
			continue // gone since: nothing to judge
		}
		if line := j.rejudgeOne(ctx, w, m, refWorker, onlyRejected); line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

func (j *Judge) rejudgeOne(ctx context.Context, w fleet.Worker, m fleet.Model, refWorker string, onlyRejected bool) string {
	name := w.Name()
	switch {
	case w.State == fleet.WorkerRejected && (strings.HasPrefix(w.Reason, "memory:") || strings.HasPrefix(w.Reason, "gpu:")):
		return "" // judged before launch, not by its shape
	case w.State == fleet.WorkerRejected && w.PID == 0:
		j.detach(ctx, func(ctx context.Context) {
			if err := j.nodes.StartWorker(ctx, name); err != nil {
				j.log.Info("a re-judged worker did not come back", "worker", name, "err", err)
			}
		})
		j.event(fleet.Event{Level: "info", Subject: name, Message: "its model's reference changed: launching its engine again to judge it"})
		return name + ": its engine was down, launching it to judge it"
	case w.State == fleet.WorkerRejected:
	case w.State == fleet.WorkerReady && !onlyRejected:
	default:
		return ""
	}
	t, _, err := j.workerTarget(name)
	if err != nil {
		return name + ": " + err.Error()
	}
	got, err := shape.MeasureWith(ctx, t, shape.Options{MaxTokens: admissionShapeTokens})
	if err != nil {
		return fmt.Sprintf("%s: probing: %v", name, err)
	}
	j.refMu.Lock()
	ref, err := j.store.Reference(ctx, w.Model)
	j.refMu.Unlock()
	if err != nil {
		return name + ": " + err.Error()
	}
	verdict := j.compareShape(name, w.Model, refWorker, ref, got)
	if verdict == nil {
		j.mu.Lock()
		if r, ok := j.speeds[name]; ok && r.shape == 2 {
			r.shape = 1
			j.speeds[name] = r
		}
		j.mu.Unlock()
	}
	if verdict == nil && w.State == fleet.WorkerRejected {
		// Its shape passes now; its speed must too before it takes traffic.
		speed, err := j.measureOne(ctx, w.Model, name)
		if err != nil {
			verdict = fmt.Errorf("speed: %w", err)
		} else {
			j.recordSpeed(w, speed, 1)
			_, verdict = j.speedVerdict(ctx, w, m, speed, speedCheck{fresh: true, final: true})
		}
	}
	if err := j.nodes.Judge(ctx, name, verdict); err != nil {
		return name + ": " + err.Error()
	}
	if verdict != nil {
		return name + ": rejected: " + verdict.Error()
	}
	return name + ": admitted"
}

// ReferencesMoved retakes the reference of each model whose reference node
// an apply changed, from the new reference worker if its engine answers
// (else it does so when it is admitted), and judges the others again.
func (j *Judge) ReferencesMoved(ctx context.Context, before, after fleet.Fleet) {
	for _, m := range after.Models {
		node := after.ReferenceNode(m.ID)
		if node == "" || node == before.ReferenceNode(m.ID) {
			continue
		}
		refWorker := node + "/" + m.ID
		j.event(fleet.Event{Level: "info", Subject: refWorker, Message: "now the reference worker of " + m.ID})
		j.detach(ctx, func(ctx context.Context) {
			w, ok := j.fleet.Worker(refWorker)
			if !ok || w.PID == 0 || (w.State != fleet.WorkerReady && w.State != fleet.WorkerRejected) {
				return
			}
			t, _, err := j.workerTarget(refWorker)
			if err != nil {
				return
			}
			got, err := shape.MeasureWith(ctx, t, shape.Options{MaxTokens: admissionShapeTokens})
			if err != nil {
				j.event(fleet.Event{Level: "warn", Subject: refWorker, Message: "could not take the reference shape of " + m.ID + ": " + err.Error()})
				return
			}
			if _, err := j.retakeReference(ctx, w, got); err != nil {
				j.event(fleet.Event{Level: "warn", Subject: refWorker, Message: "could not take the reference shape of " + m.ID + ": " + err.Error()})
				return
			}
			if w.State == fleet.WorkerRejected {
				// Rejected against the old reference, it is the new one.
				j.rejudgeOne(ctx, w, m, refWorker, true)
			}
		})
	}
}

// Pin makes a worker's current shape its model's pinned reference and
// judges every worker of the model again. It is the pin a user's shape pin
// run carries out (Runs.PinShape), authorized and audited there, or on the
// hub that forwarded it to this leader.
func (j *Judge) Pin(ctx context.Context, worker string) (string, error) {
	t, w, err := j.workerTarget(worker)
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
	refWorker, err := j.referenceWorker(ctx, w.Model)
	if err != nil {
		return "", err
	}
	rw, _ := j.fleet.Worker(refWorker)
	argv := rw.Argv
	j.refMu.Lock()
	err = j.store.SetReference(ctx, w.Model, store.Reference{Shape: data, Pinned: true, Source: w.Name(), Argv: argv})
	j.refMu.Unlock()
	if err != nil {
		return "", fmt.Errorf("storing %s's shape as the pinned reference of %s failed; the stored one is as it was (run 'shape pin %s' again): %w", w.Name(), w.Model, w.Name(), err)
	}
	j.event(fleet.Event{Level: "info", Subject: w.Name(), Message: "its shape is now the pinned reference of " + w.Model + "; every worker of the model is judged again"})
	until := fmt.Sprintf("pinned until %s runs another command line; a new command line on %s retakes it with its new shape", refWorker, w.Name())
	if w.Name() == refWorker {
		until = fmt.Sprintf("pinned until %s runs another command line", refWorker)
	}
	msg := fmt.Sprintf("the reference shape of %s is now %s's (%s)", w.Model, w.Name(), until)
	// Every worker, the ready ones too: one model serving two shapes is
	// what the reference is there to prevent.
	if lines := j.rejudge(ctx, w.Model, "", false); len(lines) > 0 {
		msg += "\nre-judged the model's workers:\n  " + strings.Join(lines, "\n  ")
	}
	return msg, nil
}

// newAdmissions counts admission checks by model and result.
func newAdmissions(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleet_admissions_total",
		Help: "Admission checks of workers leaving probation, by model and result: admitted, or rejected (too slow, a different response shape, or a check that failed).",
	}, []string{"model", "result"})
	reg.MustRegister(c)
	return c
}

// CountModels puts the models' verdict counters on /metrics at zero, so
// that a dashboard shows 0 before the first verdict.
func (j *Judge) CountModels(models []fleet.Model) {
	for _, m := range models {
		j.admissions.WithLabelValues(m.ID, "admitted")
		j.admissions.WithLabelValues(m.ID, "rejected")
	}
}

// Admit is the admission check between probation and ready (see admit),
// counted on /metrics; nil admits w.
func (j *Judge) Admit(ctx context.Context, w fleet.Worker) error {
	err := j.admit(ctx, w)
	switch {
	case err == nil:
		j.admissions.WithLabelValues(w.Model, "admitted").Inc()
	case errors.Is(err, context.Canceled):
		// The hub is stopping: no verdict.
	default:
		j.admissions.WithLabelValues(w.Model, "rejected").Inc()
	}
	return err
}
