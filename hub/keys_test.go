package hub

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
	"fleet/router"
	"fleet/router/keylimit"
	"fleet/store"
)

// hubPart is what one hub of several on one database holds of keys: its
// store, router, ledger (with the key cache) and key sync, as Open and
// Run wire them, without nodes.
type hubPart struct {
	st    *store.Store
	rt    *router.Router
	lg    *Ledger
	admin *Admin
	ks    *keySync
}

func newHubPart(t *testing.T, url, name string) *hubPart {
	t.Helper()
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	st, err := store.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := router.New(router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := &guard{store: st, log: log}
	lg := &Ledger{guard: g, store: st, log: log, keys: keyCache{store: st}, router: rt}
	if err := lg.reloadKeys(ctx); err != nil {
		t.Fatal(err)
	}
	return &hubPart{st: st, rt: rt, lg: lg, admin: &Admin{guard: g, store: st, ledger: lg}, ks: newKeySync(st, rt.KeyBook(), name, log)}
}

func (p *hubPart) verify(t *testing.T, key string) (string, bool) {
	t.Helper()
	name, ok, err := p.lg.keys.VerifyAPIKey(t.Context(), key)
	if err != nil {
		t.Fatalf("the key cache failed, which it never should: %v", err)
	}
	return name, ok
}

// Hubs on one database hit at once by one key, each publishing and
// reading the others' counts between bursts, admit together at most the
// key's rpm plus the stated overshoot: 2(N-1) leash floors. Each alone
// would admit its rpm.
func TestKeySyncHoldsRPMAcrossHubs(t *testing.T) {
	for _, tc := range []struct{ hubs, rpm int }{{2, 240}, {3, 600}} {
		_, _, url := newDBProxy(t)
		ctx := t.Context()
		var parts []*hubPart
		for i := range tc.hubs {
			parts = append(parts, newHubPart(t, url, strconv.Itoa(i)))
		}
		if _, err := parts[0].admin.CreateKey(ctx, admin, "ci"); err != nil {
			t.Fatal(err)
		}
		if err := parts[0].lg.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{RequestsPerMinute: tc.rpm}); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, p := range parts {
			if err := p.lg.reloadKeys(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The hubs were there before the burst: each has published its
		// mark and read the others'.
		for range 2 {
			for _, p := range parts {
				if err := p.ks.sync(ctx, now); err != nil {
					t.Fatal(err)
				}
			}
		}
		admitted, idle := 0, 0
		for idle < 3 {
			n := 0
			for _, p := range parts {
				for {
					v, _ := p.rt.KeyBook().Admit("ci", now, false, 0)
					if v.Limited {
						break
					}
					n++
				}
			}
			admitted += n
			if n == 0 {
				idle++
			}
			for _, p := range parts {
				if err := p.ks.sync(ctx, now); err != nil {
					t.Fatal(err)
				}
			}
		}
		bound := tc.rpm + 2*(tc.hubs-1)*int(keylimit.LeashFloor(tc.rpm, tc.hubs-1))
		if admitted < tc.rpm || admitted > bound {
			t.Fatalf("%d hubs admitted %d requests of a key limited to %d a minute, all in one instant; want %d to %d", tc.hubs, admitted, tc.rpm, tc.rpm, bound)
		}
		t.Logf("%d hubs admitted %d of rpm %d (bound %d)", tc.hubs, admitted, tc.rpm, bound)
	}
}

// A key revoked on one hub is refused by another as soon as the other has
// heard of it (its cluster listener, fleet_keys) and reloaded; so is a key
// created there taken, and a limit set there held.
func TestKeyRevokedOnOneHubRefusedByAnother(t *testing.T) {
	url := pgtest.URL(t)
	a, err := openHub(t, Options{DatabaseURL: url, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := openHub(t, Options{DatabaseURL: url, HubName: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(t.Context())
	reloaded := make(chan error, 16)
	b.ledger.keysReloaded = func(err error) { reloaded <- err }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); b.cluster.listen(ctx) }()
	go func() { defer wg.Done(); b.ledger.watchKeys(ctx, b.cluster.keysChanged, time.Hour) }()
	defer func() { cancel(); wg.Wait() }()
	// waitFor waits for b's reloads until want holds; the hour-long tick
	// cannot fire, so only what b's listener heard reloads.
	waitFor := func(what string, start time.Time, want func() bool) time.Duration {
		t.Helper()
		for !want() {
			select {
			case err := <-reloaded:
				if err != nil {
					t.Fatalf("hub b's reload: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("hub b never reloaded to %s: it heard nothing", what)
			}
		}
		return time.Since(start)
	}
	verify := func(h *Hub, key string) bool {
		_, ok, err := h.ledger.keys.VerifyAPIKey(ctx, key)
		if err != nil {
			t.Fatalf("the key cache failed, which it never should: %v", err)
		}
		return ok
	}
	api := a.API()
	start := time.Now()
	key, err := api.CreateKey(ctx, admin, "ci")
	if err != nil {
		t.Fatal(err)
	}
	took := waitFor("take the key created on hub a", start, func() bool { return verify(b, key) })
	t.Logf("a key created on hub a was taken by hub b %s later", took)
	start = time.Now()
	if err := api.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{RequestsPerMinute: 7}); err != nil {
		t.Fatal(err)
	}
	took = waitFor("hold the limit set on hub a", start, func() bool {
		v, rv := b.router.KeyBook().Admit("ci", time.Now(), false, 0)
		b.router.KeyBook().Settle(rv)
		return v.Header.Get("x-ratelimit-limit-requests") == "7"
	})
	t.Logf("a limit set on hub a held on hub b %s later", took)
	start = time.Now()
	if err := api.RevokeKey(ctx, admin, "ci"); err != nil {
		t.Fatal(err)
	}
	if verify(a, key) {
		t.Fatal("hub a takes the key it revoked")
	}
	took = waitFor("refuse the key revoked on hub a", start, func() bool { return !verify(b, key) })
	t.Logf("a key revoked on hub a was refused by hub b %s later", took)
}

// A key revoked on one hub is refused by the other once it reloads; while
// its database is unreachable a hub keeps checking keys as they were.
func TestKeyCacheKeepsKeysWhileTheDatabaseIsDown(t *testing.T) {
	proxy, proxied, direct := newDBProxy(t)
	ctx := t.Context()
	a, b := newHubPart(t, direct, "a"), newHubPart(t, proxied, "b")
	key, err := a.admin.CreateKey(ctx, admin, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.verify(t, key); ok {
		t.Fatal("hub b took a key made after it read the keys, without reloading")
	}
	if err := b.lg.keys.reload(ctx); err != nil {
		t.Fatal(err)
	}
	if name, ok := b.verify(t, key); !ok || name != "ci" {
		t.Fatalf("hub b after reloading: %q %v, want the key ci", name, ok)
	}
	proxy.down()
	if err := b.lg.keys.reload(ctx); err == nil {
		t.Fatal("reloading the keys through a cut database worked; the test cuts nothing")
	}
	if name, ok := b.verify(t, key); !ok || name != "ci" {
		t.Fatalf("with its database unreachable, hub b refused a live key: %q %v", name, ok)
	}
	if err := a.admin.RevokeKey(ctx, admin, "ci"); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.verify(t, key); ok {
		t.Fatal("hub a takes the key it revoked")
	}
	proxy.up()
	if err := b.lg.keys.reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.verify(t, key); ok {
		t.Fatal("hub b takes a key revoked on hub a after reloading")
	}
}

// Usage counted while the database is unreachable stays in the bounded
// buffer and is written, every count of it, when the database is back.
func TestUsageKeptWhileTheDatabaseIsDown(t *testing.T) {
	proxy, proxied, direct := newDBProxy(t)
	ctx := t.Context()
	h := newHubPart(t, proxied, "h")
	at := time.Now()
	add := func(n int) {
		for range n {
			h.lg.usage.add(router.Usage{At: at, Key: "ci", Model: "m", Worker: "n/m", PromptTokens: 10, CompletionTokens: 1})
		}
	}
	add(3)
	h.lg.writeUsage(ctx)
	proxy.down()
	add(4)
	h.lg.writeUsage(ctx) // fails: kept
	add(5)
	h.lg.writeUsage(ctx) // fails again: kept, added to
	h.lg.usage.mu.Lock()
	pending := len(h.lg.usage.pending)
	h.lg.usage.mu.Unlock()
	if pending != 1 {
		t.Fatalf("%d usage rows wait with the database down, want 1 (9 requests of one minute, key, model and worker)", pending)
	}
	proxy.up()
	h.lg.writeUsage(ctx)
	other, err := store.OpenPostgres(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	us, err := other.Usage(ctx, at.Add(-time.Minute), store.UsageByKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 1 || us[0].Requests != 12 || us[0].PromptTokens != 120 || us[0].CompletionTokens != 12 {
		t.Fatalf("usage in the database after it came back: %+v, want ci's 12 requests, 120 prompt and 12 completion tokens", us)
	}
}

// Request samples the database does not take wait, bounded, for the
// next write, and all arrive once it is back.
func TestSamplesKeptWhileTheDatabaseIsDown(t *testing.T) {
	proxy, proxied, direct := newDBProxy(t)
	ctx := t.Context()
	h := newHubPart(t, proxied, "h")
	log := slog.New(slog.DiscardHandler)
	at := time.Now().Add(-time.Second)
	var batch sampleBatch
	add := func(n int) {
		for range n {
			batch.add(fleet.Sample{Worker: "n/m", At: at, Kind: "request", E2E: time.Second, OutputTokens: 5})
		}
	}
	add(3)
	if err := batch.write(ctx, h.st, log); err != nil {
		t.Fatal(err)
	}
	proxy.down()
	add(4)
	if err := batch.write(ctx, h.st, log); err == nil {
		t.Fatal("samples were written through a cut database")
	}
	add(5)
	if err := batch.write(ctx, h.st, log); err == nil {
		t.Fatal("samples were written through a cut database")
	}
	proxy.up()
	if err := batch.write(ctx, h.st, log); err != nil {
		t.Fatal(err)
	}
	other, err := store.OpenPostgres(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	got, err := other.Samples(ctx, "n/m", at.Add(-time.Minute), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 12 {
		t.Fatalf("%d request samples in the database after it came back, want all 12", len(got))
	}
	var full sampleBatch
	for range maxPendingSamples + 5 {
		full.add(fleet.Sample{Worker: "n/m", At: at})
	}
	if len(full.rows) != maxPendingSamples || full.dropped != 5 {
		t.Fatalf("%d samples kept and %d dropped past the bound, want %d and 5", len(full.rows), full.dropped, maxPendingSamples)
	}
}

// A hub that cannot reach the database holds each key's limits on its own
// (a leash it cannot loosen would refuse the key's every request), and
// publishes what it admitted meanwhile when the database is back.
func TestKeySyncAloneWhileTheDatabaseIsDown(t *testing.T) {
	proxy, proxied, direct := newDBProxy(t)
	ctx := t.Context()
	start := time.Now()
	a, b := newHubPart(t, direct, "a"), newHubPart(t, proxied, "b")
	if _, err := a.admin.CreateKey(ctx, admin, "ci"); err != nil {
		t.Fatal(err)
	}
	const rpm = 600
	if err := a.lg.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{RequestsPerMinute: rpm}); err != nil {
		t.Fatal(err)
	}
	if err := b.lg.reloadKeys(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, p := range []*hubPart{a, b} {
		if err := p.ks.sync(ctx, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.ks.sync(ctx, now); err != nil {
		t.Fatal(err)
	}
	admit := func(p *hubPart, at time.Time) int {
		n := 0
		for n < rpm {
			if v, _ := p.rt.KeyBook().Admit("ci", at, false, 0); v.Limited {
				break
			}
			n++
		}
		return n
	}
	first := admit(b, now)
	if share := int(keylimit.Leash(rpm, 1, rpm)); first < 1 || first > share {
		t.Fatalf("hub b with hub a there admitted %d at once, want 1 to its share of a full bucket, %d", first, share)
	}
	proxy.down()
	if err := b.ks.sync(ctx, now); err == nil {
		t.Fatal("a sync through a cut database worked")
	}
	later := now.Add(keyAloneAfter)
	if err := b.ks.sync(ctx, later); err == nil {
		t.Fatal("a sync through a cut database worked")
	}
	alone := admit(b, later)
	if alone < rpm-first {
		t.Fatalf("hub b, cut off from the database for %s, admitted %d at once of the %d it had left: still leashed", keyAloneAfter, alone, rpm-first)
	}
	proxy.up()
	if err := b.ks.sync(ctx, later); err != nil {
		t.Fatal(err)
	}
	if err := a.ks.sync(ctx, later); err != nil {
		t.Fatal(err)
	}
	counts, err := a.st.KeyCountsSince(ctx, "a", now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	published := int64(0)
	for _, c := range counts {
		published += c.Requests
	}
	if published != int64(first+alone) {
		t.Fatalf("hub b published %d requests of ci once the database was back, want the %d it admitted", published, first+alone)
	}
	// Hub a counts them: its bucket (full, plus what refilled since the
	// test began) less b's requests and its own one.
	v, _ := a.rt.KeyBook().Admit("ci", later, false, 0)
	remaining, err := strconv.Atoi(v.Header.Get("x-ratelimit-remaining-requests"))
	if err != nil {
		t.Fatal(err)
	}
	refilled := int(later.Sub(start).Seconds()*rpm/60) + 1
	if most := max(rpm-first-alone-1+refilled, 0); remaining > most {
		t.Fatalf("hub a has %d requests of ci left after hub b's %d, want at most %d", remaining, first+alone, most)
	}
}

// TestKeySyncCountsInTheDatabasesMinutes: the minutes of the key counts are
// the database's, not each hub's: hub b, whose clock is 3 minutes behind,
// still counts in hub a's book, and hub c, 11 minutes ahead, prunes
// nobody's rows. The skew is injected as what each hub's sync takes for
// its clock (run passes time.Now()).
func TestKeySyncCountsInTheDatabasesMinutes(t *testing.T) {
	_, _, url := newDBProxy(t)
	ctx := t.Context()
	a, b, c := newHubPart(t, url, "a"), newHubPart(t, url, "b"), newHubPart(t, url, "c")
	if _, err := a.admin.CreateKey(ctx, admin, "ci"); err != nil {
		t.Fatal(err)
	}
	const rpm = 600
	if err := a.lg.SetKeyLimits(ctx, admin, "ci", fleet.KeyLimits{RequestsPerMinute: rpm}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*hubPart{a, b, c} {
		if err := p.lg.reloadKeys(ctx); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	behind, ahead := now.Add(-3*time.Minute), now.Add(11*time.Minute)
	syncAll := func() {
		t.Helper()
		for _, s := range []struct {
			p  *hubPart
			at time.Time
		}{{a, now}, {b, behind}, {c, ahead}} {
			if err := s.p.ks.sync(ctx, s.at); err != nil {
				t.Fatal(err)
			}
		}
	}
	syncAll()
	syncAll()
	const sent = 7
	for range sent {
		if v, _ := b.rt.KeyBook().Admit("ci", behind, false, 0); v.Limited {
			t.Fatal("hub b refused one of a few requests of a key with a full bucket")
		}
	}
	syncAll()                                   // b publishes, c prunes
	if err := a.ks.sync(ctx, now); err != nil { // a reads them
		t.Fatal(err)
	}
	counts, err := a.st.KeyCountsSince(ctx, "a", now.Add(-keyCountsWindow))
	if err != nil {
		t.Fatal(err)
	}
	var fromB int64
	hubs := map[string]bool{}
	for _, k := range counts {
		hubs[k.Hub] = true
		if k.Hub == "b" {
			fromB += k.Requests
		}
	}
	if !hubs["b"] || !hubs["c"] || fromB != sent {
		t.Fatalf("hub a reads the counts of hubs %v, %d requests of ci from b; want b's and c's marks (after c's prune), and b's %d requests", hubs, fromB, sent)
	}
	v, _ := a.rt.KeyBook().Admit("ci", now, false, 0)
	remaining, err := strconv.Atoi(v.Header.Get("x-ratelimit-remaining-requests"))
	if err != nil {
		t.Fatal(err)
	}
	if most := rpm - sent - 1; remaining > most {
		t.Fatalf("hub a has %d requests of ci left after hub b (3 minutes behind) admitted %d, want at most %d: b's counts fell out of its minutes", remaining, sent, most)
	}
}
