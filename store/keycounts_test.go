package store

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestKeyCounts(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		m0 := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
		m1 := m0.Add(time.Minute)
		if err := s.PublishKeyCounts(ctx, []KeyCount{
			{Minute: m0, Hub: "a", Key: "ci", Requests: 3, Tokens: 30},
			{Minute: m1.Add(20 * time.Second), Hub: "a", Key: "ci", Requests: 1, Tokens: 10},
			{Minute: m1, Hub: "b", Key: "ci", Requests: 2, Tokens: 20},
			{Minute: m1, Hub: "b", Key: "", Requests: 0},
		}); err != nil {
			t.Fatal(err)
		}
		// A total replaces the one before, so a retried publish counts once.
		if err := s.PublishKeyCounts(ctx, []KeyCount{{Minute: m1, Hub: "a", Key: "ci", Requests: 5, Tokens: 50}}); err != nil {
			t.Fatal(err)
		}
		got, err := s.KeyCountsSince(ctx, "b", m1.Add(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		want := []KeyCount{{Minute: m1, Hub: "a", Key: "ci", Requests: 5, Tokens: 50}}
		if !slices.Equal(got, want) {
			t.Fatalf("hub b reads %+v since %s, want %+v (only a's, of that minute on, the last total)", got, m1, want)
		}
		got, err = s.KeyCountsSince(ctx, "a", m0)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(x, y KeyCount) int { return strings.Compare(x.Key, y.Key) })
		if want := []KeyCount{{Minute: m1, Hub: "b", Key: ""}, {Minute: m1, Hub: "b", Key: "ci", Requests: 2, Tokens: 20}}; !slices.Equal(got, want) {
			t.Fatalf("hub a reads %+v, want %+v", got, want)
		}
		if n, err := s.PruneKeyCounts(ctx, m1); err != nil || n != 1 {
			t.Fatalf("pruning before %s deleted %d rows (%v), want 1", m1, n, err)
		}
		if got, err := s.KeyCountsSince(ctx, "b", m0); err != nil || len(got) != 1 {
			t.Fatalf("after pruning, b reads %+v (%v), want a's one row of %s", got, err, m1)
		}
		if err := s.PublishKeyCounts(ctx, []KeyCount{{Hub: "a", Key: "ci"}}); err == nil {
			t.Fatal("a count without a minute was stored")
		}
	})
}

func TestLiveAPIKeyHashes(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		ci, err := s.CreateAPIKey(ctx, "ci")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateAPIKey(ctx, "old"); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeAPIKey(ctx, "old"); err != nil {
			t.Fatal(err)
		}
		got, err := s.LiveAPIKeyHashes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := []KeyHash{{Name: "ci", Hash: HashAPIKey(ci)}}; !slices.Equal(got, want) {
			t.Fatalf("live key hashes %+v, want only ci's (the revoked old's absent)", got)
		}
	})
}
