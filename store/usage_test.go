package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"fleet"
)

// Usage added in batches sums per minute bucket, and totals group by key,
// model or worker from the start of --since's minute.
func TestUsageBucketsAndTotals(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		t0 := time.Date(2026, 11, 30, 12, 0, 10, 0, time.UTC)
		add := func(at time.Time, key, worker string, prompt, cached, completion int64) fleet.Usage {
			return fleet.Usage{Bucket: at, Key: key, Model: "qwen3-4b", Worker: worker, Requests: 1,
				PromptTokens: prompt, CachedTokens: cached, CompletionTokens: completion}
		}
		// Two batches into the same minute add up in one row.
		if err := s.AddUsage(ctx, []fleet.Usage{add(t0, "alice", "rig/qwen3-4b", 100, 40, 10), add(t0.Add(30*time.Second), "bob", "ultra/qwen3-4b", 5, 0, 5)}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddUsage(ctx, []fleet.Usage{add(t0.Add(20*time.Second), "alice", "rig/qwen3-4b", 200, 100, 20), add(t0.Add(-2*time.Hour), "alice", "rig/qwen3-4b", 1000, 0, 1000)}); err != nil {
			t.Fatal(err)
		}
		var rows int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM usage`).Scan(&rows); err != nil || rows != 3 {
			t.Fatalf("usage holds %d rows (%v), want 3: one per minute, key, model and worker", rows, err)
		}
		byKey, err := s.Usage(ctx, t0.Add(-time.Hour), UsageByKey)
		if err != nil {
			t.Fatal(err)
		}
		want := []fleet.Usage{
			{Key: "alice", Requests: 2, PromptTokens: 300, CachedTokens: 140, CompletionTokens: 30},
			{Key: "bob", Requests: 1, PromptTokens: 5, CompletionTokens: 5},
		}
		if !reflect.DeepEqual(byKey, want) {
			t.Errorf("usage by key = %+v, want %+v", byKey, want)
		}
		byWorker, err := s.Usage(ctx, time.Time{}, UsageByWorker)
		if err != nil || len(byWorker) != 2 || byWorker[0].Worker != "rig/qwen3-4b" || byWorker[0].Requests != 3 {
			t.Errorf("usage by worker = %+v, %v", byWorker, err)
		}
		if _, err := s.Usage(ctx, t0, "colour"); err == nil || !strings.Contains(err.Error(), "key, model or worker") {
			t.Errorf("grouping by colour: %v", err)
		}
		tokens, err := s.KeyTokensSince(ctx, t0.Truncate(24*time.Hour))
		if err != nil || tokens["alice"] != 2330 || tokens["bob"] != 10 {
			t.Errorf("tokens today = %v, %v", tokens, err)
		}
		if err := s.AddUsage(ctx, []fleet.Usage{{Key: "x", Model: "m"}}); err == nil {
			t.Error("a row without time or worker was stored")
		}
	})
}

func TestAPIKeyLimits(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if _, err := s.CreateAPIKey(ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		if err := s.SetAPIKeyLimits(ctx, "ci", fleet.KeyLimits{RequestsPerMinute: 60, TokensPerDay: 100000}); err != nil {
			t.Fatal(err)
		}
		keys, err := s.APIKeys(ctx)
		if err != nil || len(keys) != 1 || keys[0].RequestsPerMinute != 60 || keys[0].TokensPerDay != 100000 {
			t.Fatalf("keys = %+v, %v", keys, err)
		}
		if err := s.SetAPIKeyLimits(ctx, "ci", fleet.KeyLimits{RequestsPerMinute: -1}); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("a negative limit: %v", err)
		}
		if err := s.SetAPIKeyLimits(ctx, "ghost", fleet.KeyLimits{RequestsPerMinute: 1}); !errors.Is(err, ErrNotFound) {
			t.Errorf("limits of a missing key: %v", err)
		}
		if keys, _ := s.APIKeys(ctx); keys[0].RequestsPerMinute != 60 {
			t.Errorf("a refused change changed the limits: %+v", keys[0])
		}
	})
}

// Each key's last minute of use and its requests since the day's start,
// for `fleet key list`; a key never used is absent, and usage without a key
// (the router taking none) names no key.
func TestKeyActivity(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		today := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
		row := func(at time.Time, key string, requests int64) fleet.Usage {
			return fleet.Usage{Bucket: at, Key: key, Model: "qwen3-4b", Worker: "rig/qwen3-4b", Requests: requests, PromptTokens: 1}
		}
		if err := s.AddUsage(ctx, []fleet.Usage{
			row(today.Add(-3*time.Hour), "alice", 7),
			row(today.Add(9*time.Hour+30*time.Second), "alice", 2),
			row(today.Add(14*time.Hour+5*time.Minute+59*time.Second), "alice", 3),
			row(today.Add(-26*time.Hour), "bob", 4),
			row(today.Add(time.Hour), "", 9),
		}); err != nil {
			t.Fatal(err)
		}
		got, err := s.KeyActivity(ctx, today)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]KeyActivity{
			"alice": {LastUsed: today.Add(14*time.Hour + 5*time.Minute), RequestsToday: 5},
			"bob":   {LastUsed: today.Add(-26 * time.Hour), RequestsToday: 0},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("key activity = %+v, want %+v", got, want)
		}
	})
}

// A batch may hold one minute, key, model and worker twice (and more rows
// than one statement takes): each counts once, and two hubs' usage of one
// minute, key, model and worker adds up.
func TestUsageBatchesSumAndHubsAddUp(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		a, b := db.openTest(t), db.openTest(t)
		a.SetAuditOrigin("hub-a", "1")
		b.SetAuditOrigin("hub-b", "1")
		t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
		var batch []fleet.Usage
		for i := range 2*maxRowsPerInsert + 1 {
			batch = append(batch, fleet.Usage{Bucket: t0.Add(time.Duration(i%3) * time.Second), Key: fmt.Sprint("key", i%(maxRowsPerInsert+7)),
				Model: "qwen3-4b", Worker: "rig/qwen3-4b", Requests: 1, PromptTokens: 2})
		}
		if err := a.AddUsage(ctx, batch); err != nil {
			t.Fatal(err)
		}
		if err := b.AddUsage(ctx, batch[:1]); err != nil {
			t.Fatal(err)
		}
		byModel, err := a.Usage(ctx, t0, UsageByModel)
		want := []fleet.Usage{{Model: "qwen3-4b", Requests: int64(len(batch) + 1), PromptTokens: int64(2 * (len(batch) + 1))}}
		if err != nil || !reflect.DeepEqual(byModel, want) {
			t.Errorf("usage by model = %+v, %v; want %+v", byModel, err, want)
		}
		var rows int
		if err := a.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM usage WHERE key = 'key0'`).Scan(&rows); err != nil || rows != 2 {
			t.Errorf("key0's minute has %d rows (%v), want 2: one per hub", rows, err)
		}
	})
}
