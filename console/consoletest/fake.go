// Package consoletest provides a scripted console.Source for tests of the
// console and the SSH server: a small fleet whose live figures change on
// every snapshot, and a record of the actions it was asked to do.
package consoletest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/console"
)

// Source is a console.Source over an in-memory fleet. Every Snapshot call
// advances a counter that moves tok/s and the histories, so a screen that
// refreshes shows a changing value.
type Source struct {
	mu      sync.Mutex
	snap    fleet.Snapshot
	ticks   int
	actions []console.Action
	refused []console.Action
	// Err, when set, is returned by Do.
	Err error
	// Reply is the text Do returns for shape and bench. Left empty, bench
	// answers as the hub does: at once, before the sweep has run (the
	// result arrives later through SetBench).
	Reply string
}

// Demo returns a Source with the three workers of the design's demo: rig
// (8x RTX 3060, vLLM), ultra (Apple M1 Ultra, llama.cpp) and max (M4 Max,
// simulated llama.cpp), plus their nodes, the model and a few events.
func Demo() *Source {
	start := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	rigP := &fleet.Platform{OS: "linux", Arch: "amd64", GPUs: slices.Repeat([]fleet.GPU{{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288}}, 8), MemTotalBytes: 128 << 30, MemFreeBytes: 100 << 30}
	ultraP := &fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra", MemTotalBytes: 128 << 30, MemFreeBytes: 90 << 30}
	maxP := &fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max", MemTotalBytes: 64 << 30, MemFreeBytes: 40 << 30, Profile: "m4max-llamacpp"}
	model := fleet.Model{
		ID: "qwen3-4b", Aliases: []string{"qwen3"}, Context: 16384, MemoryGB: 3,
		Recipes: map[fleet.EngineKind]fleet.Recipe{
			fleet.EngineVLLM:     {Engine: fleet.EngineVLLM, Model: "Qwen/Qwen3-4B-AWQ", Args: []string{"--tensor-parallel-size", "1", "--data-parallel-size", "3"}},
			fleet.EngineLlamaCpp: {Engine: fleet.EngineLlamaCpp, Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M", Args: []string{"-ngl", "99", "--jinja", "--reasoning-format", "none"}},
			fleet.EngineSim:      {Engine: fleet.EngineSim, Profile: "m4max-llamacpp"},
		},
	}
	worker := func(id int64, node string, p *fleet.Platform, engine fleet.EngineKind, argv []string, slots, pid int) fleet.WorkerView {
		return fleet.WorkerView{
			Worker: fleet.Worker{
				ID: id, Node: node, Model: model.ID, Engine: engine, State: fleet.WorkerReady,
				Port: 8000 + int(id), PID: pid, Argv: argv, StartedAt: start, Context: 16384, Slots: slots,
				EngineVersion: "test",
			},
			Host: p.HostLabel(), GPU: p.GPULabel(), MemoryBytes: 3 << 30,
		}
	}
	maxW := worker(3, "max", maxP, fleet.EngineLlamaCpp, []string{"llama-server", "-hf", "Qwen/Qwen3-4B-GGUF:Q4_K_M", "-a", "qwen3-4b", "-c", "16384", "--port", "8003", "-ngl", "99", "--jinja"}, 4, 3003)
	maxW.Simulated = true
	hit := 0.87
	maxW.CacheHit = &hit
	// The first seed's M4 Max row: 87 tok/s alone, 130 and 136 in total at 2
	// and 4, 34 per request at 4.
	maxW.Bench = DemoBench()
	maxW.BenchAt = start.Add(4 * time.Minute)
	maxW.LaunchArgv = []string{"fleet", "sim", "--mimic", "llamacpp", "--profile", "m4max-llamacpp", "--port", "8003"}
	s := &Source{snap: fleet.Snapshot{
		At: start,
		Workers: []fleet.WorkerView{
			worker(1, "rig", rigP, fleet.EngineVLLM, []string{"vllm", "serve", "Qwen/Qwen3-4B-AWQ", "--served-model-name", "qwen3-4b", "--max-model-len", "16384", "--host", "127.0.0.1", "--port", "8001", "--tensor-parallel-size", "1", "--data-parallel-size", "3"}, 48, 3001),
			worker(2, "ultra", ultraP, fleet.EngineLlamaCpp, []string{"llama-server", "-hf", "Qwen/Qwen3-4B-GGUF:Q4_K_M", "-a", "qwen3-4b", "-c", "16384", "--host", "127.0.0.1", "--port", "8002", "-ngl", "99", "--jinja", "--reasoning-format", "none"}, 4, 3002),
			maxW,
		},
		Nodes: []fleet.Node{
			{Name: "rig", Address: "ops@rig.lan:22", Platform: rigP, State: fleet.NodeUp},
			{Name: "ultra", Address: "ops@ultra.lan", Platform: ultraP, State: fleet.NodeUp},
			{Name: "max", Address: "sim:m4max-llamacpp", Platform: maxP, State: fleet.NodeUp},
		},
		Models: []fleet.Model{model},
		Events: []fleet.Event{
			{ID: 1, At: start, Level: "info", Subject: "ultra/qwen3-4b", Message: "launched llama-server, PID 3002"},
			{ID: 2, At: start.Add(time.Second), Level: "info", Subject: "ultra/qwen3-4b", Message: "ready after 4.1s"},
			{ID: 3, At: start.Add(2 * time.Second), Level: "warn", Subject: "max", Message: "probe slow: 1.2s"},
		},
		Audit: []fleet.AuditEntry{
			{ID: 1, At: start.Add(3 * time.Second), User: "vic", Action: "drain", Target: "rig/qwen3-4b", Outcome: "denied: drain needs the operator role"},
		},
		Usage: []fleet.Usage{
			{Model: "qwen3-4b", Worker: "rig/qwen3-4b", Requests: 412, PromptTokens: 1_234_567, CachedTokens: 987_654, CompletionTokens: 45_678},
			{Model: "qwen3-4b", Worker: "max/qwen3-4b", Requests: 12, PromptTokens: 800, CachedTokens: 0, CompletionTokens: 300},
			{Key: "ci", Requests: 424, PromptTokens: 1_235_367, CachedTokens: 987_654, CompletionTokens: 45_978},
		},
	}}
	s.SetInFlight("ultra/qwen3-4b", 3)
	return s
}

// DemoBench is the bench sweep Demo gives max: the first seed's M4 Max
// figures (87 / 130 / 136 tok/s total at 1 / 2 / 4 concurrent requests, 34
// per request at 4) with TTFT p50 rising from about 95 ms.
func DemoBench() []fleet.BenchPoint {
	return []fleet.BenchPoint{
		{Concurrency: 1, TotalTokPerSec: 87, PerRequestTokPerSec: 87, TTFTp50ms: 95},
		{Concurrency: 2, TotalTokPerSec: 130, PerRequestTokPerSec: 65, TTFTp50ms: 118},
		{Concurrency: 4, TotalTokPerSec: 136, PerRequestTokPerSec: 34, TTFTp50ms: 162},
	}
}

// Many returns a Source with n simulated workers spread over n/4 nodes, for
// benchmarks and scrolling tests.
func Many(n int) *Source {
	s := &Source{}
	p := &fleet.Platform{OS: "linux", Arch: "amd64", GPUs: []fleet.GPU{{Name: "NVIDIA RTX 5060 Ti"}}}
	for i := 0; i < n; i++ {
		node := fmt.Sprintf("gpu-%03d", i/4)
		hist := make([]float64, 60)
		for j := range hist {
			hist[j] = float64(100 + (i*7+j*13)%200)
		}
		s.snap.Workers = append(s.snap.Workers, fleet.WorkerView{
			Worker: fleet.Worker{
				ID: int64(i + 1), Node: node, Model: fmt.Sprintf("model-%d", i%4), Engine: fleet.EngineVLLM,
				State: fleet.WorkerReady, Port: 8000 + i%4, PID: 10000 + i, Context: 32768, Slots: 16,
				Argv: []string{"vllm", "serve", "Qwen/Qwen3-4B-AWQ", "--served-model-name", fmt.Sprintf("model-%d", i%4), "--port", fmt.Sprint(8000 + i%4)},
			},
			Host: "Linux", GPU: p.GPULabel(), InFlight: i % 16, TokPerSec: float64(50 + i%90),
			TTFTms: float64(100 + i%200), ITLms: float64(8 + i%20), TTFTHistory: hist, ITLHistory: hist,
		})
		if i%4 == 0 {
			s.snap.Nodes = append(s.snap.Nodes, fleet.Node{Name: node, Address: "ops@" + node, Platform: p, State: fleet.NodeUp})
		}
	}
	return s
}

// Snapshot returns the fleet with live figures advanced by one step.
func (s *Source) Snapshot() fleet.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ticks++
	out := s.snap
	out.At = s.snap.At.Add(time.Duration(s.ticks) * 500 * time.Millisecond)
	out.Workers = slices.Clone(s.snap.Workers)
	for i := range out.Workers {
		w := &out.Workers[i]
		if w.State != fleet.WorkerReady {
			continue
		}
		w.TokPerSec = float64(80 + (s.ticks+i*3)%20)
		w.TTFTms = float64(100 + (s.ticks*17+i*31)%150)
		w.ITLms = float64(10 + (s.ticks*3+i)%8)
		w.TTFTHistory = append(slices.Clone(w.TTFTHistory), w.TTFTms)
		w.ITLHistory = append(slices.Clone(w.ITLHistory), w.ITLms)
		s.snap.Workers[i].TTFTHistory = lastN(w.TTFTHistory, 120)
		s.snap.Workers[i].ITLHistory = lastN(w.ITLHistory, 120)
	}
	out.Events = slices.Clone(s.snap.Events)
	out.Audit = slices.Clone(s.snap.Audit)
	out.Usage = slices.Clone(s.snap.Usage)
	return out
}

