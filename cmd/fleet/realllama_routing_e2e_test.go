package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/internal/llamatest"
	"fleet/internal/sshdtest"
)

// TestRealLlamaRoutingCacheHit: agent sessions over two real llama-server
// workers (the llamacpp recipe on two SSH nodes, the tests' tiny GGUF) through
// the router, once per policy with fresh hub and engines. Each session resends
// its whole growing conversation every turn, as a coding agent does; the
// cache hit ratio is what the engines themselves report
// (usage.prompt_tokens_details.cached_tokens over prompt_tokens), so it shows
// what the routing achieved, not what the router believes.
//
// Each engine has two slots. In "slots" its host-RAM prompt cache is off
// (--cache-ram 0), so a worker holds at most two conversations, and there are
// four sessions, as many as the fleet's slots: a turn that comes back to the
// worker holding its conversation reuses all of it; one that lands on the
// other worker finds at most its agent kind's system prompt. "host-cache" is
// llama-server's default host-RAM prompt cache with twice as many sessions as
// slots: an engine restores any conversation it has seen, so a prefix-blind
// policy recovers part of what it loses.
//
// Both are measured and logged, asserting only what holds whatever the
// timing: every turn answered and the engines' caches were used. The order of
// the policies is not asserted: on this tiny model a prefill costs
// milliseconds, so a held prefix saves `fleet` little predicted time, and the
// runs so far put `fleet` anywhere from 10 points below `fleet-no-prefix` (a
// CI-like run under -race: 48% against 58% of the resent tokens) to 47 points
// above it.
func TestRealLlamaRoutingCacheHit(t *testing.T) {
	bin := llamatest.Binary(t)
	if testing.Short() {
		t.Skip("starts real llama-servers, two per policy; not in -short")
	}
	policies := []string{"fleet", "fleet-no-prefix", "round-robin", "random"}
	for _, c := range []realLlamaConfig{
		{name: "slots", sessions: 4, args: `, --cache-ram, "0"`},
		{name: "host-cache", sessions: 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			results := map[string]realLlamaRun{}
			for _, policy := range policies {
				t.Run(policy, func(t *testing.T) {
					results[policy] = runRealLlamaSessions(t, bin, policy, c)
				})
			}
			if t.Failed() || len(results) < len(policies) { // failed, or -run chose some
				return
			}
			for _, policy := range policies {
				r := results[policy]
				t.Logf("%-10s %-16s %d sessions x %d turns, 2 workers x 2 slots: cache hit %5.1f%% (%d of %d prompt tokens), %5.1f%% of the resent %d; worker share %s",
					c.name, policy, c.sessions, realLlamaTurns, 100*r.hit(), r.cached, r.prompt, 100*r.ofResent(), r.resent, r.shareString())
			}
			for _, policy := range policies {
				if results[policy].cached == 0 {
					t.Errorf("%s: the engines reported no cached tokens at all", policy)
				}
			}
		})
	}
}

// realLlamaConfig is one shape of the fleet and its load.
type realLlamaConfig struct {
	name     string
	sessions int
	args     string // more llama-server args, YAML flow items after a comma
}

const (
	realLlamaTurns   = 8
	realLlamaKinds   = 2   // agent kinds, each with its own system prompt
	realLlamaSystem  = 600 // bytes of an agent kind's system prompt (one token per byte)
	realLlamaToolOut = 300 // bytes of a tool result appended per turn
	// An agent's tool time between turns, drawn uniformly.
	realLlamaThinkMin = 50 * time.Millisecond
	realLlamaThinkMax = 400 * time.Millisecond
)

// realLlamaRun is one policy's sums over every turn of every session.
type realLlamaRun struct {
	policy          string
	prompt, cached  int
	resent          int            // the previous turns' prompt tokens, sent again
	answerPerWorker map[string]int // tokens predicted, from each engine's own /metrics
	answerTokens    int
}

func (r realLlamaRun) hit() float64 { return float64(r.cached) / float64(max(r.prompt, 1)) }

// ofResent is the cached tokens over those a router that always found the
// session's previous prompt would have had cached (its answer aside, whose
// re-rendering need not tokenize the same way). First turns can exceed it by
// an agent kind's shared system prompt.
func (r realLlamaRun) ofResent() float64 {
	return float64(r.cached) / float64(max(r.resent, 1))
}

func (r realLlamaRun) shareString() string {
	var parts []string
	for _, w := range []string{"a", "b"} {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", w, 100*float64(r.answerPerWorker[w])/float64(max(r.answerTokens, 1))))
	}
	return strings.Join(parts, ", ")
}

