package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/internal/gguf"
	"fleet/internal/llamatest"
	"fleet/internal/sshdtest"
)

// TestRealLlamaRoutingCacheHit: agent sessions over two real llama-server
// workers (the llamacpp recipe on two SSH nodes, the tests' PrefillTiny
// model) through the router, once per policy with a fresh hub and engines.
// Each session resends its whole growing conversation every turn, as a
// coding agent does; the cache hit ratio is what the engines themselves
// report (usage.prompt_tokens_details.cached_tokens over prompt_tokens), so
// it shows what the routing achieved, not what the router believes.
//
// Each engine has two slots and its host-RAM prompt cache off (--cache-ram
// 0), so it holds at most two conversations, and there are four sessions, as
// many as the fleet's slots: a turn that comes back to the worker holding its
// conversation reuses all of it; one that lands on the other worker finds at
// most its agent kind's system prompt, and pushes out a conversation there.
//
// The model is PrefillTiny, not the smaller DefaultTiny, and each engine has
// one thread: a late turn's full prefill takes about a second, a cached one a
// tenth, so the prefix a worker holds is worth far more than the stalls of a
// shared machine. Each session's task (with the files it read) is twice its
// kind's system prompt: with a task a fifth of it, the worker holding a
// session was predicted only 1.4 times faster at turn 1 than one holding just
// the kind's prompt, the speed model's noise decided, and two of nine runs
// left `fleet` at 47-49%, level with or below `fleet-no-prefix`.
//
// Asserted, within one run: over the later turns of every session (from
// realLlamaSettled on), `fleet`'s hit ratio is at least realLlamaMargin above
// `fleet-no-prefix`'s, the comparison the issue asks for. The other
// policies and the earlier turns are logged, not asserted. Early on the
// speed model still runs on each worker's first prompts, and a first long
// prompt slower than its prediction's hedge deadline (750 ms at least) is
// taken back and its worker made suspect: in a CI-like run under -race
// beside other packages' tests, that sent every later turn of `fleet` to
// one worker (61.6% from turn 4 on, against round-robin's 58.8% and
// fleet-no-prefix's 18.3%). In ten runs alone `fleet` led every other policy
// by 18.7 to 34.1 points from turn 4 on (docs/measurements.md).
func TestRealLlamaRoutingCacheHit(t *testing.T) {
	bin := llamatest.Binary(t)
	if testing.Short() {
		t.Skip("starts real llama-servers, two per policy; not in -short")
	}
	policies := []string{"fleet", "fleet-no-prefix", "round-robin", "random"}
	results := map[string]realLlamaRun{}
	for _, policy := range policies {
		t.Run(policy, func(t *testing.T) {
			results[policy] = runRealLlamaSessions(t, bin, policy)
		})
	}
	if t.Failed() || len(results) < len(policies) { // failed, or -run chose some
		return
	}
	for _, policy := range policies {
		r := results[policy]
		t.Logf("%-16s %d sessions x %d turns, 2 workers x %d slots: cache hit %5.1f%% (%d of %d prompt tokens), from turn %d %5.1f%%; %5.1f%% of the resent %d; turns per worker %s",
			policy, realLlamaSessions, realLlamaTurns, realLlamaSlots, 100*r.hit(), r.cached, r.prompt, realLlamaSettled, 100*r.lateHit(), 100*r.ofResent(), r.resent, r.shareString())
	}
	fleetRun := results["fleet"]
	for _, policy := range policies[1:] {
		r := results[policy]
		if r.cached == 0 {
			t.Errorf("%s: the engines reported no cached tokens at all", policy)
		}
		if policy == "fleet-no-prefix" && fleetRun.lateHit() < r.lateHit()+realLlamaMargin {
			t.Errorf("from turn %d on, fleet's cache hit %.1f%% is not %.0f points above %s's %.1f%%",
				realLlamaSettled, 100*fleetRun.lateHit(), 100*realLlamaMargin, policy, 100*r.lateHit())
		}
	}
	if t.Failed() {
		// Where each turn went and what its engine reused, to tell a
		// routing mistake from an engine that evicted.
		for _, policy := range policies {
			for _, tr := range results[policy].turns {
				t.Logf("%-16s t=%6.2fs..%6.2fs session %d turn %d on %-3s prompt %5d cached %5d computed %5d in %5.0f ms",
					policy, tr.start.Seconds(), tr.end.Seconds(), tr.session, tr.turn, tr.worker, tr.prompt, tr.cached, tr.promptN, tr.promptMs)
			}
		}
	}
}

