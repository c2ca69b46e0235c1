package hub

import (
	"strings"
	"testing"

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
		wantErr string // "" = admitted
	}{
		{name: "Linux GPU with room", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 1 * gib, GPUs: []fleet.GPU{{MemFreeMiB: 4096}}}}},
		{name: "Linux GPU too full: GPU memory counts, not RAM", model: model,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 64 * gib, GPUs: []fleet.GPU{{MemFreeMiB: 2048}}}},
			wantErr: "memory: qwen3-4b needs 3.0 GB but n has 2.0 GB usable (free GPU memory)"},
		{name: "Linux CPU node uses available RAM", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}}},
		{name: "Mac counts three quarters of free memory", model: model,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin", MemFreeBytes: 3 * gib}},
			wantErr: "has 2.2 GB usable (three quarters of free + inactive + speculative memory)"},
		{name: "Mac with room", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin", MemFreeBytes: 8 * gib}}},
		{name: "model without a memory figure is not checked", model: fleet.Model{ID: "qwen3-4b"},
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin"}}},
		{name: "node never probed is not judged", model: model, node: fleet.Node{Name: "n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkMemory(worker, tt.model, tt.node)
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
