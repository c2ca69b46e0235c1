package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// seedTable is what the first field report (docs/field-reports.md)
// measured: total tok/s at 1, 2 and 4 concurrent 256-token requests.
var seedTable = map[string][3]float64{
	"m1ultra-llamacpp":    {80, 102, 139},
	"m4max-llamacpp":      {87, 130, 136},
	"m1ultra-27b-starved": {10.7, 12.8, 15},
	"rtx3060-vllm":        {90, 170, 320},
	"rtx5060ti-vllm":      {96, 180, 330},
}

type levelResult struct {
	perRequest float64 // mean per-request decode speed, (n-1)/(last-first)
	aggregate  float64 // all tokens / wall time, prefill and ramp included
	ttft       time.Duration
}

// measureLevel runs a closed loop of `concurrency` clients, each sending
// `rounds` 256-token streaming requests back to back.
func measureLevel(t *testing.T, profile string, concurrency, rounds int) levelResult {
	p, err := LookupProfile(profile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(Options{Mimic: p.Mimic, Profile: p, ServedNames: []string{"qwen3-4b"}, Slots: p.Slots})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	body, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "stream": true, "max_tokens": 256,
		"chat_template_kwargs": map[string]any{"enable_thinking": false},
		// About 45 prompt tokens, as in the field report's runs.
		"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("Explain how a router balances load. ", 5)}},
	})
	var mu sync.Mutex
	var speeds []float64
	var ttfts []time.Duration
	tokens := 0
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				sent := time.Now()
				resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				var first, last time.Time
				n := 0
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if line := sc.Text(); strings.HasPrefix(line, "data: {") && strings.Contains(line, `"content":"`) &&
						!strings.Contains(line, `"content":""`) {
						now := time.Now()
						if n == 0 {
							first = now
						}
						last = now
						n++
					}
				}
				resp.Body.Close()
				mu.Lock()
				tokens += n
				if n > 1 {
					speeds = append(speeds, float64(n-1)/last.Sub(first).Seconds())
					ttfts = append(ttfts, first.Sub(sent))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var r levelResult
	for i, s := range speeds {
		r.perRequest += s / float64(len(speeds))
		r.ttft += ttfts[i] / time.Duration(len(speeds))
	}
	r.aggregate = float64(tokens) / wall.Seconds()
	return r
}

// TestCalibrate measures every calibrated profile the way the field report did and
// prints the table beside the field report's. It takes a couple of minutes of
// mostly sleeping, so it only runs with FLEET_SIM_CALIBRATE=1.
func TestCalibrate(t *testing.T) {
	if os.Getenv("FLEET_SIM_CALIBRATE") != "1" {
		t.Skip("set FLEET_SIM_CALIBRATE=1 to measure the profiles against the seed's table")
	}
	rounds := 2
	if v, err := strconv.Atoi(os.Getenv("FLEET_SIM_CALIBRATE_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	levels := []int{1, 2, 4}
	names := []string{"m1ultra-llamacpp", "m4max-llamacpp", "m1ultra-27b-starved", "rtx3060-vllm", "rtx5060ti-vllm"}
	results := make(map[string][]levelResult)
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Every (profile, level) has its own server, so all run at once: the
	// servers mostly sleep.
	for _, name := range names {
		results[name] = make([]levelResult, len(levels))
		for i, c := range levels {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := measureLevel(t, name, c, rounds)
				mu.Lock()
				results[name][i] = r
				mu.Unlock()
			}()
		}
	}
	wg.Wait()

	var out strings.Builder
	fmt.Fprintf(&out, "\n%-20s %4s %10s %12s %8s %10s %9s\n", "profile", "conc", "seed total", "sim c×per-req", "diff", "aggregate", "ttft")
	worst := 0.0
	for _, name := range names {
		for i, c := range levels {
			r := results[name][i]
			want := seedTable[name][i]
			got := r.perRequest * float64(c)
			diff := (got - want) / want * 100
			if d := max(diff, -diff); d > worst {
				worst = d
			}
			fmt.Fprintf(&out, "%-20s %4d %10.1f %12.1f %+7.1f%% %10.1f %9s\n", name, c, want, got, diff, r.aggregate, r.ttft.Round(time.Millisecond))
		}
	}
	fmt.Fprintf(&out, "worst deviation from the seed: %.1f%%\n", worst)
	t.Log(out.String())
	if worst > 5 {
		t.Errorf("a profile is more than 5%% off the seed's table")
	}
}
