package hub

import (
	"errors"
	"strings"
	"testing"

	"fleet"
	"fleet/console"
)

// TestActionTableByRole: every action of the table, asked for by every
// kind of user, is allowed exactly when the user's role reaches the table's,
// and a refusal is audited naming the role it needs.
func TestActionTableByRole(t *testing.T) {
	h, actors := seededHub(t)
	for _, a := range fleet.Actions() {
		for _, name := range []string{viewer.Name, operator.Name, admin.Name, nobody.Name, stranger.Name} {
			u := actors[name]
			t.Run(string(a.Name)+"/"+name, func(t *testing.T) {
				mark := lastAuditID(t, h)
				ran := false
				err := h.guard.do(u, a.Name, "ultra", func() (string, error) { ran = true; return "", nil })
				audited := auditSince(t, h, mark)
				want := map[fleet.Role]int{fleet.RoleViewer: 1, fleet.RoleOperator: 2, fleet.RoleAdmin: 3}
				if allowed := want[u.Role] >= want[a.Role]; !allowed {
					if err == nil || ran || !strings.Contains(err.Error(), "needs the "+string(a.Role)+" role") {
						t.Fatalf("%s by %s (%q): ran=%v, err=%v; want refused, naming the %s role", a.Name, u.Name, u.Role, ran, err, a.Role)
					}
					if len(audited) != 1 || audited[0].Action != string(a.Name) || audited[0].User != u.Name || audited[0].Outcome != "denied: needs "+string(a.Role) {
						t.Errorf("audit after the refusal = %+v, want one \"denied: needs %s\" line", audited, a.Role)
					}
					return
				}
				if err != nil || !ran {
					t.Fatalf("%s by %s (%q): ran=%v, err=%v; want it run", a.Name, u.Name, u.Role, ran, err)
				}
				switch {
				case a.Audited && (len(audited) != 1 || audited[0].Action != string(a.Name) || audited[0].Outcome != "ok"):
					t.Errorf("audit after %s = %+v, want one ok line", a.Name, audited)
				case !a.Audited && len(audited) != 0:
					t.Errorf("%s is a read, yet it wrote %+v", a.Name, audited)
				}
			})
		}
	}
}

// TestActionOutsideTheTableIsRefused: deny by default. An action nobody put
// in the table does not run, not even for an admin, and the refusal is
// audited.
func TestActionOutsideTheTableIsRefused(t *testing.T) {
	h, _ := seededHub(t)
	mark := lastAuditID(t, h)
	ran := false
	err := h.guard.do(admin, "frobnicate", "ultra", func() (string, error) { ran = true; return "", nil })
	if ran || err == nil || !strings.Contains(err.Error(), "not in the hub's action table") {
		t.Fatalf("frobnicate by an admin: ran=%v, err=%v; want it refused as outside the table", ran, err)
	}
	if a := auditSince(t, h, mark); len(a) != 1 || a[0].Action != "frobnicate" || a[0].User != admin.Name || a[0].Outcome != "denied: not in the action table" {
		t.Errorf("audit after frobnicate = %+v, want one denied line", a)
	}
	// The command tree's entry point refuses it the same way.
	if err := h.Authorize(t.Context(), admin, "frobnicate", "ultra"); err == nil {
		t.Error("Authorize let an admin do an action outside the table")
	}
}

// TestDoAuditsHowActionsEnd: an audited action's line says how it ended; a
// read leaves a line only when it fails.
func TestDoAuditsHowActionsEnd(t *testing.T) {
	h, _ := seededHub(t)
	boom := errors.New("boom")
	tests := []struct {
		action fleet.ActionName
		note   string
		err    error
		want   string // the outcome of the one line, "" = no line
	}{
		{"drain", "", nil, "ok"},
		{"node trust", "was none pinned", nil, "ok (was none pinned)"},
		{"drain", "", boom, "failed: boom"},
		{"workers", "", nil, ""},
		{"key list", "", boom, "failed: boom"},
	}
	for _, tt := range tests {
		mark := lastAuditID(t, h)
		err := h.guard.do(admin, tt.action, "ultra", func() (string, error) { return tt.note, tt.err })
		if !errors.Is(err, tt.err) {
			t.Errorf("%s: do returned %v, want %v", tt.action, err, tt.err)
		}
		a := auditSince(t, h, mark)
		switch {
		case tt.want == "" && len(a) != 0:
			t.Errorf("%s: wrote %+v, want no line", tt.action, a)
		case tt.want != "" && (len(a) != 1 || a[0].Outcome != tt.want):
			t.Errorf("%s: wrote %+v, want one line with outcome %q", tt.action, a, tt.want)
		}
	}
}

// TestEveryActionRunsSomewhere: each per-worker action of the table has
// what it does to a worker in Act (and nothing else gets there), and each
// action the console's keys ask for is one the console's Source answers: a
// viewer's press is refused by role and audited, never "unknown action".
// An action added to the table or the keymap and not here fails.
func TestEveryActionRunsSomewhere(t *testing.T) {
	h, _ := seededHub(t)
	for _, a := range fleet.Actions() {
		if _, ok := h.workerOp(a.Name); ok != a.PerWorker {
			t.Errorf("%s: Act runs it = %v, the table says per worker = %v", a.Name, ok, a.PerWorker)
		}
	}
	src := h.ConsoleSource(viewer)
	for _, kind := range console.Actions() {
		mark := lastAuditID(t, h)
		_, err := src.Do(t.Context(), console.Action{Kind: kind, Targets: []string{ultraWorker}})
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("console %s by a viewer: err = %v, want permission denied", kind, err)
		}
		if a := auditSince(t, h, mark); len(a) != 1 || a[0].Action != string(kind) {
			t.Errorf("console %s by a viewer audited %+v, want one line for %s", kind, a, kind)
		}
	}
}