const (
	realLlamaSessions = 4
	realLlamaSlots    = 2 // per engine
	realLlamaTurns    = 8
	realLlamaKinds    = 2    // agent kinds, each with its own system prompt
	realLlamaSystem   = 600  // bytes of an agent kind's system prompt (one token per byte)
	realLlamaTask     = 1200 // bytes of a session's task and the files it read, plus 8 per session number
	realLlamaToolOut  = 300  // bytes of a tool result appended per turn
	// An agent's tool time between turns, drawn uniformly.
	realLlamaThinkMin = 50 * time.Millisecond
	realLlamaThinkMax = 600 * time.Millisecond
	// realLlamaSettled is the first turn whose cache hits are asserted.
	realLlamaSettled = 4
	// realLlamaMargin is how far above every other policy's cache hit
	// ratio `fleet`'s must be from turn realLlamaSettled on, in the same
	// run: ten runs, five under -race, put it 18.7 to 34.1 points above
	// the best of them (docs/measurements.md).
	realLlamaMargin = 0.10
)

// realLlamaRun is one policy's sums over every turn of every session.
type realLlamaRun struct {
	prompt, cached         int
	latePrompt, lateCached int // from turn realLlamaSettled on
	resent                 int // the previous turns' prompt tokens, sent again
	turns                  []realLlamaTurn
}

// realLlamaTurn is one turn as the client and the engine logs saw it.
type realLlamaTurn struct {
	session, turn          int
	start, end             time.Duration // since the sessions began
	prompt, cached, answer int           // the engine's usage
	promptN                int           // the engine's timings: computed,
	promptMs               float64       // in this long
	worker                 string        // "a", "b"; "a/b" when the logs cannot tell
}

func (r realLlamaRun) hit() float64 { return float64(r.cached) / float64(max(r.prompt, 1)) }

func (r realLlamaRun) lateHit() float64 {
	return float64(r.lateCached) / float64(max(r.latePrompt, 1))
}

// ofResent is the cached tokens over those a router that always found the
// session's previous prompt would have had cached (its answer aside, whose
// re-rendering need not tokenize the same way). First turns can exceed it by
// an agent kind's shared system prompt.
func (r realLlamaRun) ofResent() float64 {
	return float64(r.cached) / float64(max(r.resent, 1))
}

func (r realLlamaRun) shareString() string {
	n := map[string]int{}
	for _, tr := range r.turns {
		w := tr.worker
		if w != "a" && w != "b" {
			w = "?"
		}
		n[w]++
	}
	return fmt.Sprintf("a %d, b %d, unknown %d", n["a"], n["b"], n["?"])
}

// runRealLlamaSessions starts two SSH nodes and a hub with --policy policy,
// each node running the real llama-server on PrefillTiny, and runs the
// sessions through the router.
func runRealLlamaSessions(t *testing.T, bin, policy string) realLlamaRun {
	model := llamatest.ModelOf(t, t.TempDir(), gguf.PrefillTiny)
	// Engines outlive their hub by design; this run's are the ones whose argv
	// names this run's model file. Registered before the hub so it runs after
	// the hub has stopped and cannot relaunch them.
	t.Cleanup(func() { killArgvContaining(model) })

	var nodes strings.Builder
	homes := map[string]string{}
	for _, name := range []string{"a", "b"} {
		sshd := sshdtest.New(t)
		sshd.Start()
		homes[name] = sshd.Home()
		fmt.Fprintf(&nodes, "  - name: %s\n    address: %s\n    identity: %s\n", name, sshd.Address(), sshd.Identity())
	}
	// 6144 tokens a slot hold a conversation (at most about 4,500). The
	// admission speed check is all but off: two equal engines on a shared,
	// noisy machine can measure 3x apart, and this test is about where
	// turns land, not about speed.
	fleetYAML := fmt.Sprintf(`nodes:
%smodels:
  - id: tiny
    context: %d
    memory_gb: 0.1
    speed_tolerance: 0.01
    recipes:
      llamacpp:
        model: %s
        bin: %s
        args: [--jinja, --metrics, -t, "1", -np, "%d", --cache-ram, "0"]
placements:
  - model: tiny
    node: a
    engine: llamacpp
  - model: tiny
    node: b
    engine: llamacpp
`, nodes.String(), 6144*realLlamaSlots, model, bin, realLlamaSlots)
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	hub := launchHub(t, data, freePort(t), "--fleet", file, "--policy", policy, "--log-level", "debug")
	base := "http://" + hub.http
	for _, name := range []string{"a/tiny", "b/tiny"} {
		w := waitWorker(t, data, name, "ready", 180*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
		if len(w.LaunchArgv) == 0 || w.LaunchArgv[0] != bin || w.Simulated {
			t.Fatalf("%s: launch argv %q (simulated %v), want the real %s", name, w.LaunchArgv, w.Simulated, bin)
		}
	}

	var run realLlamaRun
	began := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for s := range realLlamaSessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			turns, err := realLlamaSession(base, s, began)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("session %d: %v", s, err)
			}
			run.turns = append(run.turns, turns...)
		}()
	}
	wg.Wait()
	prev := map[int]int{}
	slices.SortFunc(run.turns, func(a, b realLlamaTurn) int { return cmp.Compare(a.turn, b.turn) })
	for _, tr := range run.turns {
		run.prompt += tr.prompt
		run.cached += tr.cached
		if tr.turn >= realLlamaSettled {
			run.latePrompt += tr.prompt
			run.lateCached += tr.cached
		}
		// All of the previous prompt could have been cached (the answer
		// too, but its re-rendering need not tokenize the same way).
		run.resent += prev[tr.session]
		prev[tr.session] = tr.prompt
	}
	attributeTurns(homes, run.turns)
	slices.SortFunc(run.turns, func(a, b realLlamaTurn) int { return cmp.Compare(a.start, b.start) })
	return run
}

