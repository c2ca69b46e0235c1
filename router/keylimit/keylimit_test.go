package keylimit

import (
	"math"
	"testing"
	"time"

	"fleet"
)

// The token bucket refills at the limit's pace, and the day's tokens renew
// at the next UTC midnight.
func TestKeyLimitsRefill(t *testing.T) {
	kl := &Book{}
	kl.Set(map[string]fleet.KeyLimits{"a": {RequestsPerMinute: 60, TokensPerDay: 100}})
	now := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	kl.state["a"].at = now
	for i := range 60 {
		if v := admitOne(kl, "a", now); v.Limited {
			t.Fatalf("request %d of a full bucket refused", i+1)
		}
	}
	v := admitOne(kl, "a", now)
	if !v.Limited || v.Which != "requests" || v.RetryAfter != time.Second {
		t.Fatalf("61st request: %+v, want refused for 1 s", v)
	}
	if v := admitOne(kl, "a", now.Add(time.Second)); v.Limited {
		t.Errorf("a second later one request is back, but it was refused: %+v", v)
	}
	kl.Spend("a", 100, now)
	v = admitOne(kl, "a", now.Add(10*time.Second))
	if !v.Limited || v.Which != "tokens" || v.RetryAfter != 50*time.Second {
		t.Errorf("after the day's tokens: %+v, want refused until midnight (50 s)", v)
	}
	if v := admitOne(kl, "a", now.Add(61*time.Second)); v.Limited {
		t.Errorf("a new UTC day, still refused: %+v", v)
	}
	kl.SeedTokens(now.Add(62*time.Second), map[string]int64{"a": 100, "ghost": 5})
	if v := admitOne(kl, "a", now.Add(62*time.Second)); !v.Limited {
		t.Errorf("seeded with the day's tokens, admitted: %+v", v)
	}
	if _, ok := kl.state["ghost"]; ok {
		t.Error("a key without limits got state")
	}
}

// The hub seeds the day's tokens from its store whenever a key's limits
// change, and the store lags the router by the usage not yet written: a
// seed lower than what the router counted today must not forget the rest.
func TestSeedKeyTokensKeepsWhatTheRouterCounted(t *testing.T) {
	kl := &Book{}
	kl.Set(map[string]fleet.KeyLimits{"a": {TokensPerDay: 1000}})
	now := time.Now()
	kl.Spend("a", 300, now)
	kl.SeedTokens(now, map[string]int64{"a": 200}) // 100 still on their way to the store
	if got := admitOne(kl, "a", now).Header.Get("x-ratelimit-remaining-tokens"); got != "700" {
		t.Errorf("remaining tokens %s after a lagging seed, want 700", got)
	}
	kl.SeedTokens(now, map[string]int64{"a": 400}) // a restarted hub knows more
	if got := admitOne(kl, "a", now).Header.Get("x-ratelimit-remaining-tokens"); got != "600" {
		t.Errorf("remaining tokens %s after a seed above the count, want 600", got)
	}
}

// admitOne is one request of name at now that spends tokens, ended at once:
// its reservation is given back.
func admitOne(kl *Book, name string, now time.Time) Verdict {
	v, rv := kl.Admit(name, now, true, 0)
	kl.Settle(rv)
	return v
}

// What a request reserves of its key's day: its prompt and max_tokens, never
// more than the largest context can make, a fixed bound when neither says,
// and no overflow for a max_tokens of 2^63-1.
func TestReserveFor(t *testing.T) {
	for _, c := range []struct {
		name                             string
		prompt, maxTokens, choices, ctxt int
		want                             int64
	}{
		{"max_tokens within the context", 100, 500, 1, 4096, 600},
		{"max_tokens past the context", 100, 10000, 1, 4096, 4096},
		{"no max_tokens: what the context leaves", 100, 0, 1, 4096, 4096},
		{"a prompt past the context", 5000, 0, 1, 4096, 5000},
		{"no max_tokens, no context known", 100, 0, 1, 0, 100 + NoOutputBound},
		{"max_tokens, no context known", 100, 700, 1, 0, 800},
		{"n=3 answers", 100, 500, 3, 4096, 1600},
		{"an endpoint that makes no answer", 100, 500, 0, 4096, 100},
		{"max_tokens of 2^63-1", 100, math.MaxInt, 1, 0, math.MaxInt64},
		{"n of 2^63-1", 100, 500, math.MaxInt, 4096, math.MaxInt64},
	} {
		if got := ReserveFor(c.prompt, c.maxTokens, c.choices, c.ctxt); got != c.want {
			t.Errorf("%s: ReserveFor(%d, %d, %d, %d) = %d, want %d", c.name, c.prompt, c.maxTokens, c.choices, c.ctxt, got, c.want)
		}
	}
}

