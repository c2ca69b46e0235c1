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

// TestSimSeedTable measures the seed's Macs as the sim profiles them and
// checks the seed's table within 15%. It takes about a minute, so it runs
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
