package store

import (
	"context"
	"testing"
	"time"

	"fleet"
)

// PruneHistory deletes request samples, usage minutes and events older than
// the cut, in batches, and keeps bench samples, newer rows and the audit log.
func TestPruneHistory(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		cut := time.Now().Add(-30 * 24 * time.Hour).Truncate(time.Minute)
		old, recent := cut.Add(-time.Hour), cut.Add(time.Hour)

		// More old request samples than one batch deletes, so the loop is seen.
		var samples []fleet.Sample
		for i := range pruneBatch + 7 {
			samples = append(samples, fleet.Sample{Worker: "rig/m", At: old.Add(-time.Duration(i) * time.Millisecond), Kind: "request"})
		}
		samples = append(samples,
			fleet.Sample{Worker: "rig/m", At: recent, Kind: "request"},
			fleet.Sample{Worker: "rig/m", At: old, Kind: "bench", Detail: "c=1"})
		if err := s.AddSamples(ctx, samples); err != nil {
			t.Fatal(err)
		}
		if err := s.AddUsage(ctx, []fleet.Usage{
			{Bucket: old, Key: "ci", Model: "m", Worker: "rig/m", Requests: 1},
			{Bucket: recent, Key: "ci", Model: "m", Worker: "rig/m", Requests: 2},
		}); err != nil {
			t.Fatal(err)
		}
		for _, e := range []fleet.Event{{At: old, Level: "info", Subject: "rig/m", Message: "old"}, {At: recent, Level: "info", Subject: "rig/m", Message: "recent"}} {
			if _, err := s.AddEvent(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddAudit(ctx, fleet.AuditEntry{At: old, User: "ada", Action: "drain", Target: "rig", Outcome: "ok"}); err != nil {
			t.Fatal(err)
		}

		p, err := s.PruneHistory(ctx, cut)
		if err != nil {
			t.Fatal(err)
		}
		if want := (Pruned{Samples: pruneBatch + 7, Usage: 1, Events: 1}); p != want {
			t.Errorf("PruneHistory = %+v, want %+v", p, want)
		}
		left, err := s.Samples(ctx, "", time.Time{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]int{}
		for _, sm := range left {
			kinds[sm.Kind]++
		}
		if len(left) != 2 || kinds["request"] != 1 || kinds["bench"] != 1 {
			t.Errorf("left samples by kind %v, want the recent request and the old bench one", kinds)
		}
		us, err := s.Usage(ctx, time.Time{}, UsageByKey)
		if err != nil {
			t.Fatal(err)
		}
		if len(us) != 1 || us[0].Requests != 2 {
			t.Errorf("left usage %+v, want the recent minute only (2 requests)", us)
		}
		evs, err := s.Events(ctx, "", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].Message != "recent" {
			t.Errorf("left events %+v, want the recent one", evs)
		}
		audit, err := s.Audit(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(audit) != 1 {
			t.Errorf("the audit log lost lines to a prune: %+v", audit)
		}
		// Nothing left to prune: a second run deletes nothing.
		if p, err := s.PruneHistory(ctx, cut); err != nil || p != (Pruned{}) {
			t.Errorf("second prune = %+v, %v; want nothing", p, err)
		}
	})
}