func lastN(v []float64, n int) []float64 {
	if len(v) > n {
		return slices.Clone(v[len(v)-n:])
	}
	return v
}

// Ticks is how many snapshots were taken.
func (s *Source) Ticks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ticks
}

// Do records the action and applies drain and undrain to the fleet the way
// the hub does: a drained worker is draining until its requests finish.
func (s *Source) Do(_ context.Context, a console.Action) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.actions = append(s.actions, console.Action{Kind: a.Kind, Targets: slices.Clone(a.Targets), Split: a.Split, Width: a.Width})
	if s.Err != nil {
		return "", s.Err
	}
	for i := range s.snap.Workers {
		w := &s.snap.Workers[i]
		if !slices.Contains(a.Targets, w.Name()) {
			continue
		}
		switch a.Kind {
		// As the hub's snapshot: the drain flag, and "draining" for the
		// state of a ready worker only.
		case fleet.ActionDrain:
			w.Drained = true
			if w.State == fleet.WorkerReady {
				w.State = fleet.WorkerDraining
			}
		case fleet.ActionUndrain:
			w.Drained = false
			if w.State == fleet.WorkerDraining {
				w.State = fleet.WorkerReady
			}
		}
	}
	switch a.Kind {
	case fleet.ActionBench:
		if s.Reply == "" {
			return fmt.Sprintf("bench started on %s; the table lands in its events", strings.Join(a.Targets, ", ")), nil
		}
		return s.Reply, nil
	case fleet.ActionShape:
		return s.Reply, nil
	}
	return fmt.Sprintf("%s %s: ok", a.Kind, strings.Join(a.Targets, ", ")), nil
}

