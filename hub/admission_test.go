package hub

import (
	"math"
	"slices"
	"testing"
	"time"

	"fleet"
)

// peer is a worker of model m beside the one being judged, with its
// admission record (none when tokS is 0).
type peer struct {
	node    string
	state   fleet.WorkerState
	drained bool
	tokS    float64
	shape   int
	stale   bool // the record is of an earlier launch
}

// hubWith is a hub whose mirror holds the peers of a/m.
func hubWith(t *testing.T, peers []peer) (*Hub, fleet.Worker) {
	t.Helper()
	h := newHub(t, Options{})
	launched := time.Now().Add(-time.Minute)
	h.state.mu.Lock()
	defer h.state.mu.Unlock()
	for _, p := range peers {
		w := fleet.Worker{Node: p.node, Model: "m", State: p.state, Drained: p.drained, StartedAt: launched}
		h.state.workers[w.Name()] = w
		if p.tokS > 0 {
			r := speedRecord{tokS: p.tokS, started: launched, shape: p.shape}
			if p.stale {
				r.started = launched.Add(-time.Hour)
			}
			h.admission.speeds[w.Name()] = r
		}
	}
	w := fleet.Worker{Node: "a", Model: "m", State: fleet.WorkerProbation, StartedAt: launched}
	h.state.workers[w.Name()] = w
	return h, w
}

// A worker measured at 40 tok/s (tolerance 0.5) waits only for peers that
// could reject it and whose shape is being judged; a peer not measured yet,
// the starved node of issue 21, holds no one up.
func TestFasterPending(t *testing.T) {
	tests := []struct {
		name  string
		peers []peer
		want  []string
	}{
		{"a peer not measured yet holds no one up", []peer{{node: "slow", state: fleet.WorkerProbation}}, nil},
		{"a slower peer, shape pending", []peer{{node: "slow", state: fleet.WorkerProbation, tokS: 30}}, nil},
		{"a peer fast enough to reject it, shape pending", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 100}}, []string{"fast/m"}},
		{"exactly at the bar does not reject", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 80}}, nil},
		{"a faster peer whose shape was judged", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 100, shape: 1}}, nil},
		{"a record of an earlier launch", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 100, stale: true}}, nil},
		{"a ready worker is judged against, not waited for", []peer{{node: "fast", state: fleet.WorkerReady, tokS: 100}}, nil},
		{"several, sorted", []peer{
			{node: "z", state: fleet.WorkerProbation, tokS: 100},
			{node: "slow", state: fleet.WorkerStarting},
			{node: "b", state: fleet.WorkerProbation, tokS: 90},
		}, []string{"b/m", "z/m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, w := hubWith(t, tt.peers)
			if got := h.admission.fasterPending(w, 40, 0.5); !slices.Equal(got, tt.want) {
				t.Errorf("waits for %v, want %v", got, tt.want)
			}
		})
	}
}

// The bar is the fastest worker measured so far whose shape did not fail;
// a ready worker with no figure is measured before anyone is judged
// against it (its figure counts as infinite).
func TestBestMeasured(t *testing.T) {
	tests := []struct {
		name      string
		peers     []peer
		best      string
		bestSpeed float64
	}{
		{"nothing measured", []peer{{node: "slow", state: fleet.WorkerStarting}, {node: "b", state: fleet.WorkerProbation}}, "", 0},
		{"a peer measured and shape-checked beats a ready worker", []peer{
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
			{node: "p", state: fleet.WorkerProbation, tokS: 120, shape: 1},
		}, "p/m", 120},
		{"a peer whose shape is pending or failed sets no bar", []peer{
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
			{node: "p", state: fleet.WorkerProbation, tokS: 120},
			{node: "q", state: fleet.WorkerProbation, tokS: 150, shape: -1},
		}, "r/m", 90},
		{"an unchecked peer (no reference answered) sets it", []peer{{node: "p", state: fleet.WorkerProbation, tokS: 70, shape: 2}}, "p/m", 70},
		{"a drained or rejected worker sets no bar", []peer{
			{node: "d", state: fleet.WorkerReady, drained: true, tokS: 200, shape: 1},
			{node: "x", state: fleet.WorkerRejected, tokS: 300, shape: -1},
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
		}, "r/m", 90},
		{"a ready worker never measured here is measured first", []peer{
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
			{node: "adopted", state: fleet.WorkerReady},
		}, "adopted/m", math.Inf(1)},
		{"a ready worker's record of an earlier launch is no figure", []peer{{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1, stale: true}}, "r/m", math.Inf(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, w := hubWith(t, tt.peers)
			if best, speed := h.admission.bestMeasured(w); best != tt.best || speed != tt.bestSpeed {
				t.Errorf("best %q at %v, want %q at %v", best, speed, tt.best, tt.bestSpeed)
			}
		})
	}
}