// attributeTurns names the worker that served each turn from the engines'
// own logs: llama-server logs a slot's release with its tokens, prompt +
// answer - 1. (The sessions' tasks differ in length so that turns rarely
// share a count; where they do, the turn names both workers.)
func attributeTurns(homes map[string]string, turns []realLlamaTurn) {
	seen := map[int][]string{}
	for name, home := range homes {
		logs, _ := filepath.Glob(filepath.Join(home, ".fleet", "*.log"))
		for _, l := range logs {
			b, err := os.ReadFile(l)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				_, rest, ok := strings.Cut(line, "stop processing: n_tokens = ")
				if !ok {
					continue
				}
				field, _, _ := strings.Cut(rest, ",")
				if n, err := strconv.Atoi(strings.TrimSpace(field)); err == nil && !slices.Contains(seen[n], name) {
					seen[n] = append(seen[n], name)
				}
			}
		}
	}
	for i := range turns {
		ws := seen[turns[i].prompt+turns[i].answer-1]
		slices.Sort(ws)
		turns[i].worker = strings.Join(ws, "/")
	}
}

// realLlamaSession runs one agent session: a system prompt shared by its agent
// kind, a task, then turns that each append the previous answer and a tool
// result and resend everything. It returns each turn as the engine reported
// it.
func realLlamaSession(base string, s int, began time.Time) ([]realLlamaTurn, error) {
	rnd := rand.New(rand.NewPCG(uint64(s), 10))
	kind := s % realLlamaKinds
	messages := []map[string]string{
		{"role": "system", "content": llamaAgentText(rand.New(rand.NewPCG(uint64(kind), 20)), realLlamaSystem)},
		{"role": "user", "content": fmt.Sprintf("Session %d task: %s", s, llamaAgentText(rnd, realLlamaTask+8*s))},
	}
	think := func() time.Duration { return time.Duration(rnd.Int64N(int64(realLlamaThinkMax - realLlamaThinkMin))) }
	var turns []realLlamaTurn
	for turn := range realLlamaTurns {
		if turn > 0 {
			// The agent runs its tool before the next turn. Without this
			// pause sessions on an engine this fast move in lockstep, and
			// the router's queue alone keeps each on the worker that just
			// freed, whatever the policy.
			time.Sleep(realLlamaThinkMin + think())
			messages = append(messages, map[string]string{"role": "user", "content": "Tool result:\n" + llamaAgentText(rnd, realLlamaToolOut)})
		}
		body, _ := jsonMarshal(map[string]any{"model": "tiny", "max_tokens": 8, "temperature": 0, "messages": messages})
		start := time.Since(began)
		a, err := postChatErr(base, body)
		if err != nil {
			return turns, fmt.Errorf("turn %d: %w", turn, err)
		}
		turns = append(turns, realLlamaTurn{session: s, turn: turn, start: start, end: time.Since(began),
			prompt: a.Usage.PromptTokens, cached: a.Usage.Details.CachedTokens, answer: a.Usage.CompletionTokens,
			promptN: a.Timings.PromptN, promptMs: a.Timings.PromptMs})
		answer, _ := a.Choices[0].Message["content"].(string)
		messages = append(messages, map[string]string{"role": "assistant", "content": answer})
	}
	return turns, nil
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
