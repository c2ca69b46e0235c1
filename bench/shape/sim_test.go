package shape

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"fleet/bench"
	"fleet/router/reasoning"
	"fleet/sim/simtest"
)

// simWorker runs a real sim server in-process, parsed from the sim's argv
// exactly as `fleet sim` would parse it.
func simWorker(t *testing.T, args ...string) string {
	t.Helper()
	return simtest.Start(t, args...).URL
}

var (
	// The first field report's rig: vLLM with the Hermes tool parser and no reasoning parser.
	vllmArgs = []string{"--mimic", "vllm", "--profile", "instant", "--", "serve", "Qwen/Qwen3-4B-AWQ",
		"--served-model-name", "qwen3-4b", "--max-model-len", "16384", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"}
	// The first field report's Macs before the fix: llama-server with its default --reasoning-format.
	llamaArgs = []string{"--mimic", "llamacpp", "--profile", "instant", "--", "-m", "Qwen3-4B-Q4_K_M.gguf",
		"-a", "qwen3-4b", "-c", "16384", "-ngl", "99", "--jinja"}
	// And after it.
	llamaNoneArgs = append(append([]string{}, llamaArgs...), "--reasoning-format", "none")
)

func measureURL(t *testing.T, name, url string) Shape {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Measure(ctx, bench.Target{Name: name, BaseURL: url + "/v1", Model: "qwen3-4b"})
	if err != nil {
		t.Fatalf("measure %s: %v", name, err)
	}
	return s
}

func materialAspects(r Report) []string {
	var out []string
	for _, d := range r.Differences {
		if d.Material {
			out = append(out, d.Aspect)
		}
	}
	return out
}

func TestSimSeedDifference(t *testing.T) {
	rig := measureURL(t, "rig", simWorker(t, vllmArgs...))
	ultra := measureURL(t, "ultra", simWorker(t, llamaArgs...))
	r := Diff(rig, ultra)
	text := r.Text(120, false)
	t.Logf("\n%s", text)
	if r.Verdict != VerdictDiffers {
		t.Fatalf("vLLM vs llama.cpp default: verdict %s", r.Verdict)
	}
	got := materialAspects(r)
	if len(got) == 0 {
		t.Error("no material difference reported")
	}
	for _, aspect := range got {
		if aspect != "reasoning" {
			t.Errorf("material differences %v, want only where the reasoning is", got)
		}
	}
	if !strings.Contains(text, "reasoning in reasoning_content on ultra") || !strings.Contains(text, "inline <think> on rig") {
		t.Errorf("report does not name the seed's difference")
	}
	reasoning := find(t, ultra, RequestReasoning, false)
	if reasoning.Client.Content && !reasoning.Client.ReasoningContent {
		t.Errorf("go-openai view of llama default: %+v", reasoning.Client)
	}

	fixed := measureURL(t, "ultra", simWorker(t, llamaNoneArgs...))
	r = Diff(rig, fixed)
	if r.Verdict != VerdictSame {
		t.Errorf("with --reasoning-format none the shapes should match:\n%s", r.Text(120, false))
	}
}

// normalising proxies to upstream and rewrites reasoning as the router will.
func normalising(t *testing.T, upstream string, mode reasoning.Mode) string {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.Path, r.Body)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			body, _ := io.ReadAll(resp.Body)
			if out, err := reasoning.RewriteJSON(body, mode); err == nil {
				body = out
			}
			w.Write(body)
			return
		}
		rw := reasoning.NewStreamRewriter(mode)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			payload, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			for _, ev := range rw.Rewrite([]byte(payload)) {
				fmt.Fprintf(w, "data: %s\n\n", ev)
			}
			w.(http.Flusher).Flush()
		}
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestSimNormalisedShapes(t *testing.T) {
	vllmURL, llamaURL := simWorker(t, vllmArgs...), simWorker(t, llamaArgs...)
	for _, mode := range []reasoning.Mode{reasoning.Inline, reasoning.Field} {
		t.Run(string(mode), func(t *testing.T) {
			rig := measureURL(t, "rig", normalising(t, vllmURL, mode))
			ultra := measureURL(t, "ultra", normalising(t, llamaURL, mode))
			if ok, r := Matches(rig, ultra); !ok {
				t.Errorf("normalised %s: shapes differ:\n%s", mode, r.Text(120, false))
			}
			want := ReasoningInline
			if mode == reasoning.Field {
				want = ReasoningContentField
			}
			if p := find(t, ultra, RequestReasoning, true); p.Reasoning != want {
				t.Errorf("normalised %s: reasoning at %q, want %q", mode, p.Reasoning, want)
			}
		})
	}
}

// TestSimVLLMReasoningParser: vLLM ≥ 0.17 with a reasoning parser puts the
// thinking in "reasoning", which go-openai has no field for.
func TestSimVLLMReasoningParser(t *testing.T) {
	gpu := measureURL(t, "gpu", simWorker(t, append(append([]string{}, vllmArgs...), "--reasoning-parser", "qwen3")...))
	mac := measureURL(t, "mac", simWorker(t, llamaArgs...))
	p := find(t, gpu, RequestReasoning, false)
	if p.Reasoning != ReasoningField || p.Client.ReasoningContent {
		t.Errorf("vLLM parser: reasoning at %q, go-openai saw reasoning_content %v", p.Reasoning, p.Client.ReasoningContent)
	}
	if !strings.Contains(strings.Join(p.Client.Hidden, ","), "choices[].message.reasoning") {
		t.Errorf("hidden fields %v do not name choices[].message.reasoning", p.Client.Hidden)
	}
	r := Diff(gpu, mac)
	text := r.Text(400, false) // wide: one finding per line
	if r.Verdict != VerdictDiffers || !strings.Contains(text, "reasoning in reasoning (go-openai cannot see it) on gpu") {
		t.Errorf("diff does not say go-openai misses vLLM's reasoning:\n%s", text)
	}
}
