package sweep

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"fleet/bench"
	"fleet/sim/simtest"
)

func simTarget(t *testing.T, name string, args ...string) bench.Target {
	t.Helper()
	return bench.Target{Name: name, BaseURL: simtest.Start(t, args...).URL + "/v1", Model: "qwen3-4b"}
}

// TestSimQuick runs a tiny sweep against the instant sim: the whole path
// (sim's SSE, usage, reasoning deltas) without waiting on a speed profile.
func TestSimQuick(t *testing.T) {
	target := simTarget(t, "instant", "--profile", "instant", "--", "-m", "q.gguf", "-a", "qwen3-4b", "--jinja")
	res, err := Sweep(context.Background(), target, Options{Levels: []int{1, 2}, OutputTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range res.Levels {
		if l.Failed != 0 || l.OutputTokens != l.Requests*16 {
			t.Errorf("level %+v: want every request to return the 16 tokens asked for", l)
		}
	}
}

// TestSimSeedTable measures the field report's Macs as the sim profiles them and
// checks the field report's table within 15%. It takes about a minute, so it runs
// only with FLEET_BENCH_SEED=1.
func TestSimSeedTable(t *testing.T) {
	if os.Getenv("FLEET_BENCH_SEED") != "1" {
		t.Skip("set FLEET_BENCH_SEED=1 to measure the seed's profiles (about a minute)")
	}
	seed := map[string][4]float64{ // 1 request, 2 total, 4 total, per request at 4
		"m1ultra-llamacpp": {80, 102, 139, 35},
		"m4max-llamacpp":   {87, 130, 136, 34},
	}
	names := []string{"m1ultra-llamacpp", "m4max-llamacpp"}
	// One after the other: the sim paces tokens with timers, and a starved
	// CPU shows up as late tokens, so the sweeps must not compete.
	var results []Result
	for _, name := range names {
		target := simTarget(t, name, "--profile", name, "--", "-m", "Qwen3-4B-Q4_K_M.gguf", "-a", "qwen3-4b",
			"-c", "16384", "-ngl", "99", "--jinja", "--reasoning-format", "none")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		r, err := Sweep(ctx, target, Options{})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		results = append(results, r)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("load average during the sweep: %s\n%s", strings.TrimSpace(string(load)), Table(results...))
	for _, r := range results {
		t.Logf("\n%s\n%s", r.Target, r.Detail())
		want := seed[r.Target]
		got := [4]float64{r.Levels[0].PerRequestTokPerS, r.Levels[1].TotalTokPerSec, r.Levels[2].TotalTokPerSec, r.Levels[2].PerRequestTokPerS}
		for k := range want {
			if math.Abs(got[k]-want[k]) > 0.15*want[k] {
				t.Errorf("%s column %d: measured %.1f, seed %.0f (more than 15%% off)", r.Target, k, got[k], want[k])
			}
		}
	}
}

// Multi-turn agent sessions against the sim's llama-server prompt cache:
// every turn after the first reuses its session's conversation, as the
// engine's own cached_tokens report; single turns reuse nothing.
func TestSimAgentTurnsReportCacheHits(t *testing.T) {
	var target bench.Target
	for _, tc := range []struct {
		turns    int
		min, max float64
	}{{1, 0, 0.05}, {4, 0.35, 1}} {
		// A fresh engine each time: sessions of the same number would hit
		// the previous run's prompts.
		target = simTarget(t, "instant", "--mimic", "llamacpp", "--profile", "instant", "--", "-m", "q.gguf", "-a", "qwen3-4b", "--jinja")
		res, err := Sweep(context.Background(), target, Options{Split: SplitAgent, Turns: tc.turns, Levels: []int{1, 2},
			RequestsPerLevel: 8, OutputTokens: 8, Warmup: -1})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range res.Levels {
			if l.CacheHit == nil {
				t.Fatalf("turns %d, concurrency %d: no cache hit, though llama-server reports cache_n", tc.turns, l.Concurrency)
			}
			t.Logf("turns %d, concurrency %d: prompt %d, cached %d, hit %.2f", tc.turns, l.Concurrency, l.PromptTokens, *l.CachedTokens, *l.CacheHit)
			if l.Failed != 0 || *l.CacheHit < tc.min || *l.CacheHit > tc.max {
				t.Errorf("turns %d, concurrency %d: cache hit %.2f (failed %d), want %.2f to %.2f", tc.turns, l.Concurrency, *l.CacheHit, l.Failed, tc.min, tc.max)
			}
		}
		if tc.turns > 1 && !strings.Contains(res.Text(), "in sessions of 4 turns") {
			t.Errorf("the text does not say the sessions' turns:\n%s", res.Text())
		}
	}
	if _, err := Sweep(context.Background(), target, Options{Split: SplitChat, Turns: 3}); err == nil || !strings.Contains(err.Error(), "agent") {
		t.Errorf("multi-turn chat split: %v, want an error naming the agent split", err)
	}
}

// TestSimVLLMCacheHitNeedsPromptTokensDetails: the sim mimics vLLM, which
// reports cached tokens only when launched with
// --enable-prompt-tokens-details. Without it the sweep says n/a (and why)
// rather than 0%; with it, the sessions' later turns show their reuse.
func TestSimVLLMCacheHitNeedsPromptTokensDetails(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		wantHit bool
	}{{"", false}, {"--enable-prompt-tokens-details", true}} {
		args := []string{"--mimic", "vllm", "--profile", "instant", "--", "serve", "qwen3-4b"}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		res, err := Sweep(context.Background(), simTarget(t, "vllm "+tc.flag, args...),
			Options{Split: SplitAgent, Turns: 3, Levels: []int{1}, OutputTokens: 8, Warmup: -1})
		if err != nil {
			t.Fatal(err)
		}
		l := res.Levels[0]
		switch {
		case l.Failed != 0:
			t.Errorf("%q: %d of %d requests failed: %v", tc.flag, l.Failed, l.Requests, l.Errors)
		case !tc.wantHit && (l.CacheHit != nil || !strings.Contains(res.Text(), "n/a: "+NoCacheCount)):
			t.Errorf("vLLM without --enable-prompt-tokens-details: cache hit %v, want n/a and why:\n%s", l.CacheHit, res.Text())
		case tc.wantHit && (l.CacheHit == nil || *l.CacheHit < 0.3):
			t.Errorf("vLLM with --enable-prompt-tokens-details: cache hit %v, want the later turns' reuse (over 30%%):\n%s", l.CacheHit, res.Text())
		}
	}
}
