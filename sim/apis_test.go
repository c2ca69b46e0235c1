package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// namedEvent is one SSE event of an Anthropic or Responses stream.
type namedEvent struct {
	name string
	data map[string]any
}

// namedStream posts a streaming request and returns its events, checking
// that each event: line matches its data's type.
func namedStream(t *testing.T, url string, body map[string]any) []namedEvent {
	t.Helper()
	resp := postStream(t, url, body)
	defer resp.Body.Close()
	var out []namedEvent
	var name string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("%s: event data not JSON: %q", url, line)
			}
			if d["type"] != name {
				t.Errorf("%s: event %q carries type %v", url, name, d["type"])
			}
			out = append(out, namedEvent{name, d})
		default:
			t.Fatalf("%s: unexpected SSE line %q", url, line)
		}
	}
	return out
}

// eventNames lists the event names with repeats of one name collapsed.
func eventNames(evs []namedEvent) []string {
	var names []string
	for _, e := range evs {
		if len(names) == 0 || names[len(names)-1] != e.name {
			names = append(names, e.name)
		}
	}
	return names
}

func num(v any) int {
	f, _ := v.(float64)
	return int(f)
}

func anthropic(prompt string, maxTokens int) map[string]any {
	return map[string]any{"model": "qwen3-4b", "max_tokens": maxTokens, "system": "You are terse.",
		"thinking": map[string]any{"type": "disabled"},
		"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": prompt}}}}}
}

func TestMessagesStreamAndNot(t *testing.T) {
	for _, mimic := range []string{"llamacpp", "vllm"} {
		t.Run(mimic, func(t *testing.T) {
			_, ts := startSim(t, "--mimic "+mimic+" --profile instant -- -a qwen3-4b --served-model-name qwen3-4b --jinja")
			code, whole := post(t, ts.URL+"/v1/messages", anthropic("Describe the fleet in a few words.", 12))
			if code != 200 || whole["type"] != "message" || whole["role"] != "assistant" || whole["stop_reason"] != "max_tokens" {
				t.Fatalf("non-streamed: HTTP %d %v", code, whole)
			}
			blocks, _ := whole["content"].([]any)
			if len(blocks) != 1 || blocks[0].(map[string]any)["type"] != "text" {
				t.Fatalf("content blocks %v, want one text block", blocks)
			}
			text := blocks[0].(map[string]any)["text"].(string)
			evs := namedStream(t, ts.URL+"/v1/messages", anthropic("Describe the fleet in a few words.", 12))
			want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
			if got := eventNames(evs); !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
			var streamed strings.Builder
			for _, e := range evs {
				if e.name == "content_block_delta" {
					streamed.WriteString(e.data["delta"].(map[string]any)["text"].(string))
				}
			}
			if streamed.String() != text {
				t.Errorf("streamed text %q, non-streamed %q", streamed.String(), text)
			}
			start := evs[0].data["message"].(map[string]any)
			su := start["usage"].(map[string]any)
			end := evs[len(evs)-2].data
			eu := end["usage"].(map[string]any)
			if end["delta"].(map[string]any)["stop_reason"] != "max_tokens" || num(eu["output_tokens"]) != 12 || num(su["output_tokens"]) != 0 {
				t.Errorf("message_start usage %v, message_delta %v", su, end)
			}
			wu := whole["usage"].(map[string]any)
			prompt := num(wu["input_tokens"]) + num(wu["cache_read_input_tokens"])
			if mimic == "llamacpp" {
				// The repeat is served from the slot's cache, which
				// llama-server reports apart from the uncached input.
				if num(su["cache_read_input_tokens"]) != prompt-1 || num(su["input_tokens"]) != 1 {
					t.Errorf("llama repeat of a %d-token prompt: message_start usage %v, want cache_read %d input 1", prompt, su, prompt-1)
				}
			} else if _, ok := su["cache_read_input_tokens"]; ok || num(su["input_tokens"]) != prompt || num(eu["input_tokens"]) != prompt {
				t.Errorf("vLLM usage: start %v end %v, want input_tokens %d and no cache field", su, eu, prompt)
			}
		})
	}
}

