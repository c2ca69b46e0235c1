package sim

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
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

// keyPaths lists every key path in v ("message.usage.input_tokens"), with
// list elements under "[]", so two answers' shapes compare whatever their
// values.
func keyPaths(prefix string, v any, into map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := prefix + "." + k
			into[p] = true
			keyPaths(p, e, into)
		}
	case []any:
		for _, e := range x {
			keyPaths(prefix+"[]", e, into)
		}
	}
}

func shapeOf(evs []namedEvent) map[string]bool {
	paths := map[string]bool{}
	for _, e := range evs {
		keyPaths(e.name, e.data, paths)
	}
	return paths
}

func diffPaths(a, b map[string]bool) (onlyA, onlyB []string) {
	for p := range a {
		if !b[p] {
			onlyA = append(onlyA, p)
		}
	}
	for p := range b {
		if !a[p] {
			onlyB = append(onlyB, p)
		}
	}
	slices.Sort(onlyA)
	slices.Sort(onlyB)
	return onlyA, onlyB
}

// TestAnthropicAndResponsesMatchRealLlamaServer sends the same /v1/messages
// and /v1/responses requests, streamed and not, to the real llama-server and
// to the llama mimic, and checks that the events come in the same order with
// the same fields, and that a repeated prompt is reported as read from the
// cache the same way (cache_read_input_tokens apart from input_tokens).
func TestAnthropicAndResponsesMatchRealLlamaServer(t *testing.T) {
	real := llamatest.Start(t, "-a", "qwen3-4b", "--jinja", "-np", "1", "-c", "2048")
	// The tiny model does not think; the sim is told not to either.
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b --jinja -np 1 --chat-template-kwargs {\"enable_thinking\":false}")
	type result struct {
		names                  map[string][]string
		shapes                 map[string]map[string]bool
		repeatCached, repeatIn int
		prompt                 int
	}
	// The tiny model's weights are random: it may end at once. A prompt
	// whose answer runs to max_tokens shows every event, and greedy
	// sampling (temperature 0) makes every later request for it do so too:
	// sampled, the same prompt's non-streamed answer sometimes ended at
	// once, with no content block to compare.
	anthropic := func(prompt string, maxTokens int) map[string]any {
		m := anthropic(prompt, maxTokens)
		m["temperature"] = 0
		return m
	}
	prompt := ""
	for _, p := range []string{"Tell me a story", "Write code", "abc def ghi", "Name three rivers", "Count to ten"} {
		evs := namedStream(t, real.URL+"/v1/messages", anthropic(p, 4))
		if slices.Contains(eventNames(evs), "content_block_delta") {
			prompt = p
			break
		}
	}
	if prompt == "" {
		t.Fatal("the real llama-server ended every prompt before a token; cannot compare the event shapes")
	}
	run := func(base string) result {
		r := result{names: map[string][]string{}, shapes: map[string]map[string]bool{}}
		body := anthropic(prompt, 4)
		code, whole := post(t, base+"/v1/messages", body)
		if code != 200 {
			t.Fatalf("%s /v1/messages: HTTP %d %v", base, code, whole)
		}
		// Text only: the values differ, the shape must not.
		r.shapes["messages"] = map[string]bool{}
		keyPaths("", whole, r.shapes["messages"])
		wu := whole["usage"].(map[string]any)
		r.prompt = num(wu["input_tokens"]) + num(wu["cache_read_input_tokens"])
		// This llama-server build leaves message_start out of a few
		// streams (3 of 40): one that lacks it is asked again.
		evs := namedStream(t, base+"/v1/messages", anthropic(prompt, 4))
		for try := 1; try < 5 && evs[0].name != "message_start"; try++ {
			t.Logf("%s sent no message_start (try %d)", base, try)
			http.DefaultClient.CloseIdleConnections()
			evs = namedStream(t, base+"/v1/messages", anthropic(prompt, 4))
		}
		r.names["messages stream"] = eventNames(evs)
		r.shapes["messages stream"] = shapeOf(evs)
		m, _ := evs[0].data["message"].(map[string]any)
		su, _ := m["usage"].(map[string]any)
		r.repeatCached, r.repeatIn = num(su["cache_read_input_tokens"]), num(su["input_tokens"])

		resp := map[string]any{"model": "qwen3-4b", "input": prompt, "max_output_tokens": 4, "temperature": 0}
		http.DefaultClient.CloseIdleConnections()
		code, whole = post(t, base+"/v1/responses", resp)
		if code != 200 {
			t.Fatalf("%s /v1/responses: HTTP %d %v", base, code, whole)
		}
		r.shapes["responses"] = map[string]bool{}
		keyPaths("", whole, r.shapes["responses"])
		evs = namedStream(t, base+"/v1/responses", resp)
		r.names["responses stream"] = eventNames(evs)
		r.shapes["responses stream"] = shapeOf(evs)

		// llama-server may close a connection after a stream without the
		// client noticing yet; a POST on it would fail, not be retried.
		http.DefaultClient.CloseIdleConnections()
		code, ct := post(t, base+"/v1/messages/count_tokens", anthropic(prompt, 4))
		if code != 200 {
			t.Fatalf("%s count_tokens: HTTP %d %v", base, code, ct)
		}
		r.shapes["count_tokens"] = map[string]bool{}
		keyPaths("", ct, r.shapes["count_tokens"])
		return r
	}
	got, want := run(ts.URL), run(real.URL)
	for k, names := range want.names {
		if !slices.Equal(got.names[k], names) {
			t.Errorf("%s events: sim %v, real %v", k, got.names[k], names)
		}
	}
	for k, shape := range want.shapes {
		if onlySim, onlyReal := diffPaths(got.shapes[k], shape); len(onlySim)+len(onlyReal) > 0 {
			t.Errorf("%s fields: only the sim has %v, only llama-server has %v", k, onlySim, onlyReal)
		}
	}
	for who, r := range map[string]result{"sim": got, "real": want} {
		t.Logf("%s: a %d-token prompt repeated: cache_read_input_tokens %d input_tokens %d", who, r.prompt, r.repeatCached, r.repeatIn)
		if r.repeatCached == 0 || r.repeatCached+r.repeatIn != r.prompt {
			t.Errorf("%s: the repeat of a %d-token prompt reads %d from cache and %d fresh; want most from cache, summing to the prompt",
				who, r.prompt, r.repeatCached, r.repeatIn)
		}
	}
	if t.Failed() {
		t.Log(strings.TrimSpace(real.Log()))
	}
}
