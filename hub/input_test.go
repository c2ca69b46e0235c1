package hub

import (
	"slices"
	"strings"
	"testing"

	"fleet"
	"fleet/fleetfile"
)

// withoutMax is the demo fleet minus node max: a valid file that changes
// the fleet, for the tests that must see a change happen or not happen.
func withoutMax(t *testing.T) []byte {
	t.Helper()
	s := string(fleetfile.Demo)
	for old, repl := range map[string]string{
		"  - name: max\n    address: sim:m4max-llamacpp\n": "",
		"nodes: [rig, ultra, max]":                         "nodes: [rig, ultra]",
	} {
		if strings.Count(s, old) != 1 {
			t.Fatalf("the demo fleet changed: %q is not in it once", old)
		}
		s = strings.Replace(s, old, repl, 1)
	}
	return []byte(s)
}

// ownedFlagFleet is the demo fleet whose llama.cpp recipe passes -c, the
// context flag fleet sets itself: the parser refuses it at its line.
func ownedFlagFleet(t *testing.T) string {
	t.Helper()
	old := `args: [-ngl, "99",`
	if !strings.Contains(string(fleetfile.Demo), old) {
		t.Fatalf("the demo fleet changed: %q is not in it", old)
	}
	return strings.Replace(string(fleetfile.Demo), old, `args: [-c, "4096", -ngl, "99",`, 1)
}

// hubNodes is what the running hub (not only the store) believes the nodes are.
func hubNodes(h *Hub) []string {
	h.state.mu.Lock()
	defer h.state.mu.Unlock()
	var names []string
	for name := range h.state.nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// TestApplyLosesNothing: a fleet file arrives over `ssh hub apply` from a
// hand-edited YAML; a typo or a dry run must leave the declared fleet as it
// was, and a syntax error must point at the line to fix.
func TestApplyLosesNothing(t *testing.T) {
	tests := []struct {
		name   string
		data   string
		dryRun bool
		// wantErr is a substring of the error ("" = Apply succeeds).
		wantErr string
		// wantPlan is a substring of the plan printed on success.
		wantPlan string
		changes  bool
	}{
		{name: "unclosed flow sequence", data: "nodes: [rig\n", wantErr: "bad.yaml:1: not valid YAML"},
		{name: "tab indentation", data: "nodes:\n\t- name: rig\n", wantErr: "bad.yaml:2: not valid YAML"},
		{name: "unclosed flow mapping", data: "nodes:\n  - name: rig\n    address: sim:rtx3060-vllm\nmodels: {\n", wantErr: "bad.yaml:4: not valid YAML"},
		{name: "unterminated string", data: "nodes: \"rig\n", wantErr: "bad.yaml:1: not valid YAML"},
		{name: "misspelt key", data: "nodes:\n  - name: rig\n    address: sim:rtx3060-vllm\n    adress: x\n", wantErr: "bad.yaml:4: node rig: unknown key 'adress'"},
		{name: "two documents", data: "nodes: []\n---\nmodels: []\n", wantErr: "bad.yaml:3:"},
		{name: "bad node name", data: "nodes:\n  - name: Rig!\n    address: sim:rtx3060-vllm\n", wantErr: "bad.yaml:2: node Rig!"},
		{name: "malformed dry run", data: "nodes: [rig\n", dryRun: true, wantErr: "bad.yaml:1: not valid YAML"},
		{name: "dry run of a real change", data: string(withoutMax(t)), dryRun: true, wantPlan: "max"},
		{name: "dry run of no change", data: string(fleetfile.Demo), dryRun: true, wantPlan: "no changes"},
		// A dry run refuses what the launcher would refuse, as apply does.
		{name: "dry run of a flag fleet sets", data: ownedFlagFleet(t), dryRun: true, wantErr: "bad.yaml:27: model qwen3-4b: recipe llamacpp: args pass -c, which fleet sets itself"},
		{name: "apply of a flag fleet sets", data: ownedFlagFleet(t), wantErr: "bad.yaml:27: model qwen3-4b: recipe llamacpp: args pass -c, which fleet sets itself"},
		// The control: the same change applied for real does show up, so
		// the comparisons above can see one.
		{name: "applied change", data: string(withoutMax(t)), wantPlan: "max", changes: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHub(t, Options{})
			ctx := t.Context()
			before, err := h.Export(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			nodesBefore := hubNodes(h)
			mark := lastAuditID(t, h)

			plan, err := h.Apply(ctx, admin, "bad.yaml", []byte(tt.data), tt.dryRun)

			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Apply(%q) = %q, %v; want an error saying %q", tt.data, plan, err, tt.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("Apply(%q): %v", tt.data, err)
				}
				if !strings.Contains(plan, tt.wantPlan) {
					t.Errorf("Apply(%q) printed %q, want it to mention %q", tt.data, plan, tt.wantPlan)
				}
			}
			after, err := h.Export(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			if changed := string(after) != string(before); changed != tt.changes {
				t.Errorf("stored fleet changed: %v, want %v\nbefore:\n%s\nafter:\n%s", changed, tt.changes, before, after)
			}
			if changed := !slices.Equal(hubNodes(h), nodesBefore); changed != tt.changes {
				t.Errorf("the hub's nodes went from %v to %v; changed: %v, want %v", nodesBefore, hubNodes(h), changed, tt.changes)
			}

			// A failure is audited with the reason; a dry run that worked is not worth a line.
			audited := auditSince(t, h, mark)
			switch {
			case tt.wantErr != "":
				if len(audited) != 1 || !strings.HasPrefix(audited[0].Outcome, "failed: ") || audited[0].Target != "bad.yaml" {
					t.Errorf("audit after a failed apply = %+v, want one failed line for bad.yaml", audited)
				}
			case tt.dryRun:
				if len(audited) != 0 {
					t.Errorf("a dry run was audited: %+v", audited)
				}
			default:
				if len(audited) != 1 || audited[0].Outcome != "ok" || audited[0].Action != "apply" {
					t.Errorf("audit after an apply = %+v, want one ok apply line", audited)
				}
			}
		})
	}
}

