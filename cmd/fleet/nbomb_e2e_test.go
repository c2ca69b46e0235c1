package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/router"
)

// nBombRSSGrowth bounds how much the simulated vLLM's peak resident memory
// may grow over the n bombs: they are refused before any choice is
// planned. Before the bound, n = 2^63-1 took it from 27 MB to 4 GB.
const nBombRSSGrowth = 64 << 20

// TestNBombIsRefusedAndTheEngineStaysSmall sends the requests that grew a
// simulated vLLM to gigabytes (n = 2^63-1; n = 1,000,000 with max_tokens 8)
// through the router and straight to the engine: the router refuses them
// with its bound, the engine with vLLM's, and the engine's peak memory
// (VmHWM) stays where it was. It also checks that a loopback hub without
// --require-keys answers a request with a key it never checked, and says so.
func TestNBombIsRefusedAndTheEngineStaysSmall(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	h := startHub(t, data, freePort(t))
	ws := waitReady(t, data, 3, 120*time.Second)
	var rig fleet.WorkerView
	for _, w := range ws {
		if w.Engine == fleet.EngineVLLM {
			rig = w
		}
	}
	if rig.PID == 0 {
		t.Fatalf("no vLLM worker with a PID in %+v", ws)
	}
	before, err := procStatusBytes(rig.PID, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}

	post := func(url, body string, header ...string) (int, http.Header, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		c := &http.Client{Timeout: 30 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST %s %s: %v", url, body, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode, resp.Header, m
	}
	errMsg := func(m map[string]any) string {
		e, _ := m["error"].(map[string]any)
		s, _ := e["message"].(string)
		return s
	}
	bombs := []string{
		`{"model":"qwen3-4b","n":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"qwen3-4b","n":1000000,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`,
	}
	for _, body := range bombs {
		if code, _, m := post("http://"+h.http+"/v1/chat/completions", body); code != 400 || !strings.Contains(errMsg(m), fmt.Sprintf("at most %d choices", router.MaxChoices)) {
			t.Errorf("router, %s: HTTP %d %v; want 400 naming its bound", body, code, m)
		}
		engine := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", rig.Port)
		if code, _, m := post(engine, body); code != 400 || !strings.Contains(errMsg(m), "n must be at most 16384") {
			t.Errorf("the simulated vLLM, %s: HTTP %d %v; want vLLM's 400", body, code, m)
		}
	}
	// What the router still takes is answered, every choice.
	code, hdr, m := post("http://"+h.http+"/v1/chat/completions",
		`{"model":"qwen3-4b","n":128,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer fk-never-made")
	if choices, _ := m["choices"].([]any); code != 200 || len(choices) != 128 {
		t.Errorf("n=128: HTTP %d with %d choices; want 200 with 128", code, len(choices))
	}
	if got := hdr.Get(router.HeaderKeyNotChecked); !strings.Contains(got, "--require-keys") {
		t.Errorf("a loopback hub answered a request with a key it never checked without saying so: %s %q", router.HeaderKeyNotChecked, got)
	}

	after, err := procStatusBytes(rig.PID, "VmHWM")
	if err != nil {
		t.Fatalf("the simulated vLLM (PID %d) is gone after the n bombs: %v", rig.PID, err)
	}
	t.Logf("simulated vLLM peak RSS: %.1f MB before the n bombs, %.1f MB after", float64(before)/1e6, float64(after)/1e6)
	if after-before > nBombRSSGrowth {
		t.Errorf("the simulated vLLM's peak RSS grew by %.0f MB over the n bombs; the bound is %d MB", float64(after-before)/1e6, nBombRSSGrowth>>20)
	}
}
