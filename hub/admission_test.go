package hub

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/hub/admission"
	"fleet/nodes"
)

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
	_, rejection := admission.CheckMemory(fleet.Worker{Node: "rig", Model: "big"}, fleet.Model{ID: "big", MemoryGB: 30}, node, nodes.Held{})
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
