package hub

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/router"
)

// The router's reports are summed per minute, key, model and worker in
// memory and written in one batch; `fleet usage` sees what was counted a
// moment ago.
func TestUsageRecordedInBatches(t *testing.T) {
	h := newHub(t, Options{})
	ctx := t.Context()
	now := time.Now()
	for i := range 3 {
		h.ledger.usage.add(router.Usage{At: now, Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 100, CachedTokens: 60, CompletionTokens: 10 + i})
	}
	h.ledger.usage.add(router.Usage{At: now, Key: "bob", Model: "qwen3-4b", Worker: "max/qwen3-4b", PromptTokens: 5, CompletionTokens: 5})
	h.ledger.usage.mu.Lock()
	pending := len(h.ledger.usage.pending)
	h.ledger.usage.mu.Unlock()
	if pending != 2 {
		t.Fatalf("%d rows pending, want 2 (one per key, model, worker and minute)", pending)
	}
	us, err := h.ledger.Usage(ctx, admin, now.Add(-time.Minute), "key")
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 2 || us[0].Key != "ci" || us[0].Requests != 3 || us[0].PromptTokens != 300 || us[0].CachedTokens != 180 || us[0].CompletionTokens != 33 {
		t.Errorf("usage by key = %+v", us)
	}
	if _, err := h.ledger.Usage(ctx, viewer, now.Add(-time.Minute), "key"); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Errorf("a viewer read usage by key: %v", err)
	}
	if us, err := h.ledger.Usage(ctx, viewer, now.Add(-time.Minute), "worker"); err != nil || len(us) != 2 {
		t.Errorf("a viewer's usage by worker = %+v, %v", us, err)
	}
}

// A store that stops taking writes does not grow the hub: rows beyond
// maxPendingUsage are dropped and counted, and a failed batch is kept for
// the next flush without losing its counts.
func TestUsageRecorderIsBounded(t *testing.T) {
	var r usageRecorder
	now := time.Now()
	for i := range maxPendingUsage + 5 {
		r.add(router.Usage{At: now, Model: "m", Worker: fmt.Sprintf("n%d/m", i), PromptTokens: 1})
	}
	rows, dropped := r.take()
	if len(rows) != maxPendingUsage || dropped != 5 {
		t.Fatalf("took %d rows, %d dropped; want %d and 5", len(rows), dropped, maxPendingUsage)
	}
	r.add(router.Usage{At: now, Model: "m", Worker: "n0/m", PromptTokens: 1})
	r.putBack(rows[:1])
	back, _ := r.take()
	total := int64(0)
	for _, row := range back {
		total += row.Requests
	}
	if len(back) > 2 || total != 2 {
		t.Errorf("after a put-back: %+v; want the two requests kept", back)
	}
}