func TestMessagesToolUse(t *testing.T) {
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b --jinja")
	body := anthropic("What is the weather in Paris?", 200)
	body["tools"] = []any{map[string]any{"name": "get_weather", "description": "weather",
		"input_schema": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}}}
	code, whole := post(t, ts.URL+"/v1/messages", body)
	blocks, _ := whole["content"].([]any)
	if code != 200 || whole["stop_reason"] != "tool_use" || len(blocks) == 0 {
		t.Fatalf("HTTP %d %v", code, whole)
	}
	use := blocks[len(blocks)-1].(map[string]any)
	if use["type"] != "tool_use" || use["name"] != "get_weather" || use["input"].(map[string]any)["city"] != "Paris" {
		t.Errorf("tool_use block %v", use)
	}
	var args strings.Builder
	for _, e := range namedStream(t, ts.URL+"/v1/messages", body) {
		if d, _ := e.data["delta"].(map[string]any); d["type"] == "input_json_delta" {
			args.WriteString(d["partial_json"].(string))
		}
	}
	if args.String() != `{"city":"Paris"}` {
		t.Errorf("streamed tool input %q", args.String())
	}
}

func TestMessagesBadRequests(t *testing.T) {
	_, ts := startSim(t, "--mimic vllm --profile instant --load-time 0s -- qwen3-4b")
	for name, body := range map[string]string{
		"no max_tokens": `{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}]}`,
		"no messages":   `{"model":"qwen3-4b","max_tokens":4,"messages":[]}`,
	} {
		if code, resp := post(t, ts.URL+"/v1/messages", body); code != 400 {
			t.Errorf("%s: HTTP %d %v, want 400", name, code, resp)
		}
	}
}

func TestResponsesStreamAndNot(t *testing.T) {
	for _, mimic := range []string{"llamacpp", "vllm"} {
		t.Run(mimic, func(t *testing.T) {
			_, ts := startSim(t, "--mimic "+mimic+" --profile instant -- -a qwen3-4b --served-model-name qwen3-4b --chat-template-kwargs {\"enable_thinking\":false}")
			body := func() map[string]any {
				return map[string]any{"model": "qwen3-4b", "instructions": "Be brief.", "max_output_tokens": 10,
					"input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Name a fleet."}}}}}
			}
			code, whole := post(t, ts.URL+"/v1/responses", body())
			out, _ := whole["output"].([]any)
			if code != 200 || whole["object"] != "response" || len(out) != 1 {
				t.Fatalf("HTTP %d %v", code, whole)
			}
			text := out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"].(string)
			evs := namedStream(t, ts.URL+"/v1/responses", body())
			final := "response.completed"
			if mimic == "vllm" {
				final = "response.incomplete" // cut by max_output_tokens
			}
			want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", final}
			if got := eventNames(evs); !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
			var streamed strings.Builder
			for i, e := range evs {
				if e.name == "response.output_text.delta" {
					streamed.WriteString(e.data["delta"].(string))
				}
				if _, ok := e.data["sequence_number"]; ok != (mimic == "vllm") || (ok && num(e.data["sequence_number"]) != i) {
					t.Errorf("event %d %s: sequence_number %v", i, e.name, e.data["sequence_number"])
				}
			}
			if streamed.String() != text || text == "" {
				t.Errorf("streamed %q, non-streamed %q", streamed.String(), text)
			}
			u := evs[len(evs)-1].data["response"].(map[string]any)["usage"].(map[string]any)
			if num(u["output_tokens"]) != 10 || num(u["total_tokens"]) != num(u["input_tokens"])+10 {
				t.Errorf("usage %v", u)
			}
		})
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	for mimic, keys := range map[string][2]string{"llamacpp": {"content", "content"}, "vllm": {"prompt", "prompt"}} {
		_, ts := startSim(t, "--mimic "+mimic+" --profile instant --load-time 0s -- -a qwen3-4b --served-model-name qwen3-4b")
		text := "Route every endpoint by its model."
		code, tok := post(t, ts.URL+"/tokenize", map[string]any{"model": "qwen3-4b", keys[0]: text})
		ids, _ := tok["tokens"].([]any)
		if code != 200 || len(ids) != promptTokens(text) {
			t.Fatalf("%s /tokenize: HTTP %d %v, want %d tokens", mimic, code, tok, promptTokens(text))
		}
		if mimic == "vllm" && num(tok["count"]) != len(ids) {
			t.Errorf("vllm /tokenize count %v of %d tokens", tok["count"], len(ids))
		}
		code, det := post(t, ts.URL+"/detokenize", map[string]any{"model": "qwen3-4b", "tokens": ids})
		if code != 200 || det[keys[1]] != text {
			t.Errorf("%s /detokenize: HTTP %d %v, want %q", mimic, code, det, text)
		}
		code, ct := post(t, ts.URL+"/v1/messages/count_tokens", anthropic("hello", 1))
		if code != 200 || num(ct["input_tokens"]) != promptTokens("You are terse.hello") {
			t.Errorf("%s count_tokens: HTTP %d %v", mimic, code, ct)
		}
	}
}