// runRealLlamaSessions starts two SSH nodes and a hub with --policy policy,
// each node running the real llama-server on the tiny model, and runs the
// sessions through the router.
func runRealLlamaSessions(t *testing.T, bin, policy string, c realLlamaConfig) realLlamaRun {
	model := llamatest.Model(t, t.TempDir())
	// Engines outlive their hub by design; this run's are the ones whose argv
	// names this run's model file. Registered before the hub so it runs after
	// the hub has stopped and cannot relaunch them.
	t.Cleanup(func() { killArgvContaining(model) })

	var nodes strings.Builder
	for _, name := range []string{"a", "b"} {
		sshd := sshdtest.New(t)
		sshd.Start()
		fmt.Fprintf(&nodes, "  - name: %s\n    address: %s\n    identity: %s\n", name, sshd.Address(), sshd.Identity())
	}
	// A unified KV of 8192 tokens holds both slots' conversations (at most
	// about 3,300 tokens each). The admission speed check is all but off:
	// two equal engines on a shared, noisy machine can measure 3x apart,
	// and this test is about where turns land, not about speed.
	fleetYAML := fmt.Sprintf(`nodes:
%smodels:
  - id: tiny
    context: 8192
    memory_gb: 0.1
    speed_tolerance: 0.01
    recipes:
      llamacpp:
        model: %s
        bin: %s
        args: [--jinja, --metrics, -t, "1", -np, "2"%s]
placements:
  - model: tiny
    node: a
    engine: llamacpp
  - model: tiny
    node: b
    engine: llamacpp
`, nodes.String(), model, bin, c.args)
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	hub := launchHub(t, data, freePort(t), "--fleet", file, "--policy", policy, "--log-level", "debug")
	base := "http://" + hub.http
	ports := map[string]int{}
	for _, name := range []string{"a/tiny", "b/tiny"} {
		w := waitWorker(t, data, name, "ready", 180*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
		if len(w.LaunchArgv) == 0 || w.LaunchArgv[0] != bin || w.Simulated {
			t.Fatalf("%s: launch argv %q (simulated %v), want the real %s", name, w.LaunchArgv, w.Simulated, bin)
		}
		ports[name[:1]] = w.Port
	}
	before := map[string]int{}
	for name, port := range ports {
		before[name] = engineAnswerTokens(t, port)
	}

	run := realLlamaRun{policy: policy, answerPerWorker: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for s := range c.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt, cached, resent, err := realLlamaSession(base, s)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("session %d: %v", s, err)
			}
			run.prompt += prompt
			run.cached += cached
			run.resent += resent
		}()
	}
	wg.Wait()
	for name, port := range ports {
		n := engineAnswerTokens(t, port) - before[name]
		run.answerPerWorker[name] = n
		run.answerTokens += n
	}
	return run
}

// realLlamaSession runs one agent session: a system prompt shared by its agent
// kind, a task, then turns that each append the previous answer and a tool
// result and resend everything. It returns the engines' prompt and cached
// token sums, and how many of the prompt tokens a router that always found
// the session's previous prompt could have had cached.
func realLlamaSession(base string, s int) (prompt, cached, resent int, err error) {
	rnd := rand.New(rand.NewPCG(uint64(s), 10))
	kind := s % realLlamaKinds
	messages := []map[string]string{
		{"role": "system", "content": llamaAgentText(rand.New(rand.NewPCG(uint64(kind), 20)), realLlamaSystem)},
		{"role": "user", "content": fmt.Sprintf("Session %d task: %s", s, llamaAgentText(rnd, 120))},
	}
	prev := 0 // the previous turn's prompt tokens
	for turn := range realLlamaTurns {
		if turn > 0 {
			// The agent runs its tool before the next turn. Without this
			// pause sessions on an engine this fast move in lockstep, and
			// the router's queue alone keeps each on the worker that just
			// freed, whatever the policy.
			time.Sleep(realLlamaThinkMin + time.Duration(rnd.Int64N(int64(realLlamaThinkMax-realLlamaThinkMin))))
			messages = append(messages, map[string]string{"role": "user", "content": "Tool result:\n" + llamaAgentText(rnd, realLlamaToolOut)})
		}
		body, _ := jsonMarshal(map[string]any{"model": "tiny", "max_tokens": 8, "temperature": 0, "messages": messages})
		a, err := postChatErr(base, body)
		if err != nil {
			return prompt, cached, resent, fmt.Errorf("turn %d: %w", turn, err)
		}
		prompt += a.Usage.PromptTokens
		cached += a.Usage.Details.CachedTokens
		// All of the previous prompt could have been cached (the answer
		// too, but its re-rendering need not tokenize the same way).
		resent += prev
		prev = a.Usage.PromptTokens
		answer, _ := a.Choices[0].Message["content"].(string)
		messages = append(messages, map[string]string{"role": "assistant", "content": answer})
	}
	return prompt, cached, resent, nil
}

// llamaAgentText is n bytes of lowercase words, like a file listing or a log.
func llamaAgentText(rnd *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		w := 2 + rnd.IntN(8)
		for range w {
			b.WriteByte(byte('a' + rnd.IntN(26)))
		}
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

func jsonMarshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
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

// engineAnswerTokens is the engine's own llamacpp:tokens_predicted_total:
// every turn asks for the same few tokens, so its share is the share of
// turns. (llamacpp:tokens_predicted_total counts only computed prompt tokens,
// not cached ones.)
func engineAnswerTokens(t *testing.T, port int) int {
	t.Helper()
	text := getEngineText(t, "http://127.0.0.1:"+strconv.Itoa(port)+"/metrics")
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "llamacpp:tokens_predicted_total "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("llamacpp:tokens_predicted_total %q: %v", v, err)
			}
			return int(f)
		}
	}
	t.Fatalf("engine on port %d reports no llamacpp:tokens_predicted_total:\n%s", port, text)
	return 0
}
