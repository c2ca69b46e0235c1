package hub

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
)

func TestCheckMemory(t *testing.T) {
	const gib = 1 << 30
	model := fleet.Model{ID: "qwen3-4b", MemoryGB: 3}
	worker := fleet.Worker{Node: "n", Model: "qwen3-4b"}
	tests := []struct {
		name    string
		model   fleet.Model
		node    fleet.Node
		held    uint64 // held for other launches on the node
		wantErr string // "" = admitted
	}{
		{name: "Linux GPU with room", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 1 * gib, GPUs: []fleet.GPU{{MemFreeMiB: 4096}}}}},
		{name: "Linux GPU too full: GPU memory counts, not RAM", model: model,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 64 * gib, GPUs: []fleet.GPU{{MemFreeMiB: 2048}}}},
			wantErr: "memory: qwen3-4b needs 3.0 GiB but n has 2.0 GiB usable (free GPU memory)"},
		{name: "Linux GPU with room, but not beside a launch in progress", model: model, held: 2 * gib,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", GPUs: []fleet.GPU{{MemFreeMiB: 4096}}}},
			wantErr: "n has 2.0 GiB usable (free GPU memory, less 2.0 GiB held for launches in progress on it)"},
		{name: "held beyond what the node has", model: model, held: 8 * gib,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}},
			wantErr: "n has 0.0 GiB usable (free memory, less 8.0 GiB held"},
		{name: "room beside a launch in progress", model: model, held: 1 * gib,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}}},
		{name: "Linux CPU node uses available RAM", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}}},
		{name: "Mac counts three quarters of free memory", model: model,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin", MemFreeBytes: 3 * gib}},
			wantErr: "has 2.2 GiB usable (three quarters of free + inactive + speculative memory)"},
		{name: "Mac with room", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin", MemFreeBytes: 8 * gib}}},
		{name: "model without a memory figure is not checked", model: fleet.Model{ID: "qwen3-4b"},
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin"}}},
		{name: "node never probed is not judged", model: model, node: fleet.Node{Name: "n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkMemory(worker, tt.model, tt.node, tt.held)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tt.wantErr)
			case err != nil && !strings.Contains(err.Error(), "place the model elsewhere"):
				t.Errorf("error %q does not say what to do", err)
			}
		})
	}
}

// shape, shape pin and bench reach any worker whose engine runs, rejected
// ones included; on one whose engine is down they say so and what to do.
func TestWorkerTargetByEngineState(t *testing.T) {
	h := newHub(t, Options{})
	tests := []struct {
		name    string
		w       fleet.Worker
		wantErr string // "" = reachable
	}{
		{"ready", fleet.Worker{State: fleet.WorkerReady, PID: 42, Port: 18000}, ""},
		{"rejected, engine up", fleet.Worker{State: fleet.WorkerRejected, PID: 42, Port: 18000, Reason: "shape: differs"}, ""},
		{"on probation", fleet.Worker{State: fleet.WorkerProbation, PID: 42, Port: 18000}, ""},
		{"rejected, engine stopped", fleet.Worker{State: fleet.WorkerRejected, Port: 18000, Reason: "shape: differs; its engine was stopped after 10m0s rejected"},
			"worker max/qwen3-4b is rejected and its engine is down (shape: differs; its engine was stopped after 10m0s rejected); nothing answers to measure: 'start max/qwen3-4b' launches it again"},
		{"rejected before launch", fleet.Worker{State: fleet.WorkerRejected, Reason: "memory: qwen3-4b needs 90.0 GB"},
			"is rejected and its engine is down (memory: qwen3-4b needs 90.0 GB)"},
		{"failed", fleet.Worker{State: fleet.WorkerFailed, Port: 18000, Reason: "engine PID 7 exited"},
			"worker max/qwen3-4b is failed and its engine is not answering (engine PID 7 exited); wait until it is ready"},
		{"starting", fleet.Worker{State: fleet.WorkerStarting, PID: 42, Port: 18000}, "is starting and its engine is not answering"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := tt.w
			w.Node, w.Model = "max", "qwen3-4b"
			h.state.mu.Lock()
			h.state.workers[w.Name()] = w
			h.state.mu.Unlock()
			_, _, err := h.checks.workerTarget("max")
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("not reachable: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}

// One unit for memory: a memory rejection and the nodes table print the
// node's usable memory as the same number with the same unit (it was
// "22.3 GB usable" in the rejection beside "22.3/23.5 GiB" in the table).
func TestMemoryRejectionAndNodesTableAgree(t *testing.T) {
	h := newHub(t, Options{})
	ctx := t.Context()
	// 22,835 MiB free: 22.3 GiB, 23.9 GB; the units cannot be confused.
	p := fleet.Platform{OS: "linux", Arch: "amd64", MemTotalBytes: 64 << 30, MemFreeBytes: 40 << 30,
		GPUs: []fleet.GPU{{Name: "NVIDIA GeForce RTX 4090", MemTotalMiB: 24564, MemFreeMiB: 22835}}}
	// As a probe reports it.
	h.state.mu.Lock()
	node := h.state.nodes["rig"]
	h.state.mu.Unlock()
	node.Platform, node.ProbedAt, node.State = &p, time.Now(), fleet.NodeUp
	h.onNode(node)
	rejection := checkMemory(fleet.Worker{Node: "rig", Model: "big"}, fleet.Model{ID: "big", MemoryGB: 30}, node, 0)
	if rejection == nil {
		t.Fatal("a model of 30 GiB was admitted on 22.3 GiB")
	}
	m := regexp.MustCompile(`has (\S+ \S+) usable`).FindStringSubmatch(rejection.Error())
	if m == nil {
		t.Fatalf("rejection %q names no usable figure", rejection)
	}
	var out, errOut bytes.Buffer
	if code := h.Exec(ctx, admin, []string{"nodes"}, nil, &out, &errOut); code != 0 {
		t.Fatalf("nodes: exit %d: %s", code, errOut.String())
	}
	var header, row []string
	for line := range strings.Lines(out.String()) {
		cells := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
		switch {
		case header == nil:
			header = cells
		case cells[0] == "rig":
			row = cells
		}
	}
	col := slices.Index(header, "USABLE")
	if col < 0 || len(row) != len(header) {
		t.Fatalf("the nodes table has no USABLE column for rig:\n%s", out.String())
	}
	if row[col] != m[1] || m[1] != "22.3 GiB" {
		t.Errorf("the rejection says %q usable, the nodes table %q; want both 22.3 GiB\n%s\n%s", m[1], row[col], rejection, out.String())
	}
}
