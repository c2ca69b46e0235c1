package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/enginectl"
	"fleet/internal/llamatest"
	"fleet/internal/sshdtest"
)

// TestRealLlamaServerThroughFleet: the llamacpp recipe launches the real
// llama-server (built by .ci/build-llama-server) over SSH on a node with the
// tests' own tiny GGUF; chat goes through the router, streamed and not; the
// hub's scrape path reads its /slots, /props and /metrics; and a repeated
// prompt shows the engine's own prompt-cache figures.
func TestRealLlamaServerThroughFleet(t *testing.T) {
	bin := llamatest.Binary(t)
	sshd := sshdtest.New(t)
	sshd.Start()
	modelDir := t.TempDir()
	model := llamatest.Model(t, modelDir)
	// The engine outlives the hub by design; this test's engine is the one
	// whose argv names this test's model file. Registered before the hub so
	// it runs after the hub has stopped.
	t.Cleanup(func() { killArgvContaining(model) })

	file := filepath.Join(t.TempDir(), "fleet.yaml")
	fleetYAML := fmt.Sprintf(`nodes:
  - name: real
    address: %s
    identity: %s
models:
  - id: tiny
    context: 2048
    memory_gb: 0.1
    recipes:
      llamacpp:
        model: %s
        bin: %s
        args: [--jinja, --metrics, -t, "1"]
placements:
  - model: tiny
    node: real
    engine: llamacpp
`, sshd.Address(), sshd.Identity(), model, bin)
	if err := os.WriteFile(file, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	hub := startFleetHub(t, data, freePort(t), file)
	base := "http://" + hub.http
	w := waitWorker(t, data, "real/tiny", "ready", 180*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
	if len(w.LaunchArgv) == 0 || w.LaunchArgv[0] != bin || w.Simulated {
		t.Fatalf("launch argv %q (simulated %v), want the real %s", w.LaunchArgv, w.Simulated, bin)
	}

	// Non-streamed chat through the router.
	prompt := "Tell me about prompt caches in inference engines."
	body := func(stream bool) string {
		return fmt.Sprintf(`{"model":"tiny","stream":%v,"stream_options":{"include_usage":true},"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, stream, prompt)
	}
	first := postChat(t, base, body(false))
	if c, ok := first.Choices[0].Message["content"].(string); !ok || c == "" || first.Usage.PromptTokens == 0 {
		t.Fatalf("non-streamed answer through the router: %+v", first)
	}

	// The same prompt again: llama-server reuses all but the last token.
	again := postChat(t, base, body(false))
	n := again.Usage.PromptTokens
	t.Logf("real llama-server, repeated %d-token prompt: cache_n %d, prompt_n %d, cached_tokens %d (first time: cache_n %d, prompt_n %d)",
		n, again.Timings.CacheN, again.Timings.PromptN, again.Usage.Details.CachedTokens, first.Timings.CacheN, first.Timings.PromptN)
	if again.Timings.CacheN != n-1 || again.Timings.PromptN != 1 || again.Usage.Details.CachedTokens != n-1 {
		t.Errorf("repeat: cache_n %d prompt_n %d cached_tokens %d of %d prompt tokens; want %d, 1, %d",
			again.Timings.CacheN, again.Timings.PromptN, again.Usage.Details.CachedTokens, n, n-1, n-1)
	}

	// Streamed chat through the router: content chunks, the usage chunk, [DONE].
	r := chatStreamBody(base, body(true), 60*time.Second)
	if r.status != 200 || r.err != nil || len(r.events) < 3 || r.events[len(r.events)-1] != "[DONE]" {
		t.Fatalf("stream through the router: HTTP %d, err %v, events %q, body %q", r.status, r.err, r.events, r.body)
	}
	var usage chatAnswer
	if err := json.Unmarshal([]byte(r.events[len(r.events)-2]), &usage); err != nil || usage.Usage.PromptTokens != n {
		t.Errorf("streamed usage chunk %q: %v", r.events[len(r.events)-2], err)
	}

	// The hub's scrape path reads /slots, /props and /metrics of the engine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	load, err := enginectl.Scrape(ctx, enginectl.LocalRunner{}, w.Port, fleet.EngineLlamaCpp)
	if err != nil || load.Slots != w.Slots || load.Running != 0 {
		t.Errorf("scrape of the real engine: %+v, %v; want %d idle slots", load, err, w.Slots)
	}
	engine := "http://127.0.0.1:" + strconv.Itoa(w.Port)
	var props struct {
		TotalSlots int    `json:"total_slots"`
		Template   string `json:"chat_template"`
	}
	getEngineJSON(t, engine+"/props", &props)
	if props.TotalSlots != w.Slots || !strings.Contains(props.Template, "<|im_start|>") {
		t.Errorf("/props: total_slots %d, chat template %q", props.TotalSlots, props.Template)
	}
	var slots []map[string]any
	getEngineJSON(t, engine+"/slots", &slots)
	if len(slots) != w.Slots {
		t.Errorf("/slots lists %d slots, want %d", len(slots), w.Slots)
	}
	metrics := getEngineText(t, engine+"/metrics")
	if !strings.Contains(metrics, "llamacpp:prompt_tokens_cached_total ") || !strings.Contains(metrics, "llamacpp:requests_deferred ") {
		t.Errorf("/metrics lacks the prompt-cache or queue figures:\n%s", metrics)
	}
}

// chatAnswer is the part of a chat completion these tests read.
type chatAnswer struct {
	Choices []struct {
		Message map[string]any `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		Details          struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings struct {
		CacheN   int     `json:"cache_n"`
		PromptN  int     `json:"prompt_n"`
		PromptMs float64 `json:"prompt_ms"`
		// PredictedMs is the engine's decode time: a non-streamed
		// answer's time to first token is its latency less this.
		PredictedMs float64 `json:"predicted_ms"`
	} `json:"timings"`
}

func postChat(t *testing.T, base, body string) chatAnswer {
	t.Helper()
	a, err := postChatErr(base, body)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	return a
}

// postChatErr is postChat for goroutines: it returns the error instead of
// failing the test.
func postChatErr(base, body string) (chatAnswer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return chatAnswer{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a chatAnswer
	if resp.StatusCode != 200 || json.Unmarshal(raw, &a) != nil || len(a.Choices) != 1 || a.Usage.PromptTokens == 0 {
		return a, fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return a, nil
}

// chatStreamBody is chatStream with a body of the caller's.
func chatStreamBody(base, body string, within time.Duration) streamResult {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamResult{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	r := streamResult{status: resp.StatusCode, err: err}
	if resp.StatusCode != 200 {
		r.body = string(raw)
		return r
	}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			r.events = append(r.events, string(d))
		}
	}
	return r
}

func getEngineJSON(t *testing.T, url string, into any) {
	t.Helper()
	if err := json.Unmarshal([]byte(getEngineText(t, url)), into); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

func getEngineText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: HTTP %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// killArgvContaining kills the processes whose command line has an argument
// equal to arg (a path in this test's temp dir, so never anyone else's).
func killArgvContaining(arg string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(b), "\x00") {
			if a == arg {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}
