package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/internal/gguf"
	"fleet/internal/llamatest"
)

// TestRealLlamaKVPoolNeverOverflows is the field report's failure on real
// engines: two llama-server workers of -c 4096 --parallel 3 (fleet adds
// --kv-unified: one pool of 4,096 tokens for the three slots) and seven
// concurrent agent sessions of five streamed turns whose conversation grows
// to about 1,400 tokens (the tiny model counts a byte a token). Three late
// turns on one worker need more than its pool; llama-server then fails
// every request in flight on it ("Context size has been exceeded"), and the
// router used to answer 503. Asserted: every turn is answered 200 and its
// stream ends with [DONE], no error event, and neither engine logged the
// overflow.
func TestRealLlamaKVPoolNeverOverflows(t *testing.T) {
	bin := llamatest.Binary(t)
	if testing.Short() {
		t.Skip("starts two real llama-servers; not in -short")
	}
	const (
		sessions, turns = 7, 5
		slots, ctx      = 3, 4096
		first, grow     = 600, 200 // bytes: tokens of the tiny model
		maxTokens       = 48
	)
	model := llamatest.ModelOf(t, t.TempDir(), gguf.PrefillTiny)
	t.Cleanup(func() { killArgvContaining(model) })
	var nodes strings.Builder
	homes := map[string]string{}
	for _, name := range []string{"a", "b"} {
		sshd := isolatedSSHD(t)
		sshd.Start()
		homes[name] = sshd.Home()
		fmt.Fprintf(&nodes, "  - name: %s\n    address: %s\n    identity: %s\n", name, sshd.Address(), sshd.Identity())
	}
	// Admission's speed check is not what this test is about: all but off.
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
        args: [--jinja, -t, "1", -np, "%d"]
placements:
  - model: tiny
    node: a
    engine: llamacpp
  - model: tiny
    node: b
    engine: llamacpp
`, nodes.String(), ctx, model, bin, slots)
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	hub := launchHub(t, data, freePort(t), "--fleet", file, "--queue-timeout", "80s")
	base := "http://" + hub.http
	for _, name := range []string{"a/tiny", "b/tiny"} {
		w := waitWorker(t, data, name, "ready", 180*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
		if len(w.LaunchArgv) == 0 || w.LaunchArgv[0] != bin || w.Simulated || !strings.Contains(strings.Join(w.Argv, " "), "--kv-unified") {
			t.Fatalf("%s: launch argv %q (simulated %v), want the real %s with --kv-unified", name, w.LaunchArgv, w.Simulated, bin)
		}
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(s), 30))
			messages := []map[string]string{{"role": "user", "content": fmt.Sprintf("Session %d task: %s", s, llamaAgentText(rnd, first))}}
			for turn := 1; turn <= turns; turn++ {
				if turn > 1 {
					messages = append(messages,
						map[string]string{"role": "assistant", "content": "I will run the tool."},
						map[string]string{"role": "user", "content": "Tool result:\n" + llamaAgentText(rnd, grow)})
				}
				body, _ := jsonMarshal(map[string]any{"model": "tiny", "max_tokens": maxTokens, "stream": true, "messages": messages})
				if why := streamedTurn(base, body); why != "" {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("session %d turn %d: %s", s, turn, why))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range failed {
		t.Error(f)
	}
	for name, home := range homes {
		logs, _ := filepath.Glob(filepath.Join(home, ".fleet", "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			if n := strings.Count(string(b), "Context size has been exceeded"); n > 0 {
				t.Errorf("node %s: the engine logged %d KV pool overflows (%s)", name, n, filepath.Base(l))
			}
		}
	}
	if t.Failed() {
		logEngineTails(t, homes)
	}
}

// streamedTurn sends one streamed chat turn and says what went wrong, ""
// when it was answered 200 and ended with [DONE] without an error event.
func streamedTurn(base, body string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	if resp.StatusCode != http.StatusOK {
		var b strings.Builder
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b.String())
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			return ""
		case strings.Contains(line, `"error"`):
			return "error event: " + line
		}
	}
	return "stream ended without [DONE]"
}
