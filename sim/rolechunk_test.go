package sim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestRoleChunkComesWithTheFirstToken: both mimics send a chat stream's
// role-only chunk after prefill, with the first token, as real vLLM does (its
// role chunk is made by the engine step that makes the first token); a
// proxy timing the first chunk then sees the prefill. The check is a lower
// bound only: a slow machine can delay the chunk, never hasten it.
func TestRoleChunkComesWithTheFirstToken(t *testing.T) {
	for _, mimic := range []string{"vllm", "llamacpp"} {
		t.Run(mimic, func(t *testing.T) {
			p := Profile{Name: "prefill", Curve: []SpeedPoint{{Concurrency: 1, TotalTokPerSec: 1000}}, Slots: 2, KVCacheTokens: 100000, PromptTokPerSec: 100}
			srv, err := NewServer(Options{Mimic: fleetKind(mimic), Profile: p, ServedNames: []string{"m"}, Slots: 2})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(srv.Handler())
			defer ts.Close()
			body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,` +
				`"messages":[{"role":"user","content":"` + strings.Repeat("tell me more about prefill ", 6) + `"}]}`
			sent := time.Now()
			resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var first time.Duration
			var role bool
			prompt := 0
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						Delta struct {
							Role string `json:"role"`
						} `json:"delta"`
					} `json:"choices"`
					Usage *struct {
						PromptTokens int `json:"prompt_tokens"`
					} `json:"usage"`
				}
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					t.Fatalf("chunk is not JSON: %s", data)
				}
				if first == 0 {
					first = time.Since(sent)
					role = len(c.Choices) == 1 && c.Choices[0].Delta.Role == "assistant"
				}
				if c.Usage != nil {
					prompt = c.Usage.PromptTokens
				}
			}
			if !role {
				t.Fatal("the first chunk is not the role chunk")
			}
			prefill := p.PrefillDelay(prompt)
			if prompt == 0 || prefill < 100*time.Millisecond {
				t.Fatalf("the test needs a prefill that shows: %d prompt tokens, %s", prompt, prefill)
			}
			if first < prefill {
				t.Errorf("the role chunk came %s after the request, before the %s prefill of %d tokens ended", first, prefill, prompt)
			}
		})
	}
}