func TestChoicesN(t *testing.T) {
	_, ts := startSim(t, "--mimic vllm --profile instant --load-time 0s -- qwen3-4b")
	code, resp := post(t, ts.URL+"/v1/chat/completions", chat("Name a fleet.", map[string]any{"n": 3, "max_tokens": 5, "chat_template_kwargs": map[string]any{"enable_thinking": false}}))
	choices, _ := resp["choices"].([]any)
	if code != 200 || len(choices) != 3 {
		t.Fatalf("vLLM n=3: HTTP %d, %d choices: %v", code, len(choices), resp)
	}
	texts := map[string]bool{}
	for i, c := range choices {
		c := c.(map[string]any)
		if num(c["index"]) != i {
			t.Errorf("choice %d has index %v", i, c["index"])
		}
		texts[c["message"].(map[string]any)["content"].(string)] = true
	}
	if len(texts) != 3 {
		t.Errorf("the 3 choices are not 3 different answers: %v", texts)
	}
	if u := resp["usage"].(map[string]any); num(u["completion_tokens"]) != 15 {
		t.Errorf("usage %v, want 15 completion tokens (3 × 5)", u)
	}
	chunks, done := stream(t, ts.URL+"/v1/completions", map[string]any{"model": "qwen3-4b", "prompt": "A fleet", "n": 2, "max_tokens": 4,
		"stream_options": map[string]any{"include_usage": true}})
	perIndex := map[int]int{}
	for _, c := range chunks {
		for _, ch := range c["choices"].([]any) {
			if t := ch.(map[string]any)["text"].(string); t != "" {
				perIndex[num(ch.(map[string]any)["index"])]++
			}
		}
	}
	if !done || perIndex[0] != 4 || perIndex[1] != 4 || num(chunks[len(chunks)-1]["usage"].(map[string]any)["completion_tokens"]) != 8 {
		t.Errorf("streamed n=2: tokens per choice %v, last chunk %v", perIndex, chunks[len(chunks)-1])
	}

	// vLLM refuses more than VLLM_MAX_N_SEQUENCES (16384) choices.
	for _, n := range []int64{16385, 1<<63 - 1} {
		code, resp = post(t, ts.URL+"/v1/chat/completions", chat("Name a fleet.", map[string]any{"n": n, "max_tokens": 8}))
		if msg, _ := resp["error"].(map[string]any)["message"].(string); code != 400 || !strings.Contains(msg, fmt.Sprintf("n must be at most 16384, got %d.", n)) {
			t.Errorf("vLLM n=%d: HTTP %d %v, want its 400", n, code, resp)
		}
	}

	_, ts = startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b")
	code, resp = post(t, ts.URL+"/v1/chat/completions", chat("Name a fleet.", map[string]any{"n": 2}))
	if msg, _ := resp["error"].(map[string]any)["message"].(string); code != 400 || !strings.Contains(msg, "Field 'n'") {
		t.Errorf("llama-server n=2: HTTP %d %v, want its 400", code, resp)
	}
}

