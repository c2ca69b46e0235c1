package hub

import (
	"testing"
	"time"

	"fleet"
)

// The hub prunes events (and request samples, usage minutes) older than its
// retention: 30 days unless set; a negative retention keeps everything.
func TestPruneByRetention(t *testing.T) {
	now := time.Now()
	ages := []time.Duration{2 * time.Hour, 29 * 24 * time.Hour, 31 * 24 * time.Hour}
	tests := []struct {
		name      string
		retention time.Duration
		wantLeft  int // of the three events above, youngest first
	}{
		{"default 30 days", 0, 2},
		{"one hour", time.Hour, 0},
		{"a week", 7 * 24 * time.Hour, 1},
		{"negative keeps all", -1, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub(t, Options{Retention: tt.retention, AuditMaxRows: -1})
			base, err := h.store.Events(t.Context(), "", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, age := range ages {
				if _, err := h.store.AddEvent(t.Context(), fleet.Event{At: now.Add(-age), Level: "info", Subject: "retention-test", Message: age.String()}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.retention >= 0 {
				h.pruner.once(t.Context(), now)
			} else {
				// The loop itself: with a negative retention it returns
				// at once without pruning (a positive one would block).
				h.pruner.run(t.Context(), time.Hour)
			}
			evs, err := h.store.Events(t.Context(), "retention-test", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != tt.wantLeft {
				t.Errorf("%d of the test's events left, want %d: %+v", len(evs), tt.wantLeft, evs)
			}
			if all, _ := h.store.Events(t.Context(), "", 0, 0); len(all)-len(evs) != len(base) {
				t.Errorf("the hub's own recent events were pruned: %d before, %d after", len(base), len(all)-len(evs))
			}
		})
	}
}
