package reasoning

import (
	"encoding/json"
	"strings"
	"testing"
)

const (
	thinking = "Okay, 17 times 23: 17×20 is 340, 17×3 is 51, so 391."
	answer   = "17 × 23 = 391."
	inlined  = "<think>\n" + thinking + "\n</think>\n\n" + answer
)

// message decodes choices[0].message of a non-streamed body.
func message(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var resp struct {
		Choices []struct {
			Message map[string]any `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("rewritten body is not JSON: %v\n%s", err, body)
	}
	if len(resp.Choices) != 1 {
		t.Fatalf("want one choice, got %d in %s", len(resp.Choices), body)
	}
	return resp.Choices[0].Message
}

func completion(msg string) []byte {
	return []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"qwen3-4b",` +
		`"choices":[{"index":0,"finish_reason":"stop","message":` + msg + `}],` +
		`"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}`)
}

func jsonString(s string) string {
	return string(mustEncode(s))
}

func TestRewriteJSON(t *testing.T) {
	vllmInline := completion(`{"role":"assistant","content":` + jsonString(inlined) + `}`)
	vllmParser := completion(`{"role":"assistant","content":` + jsonString(answer) + `,"reasoning":` + jsonString(thinking) + `}`)
	vllmTransition := completion(`{"role":"assistant","content":` + jsonString(answer) + `,"reasoning":` + jsonString(thinking) + `,"reasoning_content":` + jsonString(thinking) + `}`)
	llamaDefault := completion(`{"role":"assistant","content":"","reasoning_content":` + jsonString(thinking) + `}`)
	llamaAnswer := completion(`{"role":"assistant","content":` + jsonString(answer) + `,"reasoning_content":` + jsonString(thinking) + `}`)
	plain := completion(`{"role":"assistant","content":"Hello there."}`)
	truncated := completion(`{"role":"assistant","content":"<think>\nOkay, 17 times"}`)
	nullReasoning := completion(`{"role":"assistant","content":"Hello there.","reasoning":null}`)
	cutOff := []byte(strings.Replace(string(llamaDefault), `"finish_reason":"stop"`, `"finish_reason":"length"`, 1))

	tests := []struct {
		name          string
		body          []byte
		mode          Mode
		wantContent   string
		wantReasoning string // reasoning_content; "" means the key must be absent
		unchanged     bool
	}{
		{"inline: vLLM inline stays", vllmInline, Inline, inlined, "", true},
		{"inline: vLLM reasoning field moves into content", vllmParser, Inline, inlined, "", false},
		{"inline: both field names from a vLLM in transition", vllmTransition, Inline, inlined, "", false},
		{"inline: llama-server default, empty content", llamaDefault, Inline, "<think>\n" + thinking + "\n</think>\n\n", "", false},
		{"inline: llama-server reasoning and answer", llamaAnswer, Inline, inlined, "", false},
		{"inline: a thought cut off by max_tokens stays open, as in a stream", cutOff, Inline, "<think>\n" + thinking, "", false},
		{"inline: no reasoning at all", plain, Inline, "Hello there.", "", true},
		{"inline: null reasoning field is dropped", nullReasoning, Inline, "Hello there.", "", false},
		{"field: vLLM inline is split", vllmInline, Field, answer, thinking, false},
		{"field: vLLM reasoning is renamed", vllmParser, Field, answer, thinking, false},
		{"field: llama-server stays", llamaAnswer, Field, answer, thinking, false},
		{"field: unclosed think is all reasoning", truncated, Field, "", "Okay, 17 times", false},
		{"field: no reasoning at all", plain, Field, "Hello there.", "", true},
		{"off: untouched", vllmParser, Off, answer, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RewriteJSON(tt.body, tt.mode)
			if err != nil {
				t.Fatalf("RewriteJSON: %v", err)
			}
			if tt.unchanged && string(got) != string(tt.body) {
				t.Errorf("body changed:\n got %s\nwant %s", got, tt.body)
			}
			if tt.mode == Off {
				return
			}
			msg := message(t, got)
			if c, _ := msg["content"].(string); c != tt.wantContent {
				t.Errorf("content = %q, want %q", c, tt.wantContent)
			}
			rc, has := msg["reasoning_content"]
			switch {
			case tt.wantReasoning == "" && has:
				t.Errorf("reasoning_content = %v, want it absent", rc)
			case tt.wantReasoning != "" && rc != tt.wantReasoning:
				t.Errorf("reasoning_content = %v, want %q", rc, tt.wantReasoning)
			}
			if _, has := msg["reasoning"]; has {
				t.Errorf("vLLM's reasoning field survived: %v", msg)
			}
			if strings.Contains(string(got), `\u003c`) {
				t.Errorf("tags were HTML-escaped: %s", got)
			}
			var top map[string]any
			_ = json.Unmarshal(got, &top)
			if top["usage"] == nil || top["id"] != "chatcmpl-1" {
				t.Errorf("envelope fields lost: %s", got)
			}
		})
	}
}

func TestRewriteJSONBadInput(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		mode    Mode
		wantErr string
		same    bool
	}{
		{"not JSON", `data: {"x":1}`, Inline, "not a JSON object", false},
		{"unknown mode", `{}`, Mode("sideways"), "unknown reasoning mode", false},
		{"error body passes", `{"error":{"message":"bad","type":"invalid_request_error","code":400}}`, Inline, "", true},
		{"embeddings pass", `{"object":"list","data":[{"embedding":[0.1]}]}`, Field, "", true},
		{"choices not an array", `{"choices":{"a":1}}`, Field, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RewriteJSON([]byte(tt.body), tt.mode)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("RewriteJSON: %v", err)
			}
			if tt.same && string(got) != tt.body {
				t.Errorf("body changed: %s", got)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"", Off, false},
		{"inline", Inline, false},
		{" Field ", Field, false},
		{"think", Off, true},
	}
	for _, tt := range tests {
		got, err := ParseMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "inline") {
			t.Errorf("error does not say what to use instead: %v", err)
		}
	}
}