// TestMessagesThinkingBlocks: thoughts go to a thinking block before the
// text; llama-server closes every block at the end (the thinking one with an
// empty signature), vLLM each block when the next starts (signed).
func TestMessagesThinkingBlocks(t *testing.T) {
	for mimic, want := range map[string][]string{
		"llamacpp": {"start 0 thinking", "delta 0 thinking_delta", "start 1 text", "delta 1 text_delta", "delta 0 signature_delta", "stop 0", "stop 1"},
		"vllm":     {"start 0 thinking", "delta 0 thinking_delta", "delta 0 signature_delta", "stop 0", "start 1 text", "delta 1 text_delta", "stop 1"},
	} {
		_, ts := startSim(t, "--mimic "+mimic+" --profile instant -- -a qwen3-4b --served-model-name qwen3-4b --reasoning-parser qwen3")
		body := anthropic("Describe the fleet.", 200)
		body["thinking"] = map[string]any{"type": "enabled"}
		var got []string
		signature := ""
		for _, e := range namedStream(t, ts.URL+"/v1/messages", body) {
			idx := num(e.data["index"])
			var step string
			switch e.name {
			case "content_block_start":
				step = fmt.Sprintf("start %d %v", idx, e.data["content_block"].(map[string]any)["type"])
			case "content_block_delta":
				d := e.data["delta"].(map[string]any)
				step = fmt.Sprintf("delta %d %v", idx, d["type"])
				if d["type"] == "signature_delta" {
					signature = d["signature"].(string)
				}
			case "content_block_stop":
				step = fmt.Sprintf("stop %d", idx)
			default:
				continue
			}
			if len(got) == 0 || got[len(got)-1] != step {
				got = append(got, step)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s blocks %v, want %v", mimic, got, want)
		}
		if (signature == "") != (mimic == "llamacpp") {
			t.Errorf("%s signature %q", mimic, signature)
		}
	}
}

// TestResponsesReasoningAndToolCall: thoughts become a reasoning item and a
// structured tool call a function_call item, streamed and not.
func TestResponsesReasoningAndToolCall(t *testing.T) {
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b --jinja")
	body := func() map[string]any {
		return map[string]any{"model": "qwen3-4b", "input": "What is the weather in Paris?", "max_output_tokens": 400,
			"tools": []any{map[string]any{"type": "function", "name": "get_weather",
				"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}}}}
	}
	code, whole := post(t, ts.URL+"/v1/responses", body())
	out, _ := whole["output"].([]any)
	if code != 200 || len(out) != 2 {
		t.Fatalf("HTTP %d output %v", code, whole["output"])
	}
	rs, fc := out[0].(map[string]any), out[1].(map[string]any)
	if rs["type"] != "reasoning" || fc["type"] != "function_call" || fc["name"] != "get_weather" || fc["arguments"] != `{"city":"Paris"}` ||
		!strings.HasPrefix(fc["call_id"].(string), "call_") {
		t.Errorf("output items %v", out)
	}
	evs := namedStream(t, ts.URL+"/v1/responses", body())
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta",
		"response.output_item.added", "response.function_call_arguments.delta", "response.output_item.done", "response.completed"}
	if got := eventNames(evs); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	var args strings.Builder
	for _, e := range evs {
		if e.name == "response.function_call_arguments.delta" {
			args.WriteString(e.data["delta"].(string))
		}
	}
	if args.String() != `{"city":"Paris"}` {
		t.Errorf("streamed arguments %q", args.String())
	}
}