// TestActUnknownNames: drain, undrain and restart take names an operator
// types; a typo must change nothing, even next to a good name, and the
// error must offer the names that would have worked.
func TestActUnknownNames(t *testing.T) {
	tests := []struct {
		name    string
		kind    fleet.ActionName
		targets []string
		wantErr string // "" = succeeds
		// drained is which workers carry the drain flag afterwards.
		drained []string
	}{
		{name: "unknown worker", kind: "drain", targets: []string{"nope"}, wantErr: `no worker or node named "nope"; ` + knownWorkers},
		{name: "unknown model on a known node", kind: "drain", targets: []string{"ultra/llama"}, wantErr: `no worker or node named "ultra/llama"; ` + knownWorkers},
		{name: "typo next to a good name", kind: "drain", targets: []string{"ultra", "nope"}, wantErr: `no worker or node named "nope"; ` + knownWorkers},
		{name: "undrain unknown", kind: "undrain", targets: []string{"nope"}, wantErr: knownWorkers},
		{name: "restart unknown", kind: "restart", targets: []string{"nope"}, wantErr: knownWorkers},
		{name: "declared node without workers", kind: "drain", targets: []string{"rig"}, wantErr: `node "rig" has no workers yet; place a model on it in the fleet file (` + knownWorkers + ")"},
		{name: "unknown action", kind: "halt", targets: []string{"ultra"}, wantErr: `unknown action "halt": use drain, undrain, restart, stop or start`},
		// The controls: good names do reach the workers.
		{name: "node name", kind: "drain", targets: []string{"ultra"}, drained: []string{ultraWorker}},
		{name: "worker name", kind: "drain", targets: []string{maxWorker}, drained: []string{maxWorker}},
		{name: "node and its worker", kind: "drain", targets: []string{"ultra", ultraWorker, "max"}, drained: []string{maxWorker, ultraWorker}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, actors := seededHub(t)
			msg, err := h.Act(t.Context(), actors[operator.Name], tt.kind, tt.targets)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Act(%s, %q) = %q, %v; want an error saying %q", tt.kind, tt.targets, msg, err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Act(%s, %q): %v", tt.kind, tt.targets, err)
			}

			stored, err := h.store.Workers(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var drained []string
			for _, w := range stored {
				if w.Drained {
					drained = append(drained, w.Name())
				}
			}
			if !slices.Equal(drained, tt.drained) {
				t.Errorf("after Act(%s, %q) the drained workers are %v, want %v", tt.kind, tt.targets, drained, tt.drained)
			}
			snap := h.snapshot(t.Context())
			for _, w := range snap.Workers {
				want := slices.Contains(tt.drained, w.Name())
				// Restored workers are starting until checked, so only a
				// ready one would show as draining; none may show it wrongly.
				if w.Drained != want || (w.State == fleet.WorkerDraining && !want) {
					t.Errorf("the hub shows %s drained=%v state=%s, want drained=%v", w.Name(), w.Drained, w.State, want)
				}
			}
		})
	}
}

// A failing nvidia-smi's output reaches the hub quoted in the node's
// GPUError: it is sanitized as the GPU names are.
func TestSanitizeNodeGPUErrorAndNotes(t *testing.T) {
	n := sanitizeNode(fleet.Node{Name: "rig", Platform: &fleet.Platform{
		GPUError: "nvidia-smi failed (exit status 18): \x1b]0;owned\x07mismatch",
		Notes:    []string{"note \x1b[2J"},
	}})
	for _, s := range append([]string{n.Platform.GPUError}, n.Platform.Notes...) {
		if strings.ContainsRune(s, '\x1b') || strings.ContainsRune(s, '\x07') {
			t.Errorf("%q still holds terminal control characters", s)
		}
	}
}
