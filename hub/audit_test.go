package hub

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"fleet"
)

// failAuditInserts makes every new audit row fail the way a full disk
// fails it, until the returned func is called. It is a trigger on the
// hub's own database file, installed through a second connection as any
// other SQLite client could: only audit inserts fail, so the one thing
// that stops the action is that its audit line could not be written.
// (A really full disk needs a small file system mounted for the test, which
// needs root; the trigger fails the same INSERT anywhere, and leaves the
// other writes working, which is the harder case for the hub.)
func failAuditInserts(t *testing.T, h *Hub) (restore func()) {
	t.Helper()
	db, err := sql.Open("sqlite3", h.store.Path()+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TRIGGER audit_disk_full BEFORE INSERT ON audit
		BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := db.Exec(`DROP TRIGGER audit_disk_full`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestActionWithoutAuditDoesNotHappen: a drain whose audit row could not be
// written returned 1, yet the worker went to draining. Every audited action
// now writes its line first, and does nothing when it cannot.
func TestActionWithoutAuditDoesNotHappen(t *testing.T) {
	h, actors := seededHub(t)
	ctx := t.Context()
	op, ad := actors["olga"], actors["ada"]
	keyLine := testKey(t, "newbie@test")
	actions := []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"drain", func(ctx context.Context) error { _, err := h.Act(ctx, op, "drain", []string{"ultra"}); return err }},
		{"stop", func(ctx context.Context) error { _, err := h.Act(ctx, op, "stop", []string{"ultra"}); return err }},
		{"apply", func(ctx context.Context) error {
			_, err := h.Apply(ctx, ad, "fleet.yaml", withoutMax(t), false)
			return err
		}},
		{"user add", func(ctx context.Context) error {
			return h.admin.AddUser(ctx, ad, fleet.User{Name: "newbie", Role: fleet.RoleViewer, PublicKey: keyLine})
		}},
		{"user rm", func(ctx context.Context) error { return h.admin.RemoveUser(ctx, ad, "vic") }},
		{"key create", func(ctx context.Context) error { _, err := h.admin.CreateKey(ctx, ad, "ci2"); return err }},
		{"key revoke", func(ctx context.Context) error { return h.admin.RevokeKey(ctx, ad, "ci") }},
		{"node trust", func(ctx context.Context) error { _, err := h.TrustNode(ctx, ad, "ultra"); return err }},
	}
	before := state(t, h)
	restore := failAuditInserts(t, h)
	for _, a := range actions {
		err := a.do(ctx)
		if err == nil || !strings.Contains(err.Error(), "audit line could not be written") || !strings.Contains(err.Error(), "nothing was changed") {
			t.Errorf("%s with the audit failing: %v; want a refusal saying the audit line could not be written", a.name, err)
		} else if !strings.Contains(err.Error(), h.store.Path()) {
			// On PostgreSQL "the database in the data dir" sent operators
			// to a directory that holds no database.
			t.Errorf("%s with the audit failing: %v; want the refusal to name the database, %s", a.name, err, h.store.Path())
		}
		if after := state(t, h); after != before {
			t.Errorf("%s happened although its audit line could not be written:\nbefore:\n%s\nafter:\n%s", a.name, before, after)
			before = after
		}
	}
	// Restored workers show starting until their engines are checked; the
	// drain flag is what a drain changes.
	if snap := workerView(t, h, ultraWorker); snap.State == fleet.WorkerDraining || snap.Drained {
		t.Errorf("ultra is %s (drained %v) after a refused drain, want it not drained", snap.State, snap.Drained)
	}

	// With the audit writable again, the drain happens and its line ends ok.
	restore()
	from := lastAuditID(t, h)
	if _, err := h.Act(ctx, op, "drain", []string{"ultra"}); err != nil {
		t.Fatal(err)
	}
	if got := auditSince(t, h, from); len(got) != 1 || got[0].Action != "drain" || got[0].Target != ultraWorker || got[0].Outcome != "ok" {
		t.Errorf("audit after the drain: %+v, want one drain of %s ending ok", got, ultraWorker)
	}
	if snap := workerView(t, h, ultraWorker); !snap.Drained {
		t.Errorf("ultra is %s, not drained, after the drain", snap.State)
	}
}

func workerView(t *testing.T, h *Hub, name string) fleet.WorkerView {
	t.Helper()
	for _, w := range h.snapshot(t.Context()).Workers {
		if w.Name() == name {
			return w
		}
	}
	t.Fatalf("no worker %s", name)
	return fleet.WorkerView{}
}

// TestAuditRowsAreBounded: a viewer's `drain <120 KB>` stored 120,000-byte
// audit rows (the target, and the error quoting it).
func TestAuditRowsAreBounded(t *testing.T) {
	h, actors := seededHub(t)
	long := strings.Repeat("x", 120_000)
	from := lastAuditID(t, h)
	for _, u := range []fleet.User{actors["vic"], actors["olga"]} {
		if _, err := h.Act(t.Context(), u, "drain", []string{long}); err == nil {
			t.Fatalf("%s drained a worker named 120 KB of x", u.Name)
		}
	}
	rows := auditSince(t, h, from)
	if len(rows) != 2 {
		t.Fatalf("audit rows %d, want the viewer's denial and the operator's failure", len(rows))
	}
	for _, r := range rows {
		if n := len(r.User) + len(r.Action) + len(r.Target) + len(r.Outcome); n > 1024 {
			t.Errorf("an audit row of %d bytes (target %d, outcome %d): %.80s…", n, len(r.Target), len(r.Outcome), r.Target)
		}
		if !strings.Contains(r.Target, "more bytes)") {
			t.Errorf("the clipped target %.80q does not say it was clipped", r.Target)
		}
	}
}
