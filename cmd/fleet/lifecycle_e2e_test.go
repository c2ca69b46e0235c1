package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// postChatNamed sends one chat completion naming model and returns the status
// and body.
func postChatNamed(t *testing.T, base, model string, stream bool) (int, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", base, err)
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// TestDemoAnswersTheFirstRequestAndEveryAlias: a request sent the moment
// `serve --demo` listens waits for a worker instead of getting 503, and once
// the fleet is up, 100 of 100 requests naming the model by its alias are
// served by all three workers (vLLM refuses names it does not serve), each
// answer carrying the alias.
func TestDemoAnswersTheFirstRequestAndEveryAlias(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	h := startHub(t, data, freePort(t), "--policy", "round-robin")
	base := "http://" + h.http

	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", h.http, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router did not listen within 30 s: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if status, body := postChatNamed(t, base, "qwen3-4b", false); status != http.StatusOK {
		t.Fatalf("the first request, sent as the router opened, got %d: %s", status, body)
	}

	waitReady(t, data, 3, 120*time.Second)
	before := map[string]int{}
	for _, w := range []string{"rig/qwen3-4b", "ultra/qwen3-4b", "max/qwen3-4b"} {
		before[w] = requestsTo(t, base, w)
	}
	var mu sync.Mutex
	ok := 0
	var failures []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	for i := range 100 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			status, body := postChatNamed(t, base, "qwen3", i%2 == 0)
			good := status == http.StatusOK && allCarry(body, "qwen3")
			mu.Lock()
			defer mu.Unlock()
			if good {
				ok++
			} else if len(failures) < 3 {
				failures = append(failures, fmt.Sprintf("%d: %.300s", status, body))
			}
		}()
	}
	wg.Wait()
	if ok != 100 {
		t.Fatalf("%d of 100 alias requests served with the alias in every answer; first failures: %q", ok, failures)
	}
	for w, n := range before {
		if got := requestsTo(t, base, w); got <= n {
			t.Errorf("no alias request reached %s", w)
		}
	}
}

// allCarry reports whether a JSON body, or every data event of a stream,
// names model.
func allCarry(body []byte, model string) bool {
	docs := []string{string(body)}
	if strings.HasPrefix(string(body), "data:") {
		docs = nil
		for _, line := range strings.Split(string(body), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" {
				docs = append(docs, d)
			}
		}
	}
	for _, d := range docs {
		var m struct{ Model string }
		if json.Unmarshal([]byte(d), &m) != nil || m.Model != model {
			return false
		}
	}
	return len(docs) > 0
}

// TestServeQueueFlags: the queue's bounds are serve flags, in --help, and a
// negative one is refused before anything is created.
func TestServeQueueFlags(t *testing.T) {
	t.Parallel()
	help, code := fleetCmd(t, t.TempDir(), "serve", "--help")
	if code != 0 || !strings.Contains(help, "--queue-timeout") || !strings.Contains(help, "--queue-size") {
		t.Errorf("serve --help (exit %d) does not show the queue flags:\n%s", code, help)
	}
	for _, flag := range []string{"--queue-timeout=-1s", "--queue-size=-1"} {
		data := t.TempDir() + "/data"
		out, code := fleetCmd(t, data, "serve", "--http", "127.0.0.1:0", "--ssh=", flag)
		if code == 0 || !strings.Contains(out, "negative") {
			t.Errorf("serve %s: exit %d, output %q; want a refusal saying it is negative", flag, code, out)
		}
		if _, err := os.Stat(data); err == nil {
			t.Errorf("serve %s created the data dir before refusing", flag)
		}
	}
}

// TestRestartOfTheOnlyWorkerKeepsRequestsWaiting: while the only worker of
// a model drains, stops and relaunches, requests wait for it and are
// served, instead of failing with 503.
func TestRestartOfTheOnlyWorkerKeepsRequestsWaiting(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	file := filepath.Join(data, "fleet.yaml")
	if err := os.WriteFile(file, []byte(`nodes:
  - name: rig
    address: sim:rtx3060-vllm
models:
  - id: qwen3-4b
    aliases: [qwen3]
    context: 16384
    memory_gb: 3
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
placements:
  - model: qwen3-4b
    nodes: [rig]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := launchHub(t, data, freePort(t), "--fleet", file)
	base := "http://" + h.http
	before := waitReady(t, data, 1, 120*time.Second)[0]

	restarted := make(chan string, 1)
	go func() {
		out, code := fleetCmd(t, data, "restart", "rig")
		restarted <- fmt.Sprintf("exit %d: %s", code, out)
	}()
	// Send once the worker has left ready (draining, stopped or starting).
	deadline := time.Now().Add(60 * time.Second)
	for {
		ws := workersJSON(t, data)
		if len(ws) == 1 && (ws[0].State != "ready" || ws[0].Drained || ws[0].PID != before.PID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker never left ready during the restart: %+v", ws)
		}
		time.Sleep(20 * time.Millisecond)
	}
	status, body := postChatNamed(t, base, "qwen3", true)
	if status != http.StatusOK || !allCarry(body, "qwen3") {
		t.Errorf("a request sent during the restart of the only worker got %d: %.300s", status, body)
	}
	t.Log("restart: ", <-restarted)
}
