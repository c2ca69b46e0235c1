package sim

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"fleet/internal/llamatest"
)

// filler is n bytes of text unique to tag, so two fillers share no prefix.
func filler(tag string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s line %d says something. ", tag, i)
	}
	return b.String()[:n]
}

// reuse classifies what a request took from the prompt cache: "whole" (all
// but the last prompt token), "shared" (a real prefix, at least 10% of the
// prompt) or "none". The real server counts bytes as tokens and the sim 4
// bytes a token, so the classes compare where the counts cannot.
func reuse(cacheN, prompt int) string {
	switch {
	case cacheN >= prompt-1:
		return "whole"
	case cacheN*10 >= prompt:
		return "shared"
	}
	return "none"
}

// TestHostCacheMatchesRealLlamaServer replays short conversation sequences,
// one request at a time, against the real llama-server (the tiny GGUF) and
// the llama mimic with the same flags, and checks that each request is
// served from the slot or the host-RAM prompt cache (--cache-ram, on by
// default) the same way: which prompts survive a slot being taken by
// another conversation is the host cache's whole point. A and B share a
// system prompt (A's question short, B's long), C shares nothing.
func TestHostCacheMatchesRealLlamaServer(t *testing.T) {
	system, other := filler("system", 600), filler("other", 700)
	a := conversation(system, filler("question A", 150))
	b := conversation(system, filler("question B", 900))
	c := conversation(other, filler("question C", 100))
	named := map[string][]any{"A": a, "B": b, "C": c}
	cases := []struct {
		name  string
		flags string
		seq   []string
	}{
		{"one slot, unrelated between", "-np 1", []string{"A", "C", "A"}},
		{"one slot, shared system between", "-np 1", []string{"A", "B", "A"}},
		{"two slots, shared system after an unrelated", "-np 2", []string{"A", "C", "B", "A"}},
		{"two slots unified, shared system after an unrelated", "-np 2 --kv-unified", []string{"A", "C", "B", "A"}},
		{"two slots unified, shared system between", "-np 2 --kv-unified", []string{"A", "B", "A", "C", "B"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			flags := strings.Fields(tc.flags)
			real := llamatest.Start(t, append([]string{"-a", "qwen3-4b", "--jinja", "-c", "8192"}, flags...)...)
			_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b --jinja -c 8192 "+tc.flags)
			run := func(base string) []string {
				var out []string
				for _, name := range tc.seq {
					http.DefaultClient.CloseIdleConnections()
					code, resp := post(t, base+"/v1/chat/completions",
						map[string]any{"model": "qwen3-4b", "messages": named[name], "max_tokens": 2})
					if code != 200 {
						t.Fatalf("%s: HTTP %d %v", base, code, resp)
					}
					cacheN, promptN, _, _ := cacheFields(t, resp)
					out = append(out, fmt.Sprintf("%s:%s", name, reuse(cacheN, cacheN+promptN)))
					t.Logf("%s %s: cache_n %d prompt_n %d", base, name, cacheN, promptN)
				}
				return out
			}
			want, got := run(real.URL), run(ts.URL)
			t.Logf("real %v, sim %v", want, got)
			if fmt.Sprint(want) != fmt.Sprint(got) {
				t.Errorf("sim %v, real llama-server %v", got, want)
			}
		})
	}
}
