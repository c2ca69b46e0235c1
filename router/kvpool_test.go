package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"fleet"
	"fleet/enginectl"
	"fleet/fleetfile"
	"fleet/sim/simtest"
)

func TestSharedKVPoolOfBackend(t *testing.T) {
	// The router's view of what a llama-server's requests share, from the
	// argv the hub launched it with (enginectl.SharedKVPool).
	for _, tc := range []struct {
		argv []string
		want int
	}{
		{[]string{"llama-server", "-c", "4096", "-np", "3", "--kv-unified"}, 4096},
		{[]string{"llama-server", "-c", "4096", "-np", "3"}, 0},
		{[]string{"llama-server", "-c", "4096"}, 4096}, // -np auto: unified
		{[]string{"llama-server", "-c", "4096", "-np", "-1"}, 4096},
		{[]string{"llama-server", "-c=8192", "-np", "2", "-kvu", "-no-kvu"}, 0},
		{[]string{"llama-server", "--ctx-size", "8192", "-np", "2", "--no-kv-unified", "--kv-unified"}, 8192},
		{[]string{"llama-server", "-c", "0", "--kv-unified"}, 0},
	} {
		if got := enginectl.SharedKVPool(tc.argv); got != tc.want {
			t.Errorf("SharedKVPool(%q) = %d, want %d", tc.argv, got, tc.want)
		}
	}
}

// kvEngine is a simulated llama-server whose answers are watched for its
// full-KV-pool error, however it is sent (a 500, or an event mid-stream).
type kvEngine struct {
	srv       *httptest.Server
	overflows atomic.Int64
}

type overflowSpy struct {
	http.ResponseWriter
	seen *atomic.Int64
	hit  bool
}

func (s *overflowSpy) Write(p []byte) (int, error) {
	if !s.hit && bytes.Contains(p, overflowMessage) {
		s.hit = true
		s.seen.Add(1)
	}
	return s.ResponseWriter.Write(p)
}

func (s *overflowSpy) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func startKVEngine(t *testing.T, args ...string) *kvEngine {
	t.Helper()
	h, _ := simtest.Handler(t, args...)
	e := &kvEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&overflowSpy{ResponseWriter: w, seen: &e.overflows}, r)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// agentSessions runs sessions concurrent agent sessions of turns turns
// through the router at url: each resends its whole conversation, first
// firstBytes of task, then growBytes more a turn, asking maxTokens, streamed
// as agents do. It returns what went wrong, one line a failed turn: a
// status other than 200, an error event, or a stream cut before [DONE].
func agentSessions(t *testing.T, url string, sessions, turns, firstBytes, growBytes, maxTokens int) []string {
	t.Helper()
	var mu sync.Mutex
	var failed []string
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := []map[string]string{
				{"role": "system", "content": "You are a coding agent."},
				{"role": "user", "content": fmt.Sprintf("session %d: ", s) + strings.Repeat("read file. ", firstBytes/11)},
			}
			for turn := 1; turn <= turns; turn++ {
				if turn > 1 {
					msgs = append(msgs,
						map[string]string{"role": "assistant", "content": "calling a tool"},
						map[string]string{"role": "user", "content": strings.Repeat("tool output ", growBytes/12)})
				}
				body, _ := json.Marshal(map[string]any{"model": "qwen3-4b", "messages": msgs, "max_tokens": maxTokens, "stream": true})
				if why := agentTurn(t.Context(), url, body); why != "" {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("session %d turn %d: %s", s, turn, why))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return failed
}

// agentTurn sends one turn and says what went wrong, "" for nothing.
func agentTurn(ctx context.Context, url string, body []byte) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			return ""
		case strings.HasPrefix(line, "data: {\"error\""):
			return "error event: " + line
		}
	}
	return "stream ended without [DONE]"
}

