package sim

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"fleet/internal/llamatest"
)

// TestCacheFieldsMatchRealLlamaServer sends the same prompt twice to the
// real llama-server (the tiny GGUF) and to the llama mimic, and checks that
// both report the reuse in the same fields with the same arithmetic. The
// token counts differ (the tiny model's vocabulary is byte-level, the sim
// counts 4 bytes a token); what must agree is the shape and the rule.
func TestCacheFieldsMatchRealLlamaServer(t *testing.T) {
	real := llamatest.Start(t, "-a", "qwen3-4b", "--jinja", "--metrics", "-np", "1", "-c", "2048")
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b --jinja --metrics -np 1")
	prompt := "Summarise the design of a prefix-aware router for agent sessions."
	type answer struct {
		cacheN, promptN, cached, prompt int
		slot                            map[string]any
		cachedTotal                     int
	}
	run := func(base string) [2]answer {
		var out [2]answer
		for i := range out {
			code, resp := post(t, base+"/v1/chat/completions", chat(prompt, map[string]any{"max_tokens": 4}))
			if code != 200 {
				t.Fatalf("%s: HTTP %d %v", base, code, resp)
			}
			a := &out[i]
			a.cacheN, a.promptN, a.cached, a.prompt = cacheFields(t, resp)
			_, slots := getJSON(t, base+"/slots")
			a.slot = slots.([]any)[0].(map[string]any)
			_, metrics := getText(t, base+"/metrics")
			m := regexp.MustCompile(`(?m)^llamacpp:prompt_tokens_cached_total (\d+)`).FindStringSubmatch(metrics)
			if m == nil {
				t.Fatalf("%s /metrics has no llamacpp:prompt_tokens_cached_total", base)
			}
			a.cachedTotal, _ = strconv.Atoi(m[1])
		}
		return out
	}
	got := map[string][2]answer{"real": run(real.URL), "sim": run(ts.URL)}
	for who, a := range got {
		first, again := a[0], a[1]
		n := again.prompt
		t.Logf("%s: first cache_n %d prompt_n %d cached_tokens %d; repeat of %d tokens: cache_n %d prompt_n %d cached_tokens %d; idle slot holds %v tokens",
			who, first.cacheN, first.promptN, first.cached, n, again.cacheN, again.promptN, again.cached, again.slot["n_prompt_tokens"])
		if first.cacheN != 0 || first.promptN != first.prompt || first.cached != 0 {
			t.Errorf("%s first request: cache_n %d prompt_n %d cached_tokens %d of %d", who, first.cacheN, first.promptN, first.cached, first.prompt)
		}
		if again.cacheN != n-1 || again.promptN != 1 || again.cached != n-1 {
			t.Errorf("%s repeat: cache_n %d prompt_n %d cached_tokens %d of %d, want %d/1/%d", who, again.cacheN, again.promptN, again.cached, n, n-1, n-1)
		}
		if nt, ok := again.slot["next_token"].([]any); !ok || len(nt) != 1 {
			t.Errorf("%s /slots next_token %v is not a list of one", who, again.slot["next_token"])
		}
		for _, k := range []string{"n_prompt_tokens", "n_prompt_tokens_processed", "n_prompt_tokens_cache", "id_task", "n_ctx", "is_processing"} {
			if _, ok := again.slot[k]; !ok {
				t.Errorf("%s /slots entry lacks %s: %v", who, k, again.slot)
			}
		}
		// Idle again, the slot holds the prompt and the answer; the
		// per-request figures are reset on release.
		if held, _ := again.slot["n_prompt_tokens"].(float64); int(held) <= n || again.slot["n_prompt_tokens_cache"] != 0.0 || again.slot["n_prompt_tokens_processed"] != 0.0 {
			t.Errorf("%s /slots after the repeat: holds %v, cache %v processed %v", who, again.slot["n_prompt_tokens"], again.slot["n_prompt_tokens_cache"], again.slot["n_prompt_tokens_processed"])
		}
		if again.cachedTotal != n-1 {
			t.Errorf("%s llamacpp:prompt_tokens_cached_total %d, want %d", who, again.cachedTotal, n-1)
		}
	}
	if t.Failed() {
		t.Log(strings.TrimSpace(fmt.Sprint(real.Log())))
	}
}
