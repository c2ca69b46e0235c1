package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envNpmSDKs names the directory .ci/install-sdks prints: the official
// SDKs' node_modules, installed outside the clone.
const envNpmSDKs = "FLEET_NPM_SDKS"

// npmSDKs finds node and the installed SDKs, or skips saying how to get
// them. A $FLEET_NPM_SDKS that holds no SDKs fails: whoever set it meant
// the test to run.
func npmSDKs(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the SDK test runs the official Anthropic and OpenAI SDKs with it (apt-get install nodejs; .ci/run does)")
	}
	has := func(d string) bool {
		_, errA := os.Stat(filepath.Join(d, "node_modules", "@anthropic-ai", "sdk", "package.json"))
		_, errO := os.Stat(filepath.Join(d, "node_modules", "openai", "package.json"))
		return errA == nil && errO == nil
	}
	if dir = os.Getenv(envNpmSDKs); dir != "" {
		if !has(dir) {
			t.Fatalf("%s=%s holds no node_modules/@anthropic-ai/sdk and node_modules/openai: run .ci/install-sdks, which prints the directory", envNpmSDKs, dir)
		}
		return node, dir
	}
	found, _ := filepath.Glob("/var/cache/fleet/npm-sdk-*")
	sort.Sort(sort.Reverse(sort.StringSlice(found)))
	for _, d := range found {
		if has(d) {
			return node, d
		}
	}
	t.Skipf("the official SDKs are not installed (neither $%s nor /var/cache/fleet/npm-sdk-*): run .ci/install-sdks (CI does)", envNpmSDKs)
	return "", ""
}

type sdkUsage struct {
	InputTokens      int `json:"input_tokens"`
	OutputTokens     int `json:"output_tokens"`
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type sdkStream struct {
	Error      string    `json:"error"`
	Text       string    `json:"text"`
	OutputText string    `json:"output_text"`
	Events     []string  `json:"events"`
	Model      string    `json:"model"`
	StopReason string    `json:"stop_reason"`
	Usage      *sdkUsage `json:"usage"`
}

// TestOfficialSDKsStreamThroughTheRouter runs the official Anthropic
// TypeScript SDK and the official OpenAI SDK (chat completions and the
// Responses API) against the demo fleet behind a router that requires keys,
// and checks what each client saw: streamed text, usage, and the model name
// it asked for (an alias, which the engines never hear); n = 2 is answered by
// the vLLM worker, the only one that returns several choices.
func TestOfficialSDKsStreamThroughTheRouter(t *testing.T) {
	t.Parallel()
	node, sdks := npmSDKs(t)
	data := t.TempDir()
	port := freePort(t)
	h := startHub(t, data, port)
	waitReady(t, data, 3, 120*time.Second)
	out, code := fleetCmd(t, data, "key", "create", "sdk")
	key := strings.TrimSpace(strings.Split(out, "\n")[0])
	if code != 0 || !strings.HasPrefix(key, "fk-") {
		t.Fatalf("key create: exit %d: %q", code, out)
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	h.cmd.Wait()
	h = startHub(t, data, port, "--require-keys")
	waitReady(t, data, 3, 120*time.Second)

	// The script imports the SDKs by name: node finds them through a
	// node_modules link beside it.
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("testdata", "sdk", "stream.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stream.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(sdks, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "stream.mjs"))
	cmd.Env = append(os.Environ(), "FLEET_BASE=http://"+h.http, "FLEET_KEY="+key, "FLEET_MODEL=qwen3")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("node stream.mjs: %v\nstdout: %s\nstderr: %s", err, raw, stderr.String())
	}
	var got struct {
		Anthropic      sdkStream `json:"anthropic_stream"`
		AnthropicError struct {
			Status    int    `json:"status"`
			Type      string `json:"type"`
			ErrorType string `json:"error_type"`
			Message   string `json:"message"`
		} `json:"anthropic_error"`
		Chat  sdkStream `json:"openai_chat_stream"`
		ChatN struct {
			Error   string    `json:"error"`
			Choices int       `json:"choices"`
			Model   string    `json:"model"`
			Usage   *sdkUsage `json:"usage"`
		} `json:"openai_chat_n"`
		Responses sdkStream `json:"openai_responses_stream"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("the script's output is not JSON: %v\n%s", err, raw)
	}
	t.Logf("SDKs saw: %s", raw)
	const maxTokens = 24 // stream.mjs's; every sim answer is longer

	a := got.Anthropic
	wantEvents := []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	switch {
	case a.Error != "":
		t.Errorf("Anthropic SDK stream failed: %s", a.Error)
	case a.Text == "" || a.Model != "qwen3" || a.StopReason != "max_tokens" || !slices.Equal(a.Events, wantEvents):
		t.Errorf("Anthropic SDK stream: text %q model %q stop %q events %v", a.Text, a.Model, a.StopReason, a.Events)
	case a.Usage == nil || a.Usage.OutputTokens != maxTokens || a.Usage.InputTokens <= 0:
		t.Errorf("Anthropic SDK usage %+v, want %d output tokens and the input counted", a.Usage, maxTokens)
	}
	if e := got.AnthropicError; e.Status != 404 || e.Type != "error" || e.ErrorType != "not_found_error" || !strings.Contains(e.Message, "no-such-model") {
		t.Errorf("Anthropic SDK error for an unknown model: %+v, want a 404 Anthropic error body naming the model", e)
	}

	c := got.Chat
	switch {
	case c.Error != "":
		t.Errorf("OpenAI SDK chat stream failed: %s", c.Error)
	case c.Text == "" || c.Model != "qwen3":
		t.Errorf("OpenAI SDK chat stream: text %q model %q", c.Text, c.Model)
	case c.Usage == nil || c.Usage.CompletionTokens != maxTokens || c.Usage.PromptTokens <= 0:
		t.Errorf("OpenAI SDK chat usage %+v, want %d completion tokens", c.Usage, maxTokens)
	}

	if n := got.ChatN; n.Error != "" || n.Choices != 2 || n.Model != "qwen3" || n.Usage == nil || n.Usage.CompletionTokens != 16 {
		t.Errorf("OpenAI SDK chat with n=2: %+v, want 2 choices of 8 tokens from the vLLM worker", n)
	}

	r := got.Responses
	switch {
	case r.Error != "":
		t.Errorf("OpenAI SDK Responses stream failed: %s", r.Error)
	case r.Text == "" || r.Text != r.OutputText || r.Model != "qwen3":
		t.Errorf("OpenAI SDK Responses stream: text %q (final output %q) model %q", r.Text, r.OutputText, r.Model)
	case !slices.Contains(r.Events, "response.created") || !slices.Contains(r.Events, "response.output_text.delta"):
		t.Errorf("OpenAI SDK Responses events %v", r.Events)
	case r.Usage == nil || r.Usage.OutputTokens != maxTokens || r.Usage.InputTokens <= 0:
		t.Errorf("OpenAI SDK Responses usage %+v, want %d output tokens", r.Usage, maxTokens)
	}
}
