package hub

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"fleet"
)

// A viewer's flood of refused commands (42,521 in 20 s wrote 42,521 audit
// lines, ~1.9 GB an hour, until an operator's drain could not write its
// own) leaves the audit log bounded: one line per user and action a minute
// with a count, the flooder's commands refused once past
// MaxRefusalsPerMinute, and a size cap that drops refusals before actions.
// Through it all an operator's drain works and is audited.
func TestRefusalFloodLeavesAuditBounded(t *testing.T) {
	h, actors := seededHub(t)
	vic, olga := actors["vic"], actors["olga"]
	now := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	h.guard.refused.now = func() time.Time { return now }
	exec := func(u fleet.User, args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := h.Exec(t.Context(), u, args, nil, &out, &errOut)
		return code, out.String() + errOut.String()
	}

	mark := lastAuditID(t, h)
	floods := [][]string{{"drain", ultraWorker}, {"stop", "all"}, {"logs", ultraWorker}, {"user", "list"}}
	const flood = 5000
	for i := range flood {
		if code, out := exec(vic, floods[i%len(floods)]...); code == 0 {
			t.Fatalf("a viewer's %q went through: %s", floods[i%len(floods)], out)
		}
		now = now.Add(time.Millisecond) // 5 s of flood: within one window
	}
	rows := auditRead(t, h, actors["ada"], mark)
	if len(rows) > len(floods) {
		t.Errorf("%d refusals wrote %d audit lines; want at most one per action (%d)", flood, len(rows), len(floods))
	}
	total := 0
	for _, r := range rows {
		if r.User != vic.Name || !strings.HasPrefix(r.Outcome, "denied") {
			t.Errorf("unexpected audit line %+v", r)
		}
		total += r.Count
	}
	if total != flood {
		t.Errorf("the audit lines count %d refusals, want all %d: %+v", total, flood, rows)
	}

	// Past the limit the flooder gets nothing through, not even a read.
	if code, out := exec(vic, "workers"); code == 0 || !strings.Contains(out, "too many refused commands") || strings.Contains(out, "STARTED WITH") {
		t.Errorf("a viewer past %d refusals a minute listed the workers (exit %d):\n%s", MaxRefusalsPerMinute, code, out)
	}
	// Another user is not held back, and their action is audited.
	mark = lastAuditID(t, h)
	if code, out := exec(olga, "drain", ultraWorker); code != 0 {
		t.Fatalf("the operator's drain during the flood: exit %d: %s", code, out)
	}
	if w := workerView(t, h, ultraWorker); !w.Drained {
		t.Errorf("the operator's drain did not happen: %+v", w)
	}
	if a := auditRead(t, h, actors["ada"], mark); len(a) != 1 || a[0].User != olga.Name || a[0].Action != "drain" || a[0].Outcome != "ok" {
		t.Errorf("the operator's drain is audited as %+v, want one ok line", a)
	}
	// The window over, the viewer reads again.
	now = now.Add(refusalWindow)
	if code, out := exec(vic, "workers"); code != 0 || !strings.Contains(out, "STARTED WITH") {
		t.Errorf("the viewer cannot list the workers a window later (exit %d):\n%s", code, out)
	}

	// A refusal a minute for an hour: one line each, until the cap, which
	// prunes refusals before the operator's drain.
	h.pruner.auditMaxRows = 20
	for range 60 {
		now = now.Add(refusalWindow)
		exec(vic, "drain", ultraWorker)
	}
	h.pruner.once(t.Context(), now)
	all := auditRead(t, h, actors["ada"], 0)
	if len(all) > 20 {
		t.Errorf("the audit log holds %d lines past its cap of 20", len(all))
	}
	var drainKept, newestKept bool
	for _, a := range all {
		drainKept = drainKept || (a.User == olga.Name && a.Action == "drain" && a.Outcome == "ok")
		newestKept = newestKept || (a.User == vic.Name && a.At.Equal(now))
	}
	if !drainKept || !newestKept {
		t.Errorf("the cap dropped the operator's drain (kept: %v) or the newest refusal (kept: %v): %+v", drainKept, newestKept, all)
	}
}

// auditRead is the audit log after line after, as `fleet audit` reads it
// (with the counts of repeats still going on).
func auditRead(t *testing.T, h *Hub, u fleet.User, after int64) []fleet.AuditEntry {
	t.Helper()
	all, err := h.admin.Audit(t.Context(), u, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []fleet.AuditEntry
	for _, a := range all {
		if a.ID > after {
			out = append(out, a)
		}
	}
	return out
}