// TestKVPoolOverflowOnlyWithoutAccounting is the field report's failure on
// simulated llama-servers that fail as the real one does: two workers of
// -c 4096 --parallel 3 --kv-unified, seven agent sessions of five turns
// whose conversation grows to about 1,600 tokens. Three such turns on one
// worker hold more than its 4,096 tokens. A router that does not know the
// pool (KVPool 0, the accounting off) sends them there, and the engine
// fails every request in flight on it at once; one that counts what each
// request holds sends a worker only what fits, and every turn is served.
func TestKVPoolOverflowOnlyWithoutAccounting(t *testing.T) {
	const (
		sessions, turns = 7, 5
		first, grow     = 3200, 800 // bytes: about 800 tokens, +200 a turn
		maxTokens       = 64
		pool, slots     = 4096, 3
	)
	for _, accounting := range []bool{false, true} {
		t.Run(fmt.Sprintf("accounting=%v", accounting), func(t *testing.T) {
			t.Parallel()
			var engines []*kvEngine
			var bs []Backend
			for _, node := range []string{"a", "b"} {
				e := startKVEngine(t, strings.Fields(fmt.Sprintf("--mimic llamacpp --profile m4max-llamacpp -- -m q.gguf -a qwen3-4b -c %d -np %d --kv-unified", pool, slots))...)
				engines = append(engines, e)
				b := Backend{Name: node + "/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: e.srv.Listener.Addr().String(), Context: pool, Slots: slots}
				if accounting {
					b.KVPool = pool
				}
				bs = append(bs, b)
			}
			_, srv := startRouter(t, Options{}, bs...)
			failed := agentSessions(t, srv.URL, sessions, turns, first, grow, maxTokens)
			overflows := engines[0].overflows.Load() + engines[1].overflows.Load()
			t.Logf("accounting %v: %d requests refused by a full KV pool at the engines; %d of %d turns failed at the client", accounting, overflows, len(failed), sessions*turns)
			if accounting {
				if overflows != 0 {
					t.Errorf("the engines refused %d requests for a full KV pool; the router must send a worker only what fits", overflows)
				}
				for _, f := range failed {
					t.Error(f)
				}
				return
			}
			if overflows == 0 {
				t.Errorf("no engine overflowed its KV pool without the router's accounting: the test no longer shows what the accounting prevents")
			}
		})
	}
}

// TestDemoWorkersServeEightLongAgentSessions: the demo fleet's workers,
// built from fleetfile/demo.yaml by the hub's own recipe code and run as
// their simulated engines (a vLLM rig, two llama-servers of -c 16384 -np 4
// --kv-unified), serve eight concurrent agent sessions of 5,000 tokens with
// none refused, on the llama-servers: four such sessions on one would hold
// 20,000 tokens of its 16,384 (without the accounting, one run: the
// engines refused 84 requests and 11 of the 16 turns failed).
func TestDemoWorkersServeEightLongAgentSessions(t *testing.T) {
	demo, err := fleetfile.Parse("demo.yaml", fleetfile.Demo)
	if err != nil {
		t.Fatal(err)
	}
	var bs []Backend
	var engines []*kvEngine
	for _, n := range demo.Nodes {
		profile := strings.TrimPrefix(n.Address, "sim:")
		engine := fleet.EngineLlamaCpp
		if strings.Contains(profile, "vllm") {
			engine = fleet.EngineVLLM
		}
		cmd, err := enginectl.BuildCommand(enginectl.Spec{Node: n, Model: demo.Models[0], Engine: engine, Port: 18000, FleetBin: "fleet"})
		if err != nil {
			t.Fatal(err)
		}
		sep := indexOf(cmd.LaunchArgv, "sim")
		if sep < 0 {
			t.Fatalf("%s: launch argv %q is not a simulated engine's", n.Name, cmd.LaunchArgv)
		}
		e := startKVEngine(t, cmd.LaunchArgv[sep+1:]...)
		engines = append(engines, e)
		b := Backend{Name: n.Name + "/qwen3-4b", Model: "qwen3-4b", Engine: engine, Addr: e.srv.Listener.Addr().String(), Context: cmd.Context, Slots: cmd.Slots}
		if engine == fleet.EngineLlamaCpp {
			b.KVPool = enginectl.SharedKVPool(cmd.Argv) // as the hub does (hub/state.go)
			if b.KVPool != demo.Models[0].Context {
				t.Fatalf("%s: shared KV pool %d from %q, want the model's context %d", n.Name, b.KVPool, cmd.Argv, demo.Models[0].Context)
			}
		}
		bs = append(bs, b)
	}
	r, srv := startRouter(t, Options{}, bs...)
	// The rig's 256 vLLM slots would take every session: drained, the
	// eight fall on the Macs' two llama-servers, four a worker.
	r.Drain("rig/qwen3-4b")
	// One turn of 5,000 tokens (20,000 bytes) and a second a little
	// longer, each answer up to 256 tokens.
	failed := agentSessions(t, srv.URL, 8, 2, 19000, 1000, 256)
	var overflows int64
	for _, e := range engines {
		overflows += e.overflows.Load()
	}
	t.Logf("%d requests refused by a full KV pool at the engines; %d of 16 turns failed at the client", overflows, len(failed))
	if overflows != 0 {
		t.Errorf("the demo's engines refused %d requests for a full KV pool", overflows)
	}
	for _, f := range failed {
		t.Error(f)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestKVRoomAtLearnedTokenScale(t *testing.T) {
	// A worker of -c 4096 with two requests in flight, each counted at
	// its engine's tokens: a third fits only while the sum stays within
	// the pool, and the scale comes from the answers, whether they give
	// usage or only a stream's timings.
	b := &backend{cfg: Backend{Name: "a/m", KVPool: 4096}}
	job := Job{PromptTokens: 350, KVOutput: 48}
	for _, tc := range []struct {
		name  string
		cache promptCache
		room  bool
	}{
		{"no answer yet: the router's estimate", unknownPromptCache(), true},
		{"usage: 4 engine tokens a router token", promptCache{promptTokens: 1400, cached: 1000, computedN: 400, computedMs: 10}, false},
		{"stream timings only: prompt_n + cache_n", promptCache{promptTokens: -1, cached: 1000, computedN: 400, computedMs: 10}, false},
		{"usage: the estimate was right", promptCache{promptTokens: 350, cached: 0, computedN: 350, computedMs: 10}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &worker{}
			w.learnTokenScale(350, tc.cache.engineTokens())
			for range 2 {
				w.inFlight++
				w.kvHeld += w.kvTokens(job)
			}
			if got := w.kvRoom(b, job); got != tc.room {
				t.Errorf("room for a third: %v, want %v (scale %.2f, held %d of %d)", got, tc.room, w.tokenScale, w.kvHeld, b.cfg.KVPool)
			}
		})
	}
	// Nothing in flight: always room, however large the job.
	if w := (&worker{tokenScale: 4}); !w.kvRoom(b, Job{PromptTokens: 5000}) {
		t.Error("an idle worker refused a job larger than its pool; that is the context check's to refuse")
	}
	// Refused at 3,000 held: the worker is sent less from then on.
	w := &worker{}
	w.refusedFull(3000)
	w.refusedFull(1500) // the rest of the same refusal, as its flights end
	if got := w.kvPool(b); got != 2999 {
		t.Errorf("pool after a refusal at 3,000 held: %d, want 2999", got)
	}
}