// Hubs hit at once, each counting the others' admissions of the last
// sync (lag 1) or, the worst a hub that read just before the others
// published sees, of the one before (lag 2), admit together at most rpm
// plus 2(N-1) leash floors: one second's worth of rpm when rpm is at
// least 120(N-1). Without the others' counts each would admit rpm.
func TestBooksOfSeveralHubsHoldOneLimit(t *testing.T) {
	type hit struct{ hubs, rpm, lag int }
	var cases []hit
	for _, lag := range []int{1, 2} {
		for _, hubs := range []int{2, 3, 5} {
			for _, rpm := range []int{7, 60, 240, 600, 2400} {
				cases = append(cases, hit{hubs, rpm, lag})
			}
		}
	}
	for _, tc := range cases {
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		books := make([]*Book, tc.hubs)
		for i := range books {
			books[i] = &Book{}
			books[i].Set(map[string]fleet.KeyLimits{"k": {RequestsPerMinute: tc.rpm}})
			books[i].state["k"].at = now
			books[i].Others(nil, tc.hubs-1, now)
		}
		// published[r][i] is what hub i published in round r.
		var published []map[int]Count
		admitted := 0
		for round := 0; round < 4*tc.rpm+10; round++ {
			for _, b := range books {
				for !admitOne(b, "k", now).Limited {
					admitted++
				}
			}
			pub := map[int]Count{}
			for i, b := range books {
				c := b.Take()
				b.Published(c)
				pub[i] = c["k"]
			}
			published = append(published, pub)
			if round+1 < tc.lag {
				continue
			}
			// Each hub reads what the others published lag-1 rounds ago.
			for i, b := range books {
				var sum Count
				for j, c := range published[round+1-tc.lag] {
					if j != i {
						sum.Requests += c.Requests
					}
				}
				b.Others(map[string]Count{"k": sum}, tc.hubs-1, now)
			}
		}
		bound := tc.rpm + 2*(tc.hubs-1)*int(LeashFloor(tc.rpm, tc.hubs-1))
		if admitted > bound || admitted < tc.rpm {
			t.Errorf("%d hubs, rpm %d, lag %d, all at one instant: %d admitted, want rpm to rpm + 2(N-1) leash floors = %d", tc.hubs, tc.rpm, tc.lag, admitted, bound)
		}
		if perSecond := tc.rpm / 60; tc.rpm >= 120*(tc.hubs-1) && bound-tc.rpm > perSecond {
			t.Errorf("%d hubs, rpm %d: the overshoot bound %d passes one second's worth (%d)", tc.hubs, tc.rpm, bound-tc.rpm, perSecond)
		}
	}
}

// A hub alone (no other hubs, or none reachable) is held by its bucket
// only, as a hub on SQLite is; the others' counts come out of its bucket.
func TestBookAloneHasNoLeash(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	kl := &Book{}
	kl.Set(map[string]fleet.KeyLimits{"k": {RequestsPerMinute: 600, TokensPerDay: 1000}})
	kl.state["k"].at = now
	for i := range 600 {
		if v := admitOne(kl, "k", now); v.Limited {
			t.Fatalf("alone, request %d of 600 refused: %+v", i+1, v)
		}
	}
	kl.Others(map[string]Count{"k": {Requests: 30, Tokens: 400}}, 0, now)
	if v := admitOne(kl, "k", now.Add(3*time.Second)); !v.Limited || v.Which != "requests" {
		t.Errorf("30 requests of other hubs and 3 s of refill (30) leave none, but: %+v", v)
	}
	if got := admitOne(kl, "k", now.Add(3*time.Second)).Header.Get("x-ratelimit-remaining-tokens"); got != "600" {
		t.Errorf("remaining tokens %s after other hubs spent 400 of 1000, want 600", got)
	}
	kl.Others(nil, 1, now)
	if v := admitOne(kl, "k", now.Add(time.Minute)); !v.Limited || v.RetryAfter != LeashWait {
		t.Fatalf("with another hub there, the 600 requests it has not seen held no leash: %+v", v)
	}
	kl.Published(kl.Take())
	later := now.Add(time.Minute) // the bucket is full again
	n := int64(0)
	for ; n < 600; n++ {
		if v := admitOne(kl, "k", later); v.Limited {
			if v.RetryAfter != LeashWait {
				t.Fatalf("with one other hub, request %d was refused, not held by the leash: %+v", n+1, v)
			}
			break
		}
	}
	// Its share of what is left, which its own requests make smaller.
	if n <= LeashFloor(600, 1) || n > Leash(600, 1, 600) {
		t.Errorf("with one other hub and a full bucket, the hub admitted %d before the others saw them, want more than the floor %d and at most a quarter of half the bucket, %d",
			n, LeashFloor(600, 1), Leash(600, 1, 600))
	}
}

// A hub whose bucket of a key sat full while no one used the key, then
// hears that the other hubs spent the whole bucket, has what the fleet's
// bucket refilled since they spent it, not a full bucket again: the refill
// of the idle time was capped when it happened, before their requests.
// (Before, a hub idle on a key refilled from its own last request, so the
// clients of a key that moved to it, say with a virtual IP, got a whole
// minute's worth more than the limit.)
func TestOthersCountedAfterTheBucketWasFull(t *testing.T) {
	const rpm = 240
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	kl := &Book{}
	kl.Set(map[string]fleet.KeyLimits{"k": {RequestsPerMinute: rpm}})
	kl.state["k"].at = t0
	kl.Others(nil, 2, t0)
	// A minute with no request anywhere, then the others spend it all.
	kl.Others(map[string]Count{"k": {Requests: rpm}}, 2, t0.Add(time.Minute))
	admitted := 0
	for range rpm {
		if admitOne(kl, "k", t0.Add(time.Minute+time.Second)).Limited {
			break
		}
		admitted++
		kl.Published(kl.Take()) // the others have seen it: no leash holds it
	}
	if admitted != rpm/60 {
		t.Errorf("a second after the other hubs spent the bucket, the idle hub admits %d; want the second's refill, %d", admitted, rpm/60)
	}
}