// Limits set with `fleet key limit` and the tokens a key spent today come
// back with a restarted hub: a key that spent its day stays refused.
func TestKeyLimitsSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	first := newHub(t, Options{DataDir: dir})
	ctx := t.Context()
	key, err := first.admin.CreateKey(ctx, admin, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.ledger.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{TokensPerDay: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := first.ledger.SetKeyLimits(ctx, admin, "ghost", fleet.KeyLimits{TokensPerDay: 1}); err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Errorf("limits for a key that does not exist: %v", err)
	}
	first.ledger.usage.add(router.Usage{At: time.Now(), Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 900, CompletionTokens: 200})
	first.ledger.writeUsage(ctx)
	first.Close()

	h := newHub(t, Options{DataDir: dir, RequireKeys: true})
	resp := postWithKey(t, h, key, `{"model":"qwen3-4b"}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("x-ratelimit-remaining-tokens") != "0" {
		t.Errorf("a key past its day's tokens after a restart: %d %v; want 429", resp.StatusCode, resp.Header)
	}
}

// The console's usage view gets the last day's usage by worker, and by key
// only for admins, who may list the keys.
func TestConsoleUsageByKeyOnlyForAdmins(t *testing.T) {
	h := newHub(t, Options{})
	h.ledger.usage.add(router.Usage{At: time.Now(), Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 10, CompletionTokens: 2})
	h.ledger.writeUsage(t.Context())
	for _, tc := range []struct {
		u       fleet.User
		wantKey bool
	}{{viewer, false}, {operator, false}, {admin, true}} {
		snap := h.ConsoleSource(tc.u).Snapshot()
		var worker, key bool
		for _, u := range snap.Usage {
			worker = worker || (u.Worker == "rig/qwen3-4b" && u.Model == "qwen3-4b" && u.Requests == 1)
			key = key || u.Key == "ci"
		}
		if !worker || key != tc.wantKey {
			t.Errorf("%s's console usage = %+v; want the worker's row, and the key's: %v", tc.u.Role, snap.Usage, tc.wantKey)
		}
	}
}

// A console that leaves while it reads the usage for everyone (its context
// ends) leaves the shared figures as they were, and consoles reading at once
// share the figures without a race (run under -race).
func TestConsoleUsageReadIsShared(t *testing.T) {
	h := newHub(t, Options{})
	h.ledger.usage.add(router.Usage{At: time.Now(), Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 10, CompletionTokens: 2})
	h.ledger.writeUsage(t.Context())
	left, leave := context.WithCancel(t.Context())
	leave()
	h.ledger.recentUsage(left, true)
	if got := h.ledger.recentUsage(t.Context(), true); len(got) != 2 {
		t.Fatalf("after a console left mid-read, the next one sees %+v; want the worker's and the key's rows", got)
	}

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if got := h.ledger.recentUsage(t.Context(), false); len(got) != 1 || got[0].Model != "qwen3-4b" {
					t.Errorf("a console's usage = %+v; want the worker's row", got)
					return
				}
				h.ledger.usageCache.mu.Lock()
				h.ledger.usageCache.at = time.Time{} // stale: the next caller reads the store again
				h.ledger.usageCache.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// A key revoked and created again under its name is a new key: the old
// one's limits do not follow the name.
func TestRecreatedKeyStartsWithoutLimits(t *testing.T) {
	h, _ := hubWithKeys(t, Options{RequireKeys: true}, "seed")
	ctx := t.Context()
	if _, err := h.admin.CreateKey(ctx, admin, "ci"); err != nil {
		t.Fatal(err)
	}
	if err := h.ledger.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{RequestsPerMinute: 1}); err != nil {
		t.Fatal(err)
	}
	if err := h.admin.RevokeKey(ctx, admin, "ci"); err != nil {
		t.Fatal(err)
	}
	key, err := h.admin.CreateKey(ctx, admin, "ci")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		// A model nobody serves answers 404 at once, after the key's limits.
		resp := postWithKey(t, h, key, `{"model":"nope"}`)
		if resp.StatusCode == http.StatusTooManyRequests || resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatalf("request %d with the new ci key: %d %v; the revoked key's limit followed its name", i+1, resp.StatusCode, resp.Header)
		}
	}
}

// Changing a key's limits reloads every key's spend from the store; what
// the router counted in the last seconds, not yet flushed, must be in it, or
// `fleet key limit` hands a key that spent its day some tokens back.
func TestKeyLimitChangeKeepsUnflushedSpend(t *testing.T) {
	ctx := t.Context()
	h, keys := hubWithKeys(t, Options{RequireKeys: true}, "ci", "other")
	if err := h.ledger.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{TokensPerDay: 1000}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	h.ledger.usage.add(router.Usage{At: now, Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 50, CompletionTokens: 50})
	h.ledger.writeUsage(ctx)
	// A second request, counted by the router (its day is now 1100 tokens)
	// and waiting in the recorder for the next flush.
	h.ledger.usage.add(router.Usage{At: now, Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 900, CompletionTokens: 100})
	h.router.SeedKeyTokens(now, map[string]int64{"ci": 1100})

	if err := h.ledger.SetKeyLimits(ctx, admin, "other", fleet.KeyLimits{RequestsPerMinute: 5}); err != nil {
		t.Fatal(err)
	}
	resp := postWithKey(t, h, keys["ci"], `{"model":"qwen3-4b"}`)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a key past its day's tokens after another key's limit changed: %d (remaining tokens %q); want 429",
			resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-tokens"))
	}
}

// hubWithKeys opens a hub with opts on a data dir whose store already has
// the named API keys (a hub that requires keys does not start without
// one); it returns the hub and each key's secret.
func hubWithKeys(t *testing.T, opts Options, names ...string) (*Hub, map[string]string) {
	t.Helper()
	opts.DataDir = t.TempDir()
	seed := newHub(t, Options{DataDir: opts.DataDir})
	keys := map[string]string{}
	for _, name := range names {
		key, err := seed.admin.CreateKey(t.Context(), admin, name)
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = key
	}
	seed.Close()
	return newHub(t, opts), keys
}

// postWithKey sends one chat completion request with body to h's router
// under the API key and returns the answer, its body closed.
func postWithKey(t *testing.T, h *Hub, key, body string) *http.Response {
	t.Helper()
	srv := httptest.NewServer(h.router.Handler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// `key list` says which keys are in use: when each was last used and its
// requests today, the router's last reports included (not yet flushed).
func TestKeyListShowsUse(t *testing.T) {
	h, _ := hubWithKeys(t, Options{}, "ci", "idle")
	now := time.Now()
	for range 3 {
		h.ledger.usage.add(router.Usage{At: now, Key: "ci", Model: "qwen3-4b", Worker: "rig/qwen3-4b", PromptTokens: 10, CompletionTokens: 5})
	}
	keys, err := h.admin.Keys(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fleet.APIKey{}
	for _, k := range keys {
		got[k.Name] = k
	}
	if now.UTC().Truncate(24*time.Hour) != time.Now().UTC().Truncate(24*time.Hour) {
		t.Skip("the UTC day turned during the test: its requests are yesterday's")
	}
	if ci := got["ci"]; ci.RequestsToday != 3 || !ci.LastUsed.Equal(now.Truncate(time.Minute)) {
		t.Errorf("ci: last used %v, %d requests today; want %v and 3", ci.LastUsed, ci.RequestsToday, now.Truncate(time.Minute))
	}
	if idle := got["idle"]; idle.RequestsToday != 0 || !idle.LastUsed.IsZero() {
		t.Errorf("idle, never used: last used %v, %d requests today", idle.LastUsed, idle.RequestsToday)
	}
}

// A limit set where the router checks no key says so, and the audit line
// reads 0 as what it means: unlimited.
func TestKeyLimitWhereKeysAreNotChecked(t *testing.T) {
	ctx := t.Context()
	open := newHub(t, Options{DataDir: t.TempDir()})
	if open.ledger.KeysNotChecked() == "" {
		t.Error("a loopback hub without --require-keys says it checks keys")
	}
	h, _ := hubWithKeys(t, Options{RequireKeys: true}, "ci")
	if why := h.ledger.KeysNotChecked(); why != "" {
		t.Errorf("a hub with --require-keys says it checks no key: %q", why)
	}
	if err := h.ledger.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{RequestsPerMinute: 60}); err != nil {
		t.Fatal(err)
	}
	audit, err := h.store.Audit(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range audit {
		if e.Action == string(fleet.ActionKeyLimit) {
			if e.Target != "ci (60 requests/min, unlimited tokens/day)" {
				t.Errorf("audit target %q; want 0 read as unlimited", e.Target)
			}
			return
		}
	}
	t.Errorf("no audit line for key limit in %+v", audit)
}
