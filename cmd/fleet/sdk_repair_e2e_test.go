package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/router"
)

// repairCases are Anthropic streams as the engines send them when they get
// the structure wrong, keyed by the case name the client's message carries.
var repairCases = map[string]string{
	// llama-server, first token a partial UTF-8 sequence: no message_start.
	"no_message_start": "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\U0001F600 hi\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	// vLLM #45367: message_start without type and role; llama.cpp #22960:
	// a tool_use block (a tool without arguments) started without input.
	"no_role_no_input": "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"qwen3-4b\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"now\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":3}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

// TestOfficialAnthropicSDKAcceptsRepairedStreams routes the broken streams
// of repairCases from a worker through the router to the official
// Anthropic TypeScript SDK's messages.stream, which must put a whole
// message together from each: without the router's repair it fails on
// the first ("request ended without sending any chunks") and returns a
// message without role and a tool call without input on the second.
func TestOfficialAnthropicSDKAcceptsRepairedStreams(t *testing.T) {
	t.Parallel()
	node, sdks := npmSDKs(t)
	caseName := regexp.MustCompile(`case:(\w+)`)
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		m := caseName.FindSubmatch(body)
		if req.URL.Path != "/v1/messages" || m == nil || repairCases[string(m[1])] == "" {
			http.Error(w, "unknown case", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, repairCases[string(m[1])])
	}))
	t.Cleanup(worker.Close)
	r, err := router.New(router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetModels([]fleet.Model{{ID: "qwen3-4b", Aliases: []string{"qwen3"}, Context: 4096}}); err != nil {
		t.Fatal(err)
	}
	r.SetBackends([]router.Backend{{Name: "n/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp,
		Addr: worker.Listener.Addr().String(), Context: 4096, Slots: 2}})
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("testdata", "sdk", "repair.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "repair.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(sdks, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "repair.mjs"))
	cmd.Env = append(os.Environ(), "FLEET_BASE="+srv.URL, "FLEET_CASES=no_message_start,no_role_no_input")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("node repair.mjs: %v\nstdout: %s\nstderr: %s", err, raw, stderr.String())
	}
	type block struct {
		Type  string          `json:"type"`
		Input json.RawMessage `json:"input"`
	}
	var got map[string]struct {
		Error   string  `json:"error"`
		Text    string  `json:"text"`
		Type    string  `json:"type"`
		Role    string  `json:"role"`
		Model   string  `json:"model"`
		Content []block `json:"content"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("the script's output is not JSON: %v\n%s", err, raw)
	}
	t.Logf("the SDK saw: %s", raw)
	for name, want := range map[string]struct{ text, content, input string }{
		"no_message_start": {"\U0001F600 hi", "text", "null"},
		"no_role_no_input": {"", "tool_use", "{}"},
	} {
		g := got[name]
		if g.Error != "" {
			t.Errorf("%s: the SDK failed: %s", name, g.Error)
			continue
		}
		if g.Type != "message" || g.Role != "assistant" || g.Model != "qwen3" || g.Text != want.text {
			t.Errorf("%s: message type %q role %q model %q text %q, want a message from the assistant, model qwen3, text %q",
				name, g.Type, g.Role, g.Model, g.Text, want.text)
		}
		if len(g.Content) != 1 || g.Content[0].Type != want.content || string(g.Content[0].Input) != want.input {
			t.Errorf("%s: content %+v, want one %s block with input %s", name, g.Content, want.content, want.input)
		}
	}
}
