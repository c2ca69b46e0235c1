package simulate

import (
	"encoding/json"
	"strings"
	"testing"

	"fleet/router"
)

var baselines = []string{router.PolicyP2CLeastLoaded, router.PolicyRoundRobin, router.PolicyRandom}

func run(t *testing.T, name string, load float64) map[string]Result {
	t.Helper()
	s, err := Builtin(name, load)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(s, append([]string{router.PolicyFleet}, baselines...))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Result{}
	for _, r := range res {
		out[r.Policy] = r
		t.Logf("%s %.0f%% %-17s p50/p99 TTFT %6.0f/%6.0f ms  p50/p99 E2E %6.0f/%6.0f ms  rejected %d  share %v",
			name, load*100, r.Policy, r.P50TTFTms, r.P99TTFTms, r.P50E2Ems, r.P99E2Ems, r.Rejected, r.Share)
		if r.Requests+r.Rejected != s.Requests {
			t.Errorf("%s: %d served + %d rejected of %d", r.Policy, r.Requests, r.Rejected, s.Requests)
		}
	}
	return out
}

// The targets: on seed-mixed at 70% load, fleet's p99 E2E is at most
// 0.6× p2c-least-loaded's and below round-robin's and random's.
func TestSeedMixedTarget(t *testing.T) {
	res := run(t, "seed-mixed", 0.7)
	fleet := res[router.PolicyFleet]
	if p2c := res[router.PolicyP2CLeastLoaded]; fleet.P99E2Ems > 0.6*p2c.P99E2Ems {
		t.Errorf("fleet p99 E2E %.0f ms > 0.6 × p2c's %.0f ms", fleet.P99E2Ems, p2c.P99E2Ems)
	}
	for _, b := range []string{router.PolicyRoundRobin, router.PolicyRandom} {
		if fleet.P99E2Ems >= res[b].P99E2Ems {
			t.Errorf("fleet p99 E2E %.0f ms not below %s's %.0f ms", fleet.P99E2Ems, b, res[b].P99E2Ems)
		}
	}
	// The starved 27B is what p2c falls for; fleet must keep traffic off it.
	if share := fleet.Share["ultra27/qwen3-4b"]; share > 0.01 {
		t.Errorf("fleet sent %.1f%% of requests to the starved 27B", share*100)
	}
}

// On equal workers fleet must be no worse than the best baseline by more than 5%.
func TestHomogeneousTarget(t *testing.T) {
	for _, load := range []float64{0.5, 0.7} {
		res := run(t, "homogeneous", load)
		best := res[baselines[0]].P99E2Ems
		for _, b := range baselines {
			best = min(best, res[b].P99E2Ems)
		}
		if f := res[router.PolicyFleet].P99E2Ems; f > 1.05*best {
			t.Errorf("load %.1f: fleet p99 E2E %.0f ms > 1.05 × best baseline %.0f ms", load, f, best)
		}
	}
}

func TestBurstAndLoadsRunClean(t *testing.T) {
	for _, load := range []float64{0.3, 0.9} {
		for _, name := range Scenarios() {
			res := run(t, name, load)
			for _, r := range res {
				sum := 0.0
				for _, v := range r.Share {
					sum += v
				}
				if r.Requests > 0 && (sum < 0.999 || sum > 1.001) {
					t.Errorf("%s %s: shares sum to %f", name, r.Policy, sum)
				}
				if r.P50E2Ems <= 0 || r.P50E2Ems > r.P99E2Ems || r.P50TTFTms > r.P99TTFTms {
					t.Errorf("%s %s: implausible percentiles %+v", name, r.Policy, r)
				}
			}
		}
	}
}

func TestDeterministic(t *testing.T) {
	s, _ := Builtin("burst", 0.7)
	a, _ := Run(s, router.PolicyNames)
	b, _ := Run(s, router.PolicyNames)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Error("two runs of the same scenario differ")
	}
	for _, key := range []string{`"policy"`, `"p50_ttft_ms"`, `"p99_ttft_ms"`, `"p50_e2e_ms"`, `"p99_e2e_ms"`, `"share"`} {
		if !strings.Contains(string(ja), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}

func TestBadInput(t *testing.T) {
	good, _ := Builtin("seed-mixed", 0.7)
	noWorkers := good
	noWorkers.Workers = nil
	badCurve := good
	badCurve.Workers = []WorkerSpec{{Name: "x", Slots: 1, PrefillTokPerSec: 100, TokPerSec: []CurvePoint{{4, 10}, {1, 20}}}}
	cases := []struct {
		name     string
		s        Scenario
		policies []string
		want     string
	}{
		{"unknown policy", good, []string{"fastest"}, "unknown scheduling policy"},
		{"no workers", noWorkers, []string{"fleet"}, "no workers"},
		{"unsorted curve", badCurve, []string{"fleet"}, "ascend"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Run(tc.s, tc.policies); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want it to mention %q", err, tc.want)
			}
		})
	}
	if _, err := Builtin("nope", 0.7); err == nil {
		t.Error("unknown scenario accepted")
	}
	if _, err := Builtin("seed-mixed", 0); err == nil {
		t.Error("zero load accepted")
	}
}