// WorkerLog returns a few lines naming the worker.
func (s *Source) WorkerLog(_ context.Context, worker string, lines int) ([]string, error) {
	out := []string{"INFO loading model for " + worker, "INFO server listening"}
	if len(out) > lines {
		out = out[len(out)-lines:]
	}
	return out, nil
}

// Actions returns what Do was asked, in order.
func (s *Source) Actions() []console.Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.actions)
}

// SetBench records a finished bench sweep of a worker, as the hub does when
// a sweep it started completes.
func (s *Source) SetBench(worker string, points []fleet.BenchPoint, at time.Time) {
	s.updateWorker(worker, func(w *fleet.WorkerView) { w.Bench, w.BenchAt = slices.Clone(points), at })
}

// SetAgentBench records a finished agent-split sweep of a worker.
func (s *Source) SetAgentBench(worker string, points []fleet.BenchPoint, at time.Time) {
	s.updateWorker(worker, func(w *fleet.WorkerView) { w.AgentBench, w.AgentBenchAt = slices.Clone(points), at })
}

// updateWorker applies set to the named worker of the snapshot.
func (s *Source) updateWorker(worker string, set func(*fleet.WorkerView)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.snap.Workers {
		if s.snap.Workers[i].Name() == worker {
			set(&s.snap.Workers[i])
		}
	}
}

// AddEvent appends an event to the fleet's event list.
func (s *Source) AddEvent(e fleet.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.ID == 0 {
		e.ID = int64(len(s.snap.Events) + 1)
	}
	s.snap.Events = append(s.snap.Events, e)
}

// SetState sets a worker's lifecycle state.
func (s *Source) SetState(worker string, state fleet.WorkerState) {
	s.updateWorker(worker, func(w *fleet.WorkerView) { w.State = state })
}

// SetInFlight sets a worker's in-flight count (a drain finishes at 0).
func (s *Source) SetInFlight(worker string, n int) {
	s.updateWorker(worker, func(w *fleet.WorkerView) { w.InFlight = n })
}

// Refused records a key the user's role did not allow, as the hub audits it.
func (s *Source) Refused(kind fleet.ActionName, targets []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused = append(s.refused, console.Action{Kind: kind, Targets: slices.Clone(targets)})
}

// RefusedActions returns the refusals reported so far.
func (s *Source) RefusedActions() []console.Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.refused)
}

// SetHub makes the snapshot say which hub answers, as a hub of several on
// PostgreSQL does.
func (s *Source) SetHub(r *fleet.HubRole) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snap.Hub = r
}
