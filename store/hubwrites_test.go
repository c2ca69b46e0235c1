package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
)

// openHub opens the PostgreSQL database at url as hub name would: a pool of
// its own, its own name on its audit lines and usage rows, registered
// among the hubs. Its connections carry an application name of their own
// (returned), by which a test finds them in pg_stat_activity.
func openHub(tb testing.TB, url, name string) (*Store, string) {
	tb.Helper()
	var b [4]byte
	rand.Read(b[:])
	app := "fleet-test-" + name + "-" + hex.EncodeToString(b[:])
	s, err := OpenPostgres(context.Background(), url+"&application_name="+app)
	if err != nil {
		tb.Fatalf("open hub %s: %v", name, err)
	}
	tb.Cleanup(func() { s.Close() })
	s.SetAuditOrigin(name, app)
	if err := s.RegisterHub(context.Background(), HubInfo{Name: name, Instance: app}); err != nil {
		tb.Fatal(err)
	}
	return s, app
}

// blockedBackends lists what the connections named app wait for on a lock:
// the query waiting and the queries of the backends holding it up, by
// PostgreSQL's own account of lock waits (pg_blocking_pids).
func blockedBackends(ctx context.Context, s *Store, app string) ([]string, error) {
	return queryAll(ctx, s.db, "read lock waits", func(r rowScanner) (string, error) {
		var waiting, holders string
		err := r.Scan(&waiting, &holders)
		return fmt.Sprintf("%q waits for %s", shortQuery(waiting), holders), err
	}, `SELECT a.query, string_agg(COALESCE(b.application_name, '?') || ': ' || COALESCE(left(b.query, 60), '?'), '; ')
		FROM pg_stat_activity a, unnest(pg_blocking_pids(a.pid)) AS h(pid)
		LEFT JOIN pg_stat_activity b ON b.pid = h.pid
		WHERE a.application_name = ? GROUP BY a.pid, a.query`, app)
}

// finishUnblocked waits for a write of the hub named app that runs in the
// background (done receives its error) and fails the test if, before it
// ends, PostgreSQL reports one of that hub's connections waiting on a lock
// another transaction holds. The write's own end or PostgreSQL's report
// decides, not a clock: a write that waits on another transaction is
// reported as waiting for as long as that transaction stays open.
func finishUnblocked(t *testing.T, s *Store, app, what string, done <-chan error) bool {
	t.Helper()
	ctx := context.Background()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			return err == nil
		default:
		}
		waits, err := blockedBackends(ctx, s, app)
		if err != nil {
			t.Fatal(err)
		}
		if len(waits) > 0 {
			t.Errorf("%s waits on another transaction: %s", what, strings.Join(waits, "; "))
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// followerWrites are a follower's writes of its own: usage (of the same
// minute, key, model and worker as the other hub's), samples, an audit line
// and its outcome, a heartbeat, key counts, requests in flight on a drained
// worker, and an action queued for the leader.
func followerWrites(hub string, at time.Time) []struct {
	what  string
	write func(ctx context.Context, s *Store) error
} {
	return []struct {
		what  string
		write func(ctx context.Context, s *Store) error
	}{
		{"usage", func(ctx context.Context, s *Store) error {
			return s.AddUsage(ctx, []fleet.Usage{{Bucket: at, Key: "alice", Model: "qwen3-4b", Worker: "rig/qwen3-4b", Requests: 1, PromptTokens: 10}})
		}},
		{"samples", func(ctx context.Context, s *Store) error {
			return s.AddSamples(ctx, []fleet.Sample{{Worker: "rig/qwen3-4b", At: at, Kind: "request", TTFT: time.Millisecond}})
		}},
		{"audit", func(ctx context.Context, s *Store) error {
			id, err := s.BeginAudit(ctx, fleet.AuditEntry{User: "ops", Action: "drain", Target: "rig", Outcome: "started"})
			if err != nil {
				return err
			}
			return s.SetAuditOutcome(ctx, id, "ok")
		}},
		{"heartbeat", func(ctx context.Context, s *Store) error {
			return s.HubHeartbeat(ctx, hub, s.auditOrigin.Load().instance)
		}},
		{"key counts", func(ctx context.Context, s *Store) error {
			return s.PublishKeyCounts(ctx, []KeyCount{{Minute: at, Hub: hub, Key: "alice", Requests: 1, Tokens: 10}, {Minute: at, Hub: hub, Key: "bob", Requests: 2}})
		}},
		{"requests in flight", func(ctx context.Context, s *Store) error {
			return s.PublishDrainInFlight(ctx, hub, at.UnixNano(), map[string]int{"rig/qwen3-4b": 1})
		}},
		{"queued action", func(ctx context.Context, s *Store) error {
			_, err := s.QueueAction(ctx, Action{Hub: hub, User: "ops", Action: "drain", Target: "rig"})
			return err
		}},
	}
}

// TestFollowerWritesWaitOnNoOtherHub: while hub A's transaction stays open
// (a usage batch held up half-written, or the leader's apply paused
// between its steps), a follower's own writes all complete, none waiting
// on A's. With one lock for every write (the store before this test), the
// follower's usage, samples and queued action queued behind A's
// transaction.
func TestFollowerWritesWaitOnNoOtherHub(t *testing.T) {
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		// wantRequests is each key's requests once both hubs committed.
		wantRequests map[string]int64
		// hold starts a write of leader a that stays in its transaction,
		// having written, until release is called; done gets its error.
		hold func(t *testing.T, a *Store, aApp string) (release func(), done <-chan error)
	}{
		{"usage batch half-written", map[string]int64{"alice": 2, "bob": 2}, func(t *testing.T, a *Store, aApp string) (func(), <-chan error) {
			ctx := context.Background()
			row := func(key string) fleet.Usage {
				return fleet.Usage{Bucket: at, Key: key, Model: "qwen3-4b", Worker: "rig/qwen3-4b", Requests: 1, PromptTokens: 10}
			}
			if err := a.AddUsage(ctx, []fleet.Usage{row("bob")}); err != nil {
				t.Fatal(err)
			}
			// A transaction of no hub's locks A's row of key bob, so A's
			// next batch writes alice's row (first in order) and then
			// waits, its transaction open, on bob's.
			other, err := a.db.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var otherPID int64
			if err := other.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { other.Rollback() })
			if _, err := other.ExecContext(ctx, `SELECT 1 FROM usage WHERE key = 'bob' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- a.AddUsage(ctx, []fleet.Usage{row("bob"), row("alice")}) }()
			for {
				waits, err := blockedBackends(ctx, a, aApp)
				if err != nil {
					t.Fatal(err)
				}
				if len(waits) > 0 {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("hub A's usage batch ended (%v) though a row of it was locked", err)
				default:
				}
				time.Sleep(time.Millisecond)
			}
			t.Logf("hub A holds its transaction open: %s (backend %d holds bob's row)", mustWaits(t, a, aApp), otherPID)
			return func() { other.Rollback() }, done
		}},
		{"leader's apply paused", map[string]int64{"alice": 1}, func(t *testing.T, a *Store, _ string) (func(), <-chan error) {
			paused, release := make(chan struct{}), make(chan struct{})
			a.applyPause = func(step string) {
				if step == "placements" {
					close(paused)
					<-release
				}
			}
			done := make(chan error, 1)
			go func() { done <- a.ApplyFleet(context.Background(), fleetA()) }()
			select {
			case <-paused:
			case err := <-done:
				t.Fatalf("the apply ended (%v) before its pause", err)
			}
			return func() { close(release) }, done
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := pgtest.URL(t)
			a, aApp := openHub(t, url, "hub-a")
			if err := leadForTest(context.Background(), a); err != nil {
				t.Fatal(err)
			}
			b, bApp := openHub(t, url, "hub-b")
			release, aDone := tc.hold(t, a, aApp)
			for _, w := range followerWrites("hub-b", at) {
				done := make(chan error, 1)
				go func() { done <- w.write(context.Background(), b) }()
				if !finishUnblocked(t, b, bApp, "hub B's "+w.what, done) {
					release()
					<-done
					<-aDone
					return
				}
			}
			select {
			case err := <-aDone:
				t.Fatalf("hub A's transaction ended (%v) before it was released: the test proved nothing", err)
			default:
			}
			release()
			if err := <-aDone; err != nil {
				t.Fatalf("hub A's write, released: %v", err)
			}
			byKey, err := b.Usage(context.Background(), at, UsageByKey)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for _, u := range byKey {
				got[u.Key] = u.Requests
			}
			if !maps.Equal(got, tc.wantRequests) {
				t.Errorf("requests by key once both hubs committed: %v, want %v", got, tc.wantRequests)
			}
		})
	}
}

func mustWaits(t *testing.T, s *Store, app string) string {
	t.Helper()
	waits, err := blockedBackends(context.Background(), s, app)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(waits, "; ")
}

// shortQuery is a statement's first words, for a message.
func shortQuery(q string) string {
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > 60 {
		q = q[:60] + "…"
	}
	return q
}

// hubWriters are what a busy hub writes side by side, each in a loop of its
// own: its router's usage (a flush of 8 key × worker rows) and request
// samples (16), audit lines, its per-key minute counts (4 keys) and its
// heartbeat. Each call is one write.
func hubWriters(hub string, at time.Time) []func(ctx context.Context, s *Store, i int) error {
	workers := []string{"rig/qwen3-4b", "ultra/qwen3-4b"}
	keys := []string{"alice", "bob", "ci", "eve"}
	return []func(ctx context.Context, s *Store, i int) error{
		func(ctx context.Context, s *Store, i int) error {
			rows := make([]fleet.Usage, 0, len(keys)*len(workers))
			for _, k := range keys {
				for _, w := range workers {
					rows = append(rows, fleet.Usage{Bucket: at, Key: k, Model: "qwen3-4b", Worker: w, Requests: 1, PromptTokens: 100, CompletionTokens: 20})
				}
			}
			return s.AddUsage(ctx, rows)
		},
		func(ctx context.Context, s *Store, i int) error {
			samples := make([]fleet.Sample, 16)
			for j := range samples {
				samples[j] = fleet.Sample{Worker: workers[j%len(workers)], At: at.Add(time.Duration(i*16+j) * time.Millisecond), Kind: "request", TTFT: time.Millisecond, TokPerSec: 80}
			}
			return s.AddSamples(ctx, samples)
		},
		func(ctx context.Context, s *Store, i int) error {
			return s.AddAudit(ctx, fleet.AuditEntry{User: "ops", Action: "refused", Target: fmt.Sprint(i), Outcome: "denied"})
		},
		func(ctx context.Context, s *Store, i int) error {
			counts := make([]KeyCount, len(keys))
			for j, k := range keys {
				counts[j] = KeyCount{Minute: at, Hub: hub, Key: k, Requests: int64(i), Tokens: int64(100 * i)}
			}
			return s.PublishKeyCounts(ctx, counts)
		},
		func(ctx context.Context, s *Store, i int) error {
			return s.HubHeartbeat(ctx, hub, s.auditOrigin.Load().instance)
		},
	}
}

// writeFlat runs every writer of every hub for n writes each, all at once,
// and returns how long they took.
func writeFlat(b testing.TB, hubs []*Store, names []string, at time.Time, n int) time.Duration {
	ctx := context.Background()
	errs := make(chan error, 16)
	start := time.Now()
	running := 0
	for h, s := range hubs {
		for _, write := range hubWriters(names[h], at) {
			running++
			go func() {
				for i := range n {
					if err := write(ctx, s, i); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
	}
	for range running {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkHubWrites: three hubs on one PostgreSQL database, each with a
// pool and a name of its own, write at full rate what busy hubs write
// (hubWriters), against one hub alone, in the same run. It reports writes
// per second of each and their ratio, "3hubs/1hub": with one lock for
// every write it stays near 1. Run it with .ci/with-postgres (see
// docs/measurements.md).
func BenchmarkHubWrites(b *testing.B) {
	url := pgtest.URL(b)
	names := []string{"hub-a", "hub-b", "hub-c"}
	hubs := make([]*Store, len(names))
	for i, name := range names {
		hubs[i], _ = openHub(b, url, name)
	}
	const perWriter = 200
	writers := len(hubWriters("", time.Time{}))
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var one, three time.Duration
	for b.Loop() {
		one += writeFlat(b, hubs[:1], names, at, perWriter)
		three += writeFlat(b, hubs, names, at, perWriter)
	}
	rate := func(hubs int, d time.Duration) float64 {
		return float64(b.N*hubs*writers*perWriter) / d.Seconds()
	}
	b.ReportMetric(rate(1, one), "writes/s-1hub")
	b.ReportMetric(rate(3, three), "writes/s-3hubs")
	b.ReportMetric(rate(3, three)/rate(1, one), "3hubs/1hub")
	b.ReportMetric(0, "ns/op")
}

// TestTakeActionPassesOverOneBeingTaken: while another transaction takes
// the oldest pending action (holding its row, not yet committed), the
// leader takes the next one at once, neither waiting for that transaction
// nor taking the same action when it commits.
func TestTakeActionPassesOverOneBeingTaken(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	a, aApp := openHub(t, url, "hub-a")
	if err := leadForTest(ctx, a); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, target := range []string{"rig", "ultra"} {
		id, err := a.QueueAction(ctx, Action{Hub: "hub-b", User: "ops", Action: "drain", Target: target})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	other, err := a.db.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if _, err := other.ExecContext(ctx, `UPDATE actions SET state = 'running' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	var took Action
	done := make(chan error, 1)
	go func() {
		var ok bool
		var err error
		took, ok, err = a.TakeAction(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("no action taken though action %d was pending", ids[1])
		}
		done <- err
	}()
	if !finishUnblocked(t, a, aApp, "the leader's take", done) {
		other.Rollback()
		<-done
		return
	}
	if took.ID != ids[1] || took.State != ActionRunning {
		t.Errorf("took action %d (%s), want %d running: the one being taken is passed over", took.ID, took.State, ids[1])
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if again, ok, err := a.TakeAction(ctx); err != nil || ok {
		t.Errorf("a take once both were taken: %+v, %v, %v; want none", again, ok, err)
	}
}

// TestCreateKeyWhileItsRevokeCommits: a key created under the name of a key
// whose revoke is in flight (another hub's transaction, not yet committed)
// waits for that revoke and then replaces the revoked key; it is not
// refused as a live key's name, nor does it leave two rows.
func TestCreateKeyWhileItsRevokeCommits(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	a, aApp := openHub(t, url, "hub-a")
	b, _ := openHub(t, url, "hub-b")
	if _, err := a.CreateAPIKey(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetAPIKeyLimits(ctx, "ci", fleet.KeyLimits{RequestsPerMinute: 60}); err != nil {
		t.Fatal(err)
	}
	revoke, err := b.db.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer revoke.Rollback()
	if _, err := revoke.ExecContext(ctx, `UPDATE api_keys SET revoked = 1 WHERE name = 'ci'`); err != nil {
		t.Fatal(err)
	}
	var key string
	done := make(chan error, 1)
	go func() {
		var err error
		key, err = a.CreateAPIKey(ctx, "ci")
		done <- err
	}()
	for {
		waits, err := blockedBackends(ctx, a, aApp)
		if err != nil {
			t.Fatal(err)
		}
		if len(waits) > 0 {
			break // the create waits on the revoke's row
		}
		select {
		case err := <-done:
			t.Fatalf("the create ended (%v, key %q) before the revoke of the name committed", err, key)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	if err := revoke.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("create of a key whose revoke committed meanwhile: %v", err)
	}
	keys, err := a.APIKeys(ctx)
	if err != nil || len(keys) != 1 || !keys[0].Revoked.IsZero() || keys[0].RequestsPerMinute != 0 {
		t.Fatalf("keys = %+v, %v; want ci alone, live, without the revoked key's limit", keys, err)
	}
	if name, ok := liveKey(t, a, key); !ok || name != "ci" {
		t.Errorf("the new key is not live as ci: %q, %v", name, ok)
	}
}
