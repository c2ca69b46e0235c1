package shape

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"fleet/bench"
)

// fakeEngine answers chat completions in one engine's shape. It is small on
// purpose: the sim package is the realistic one; this one pins each shape
// aspect independently.
type fakeEngine struct {
	reasoning   string // "inline", "reasoning_content", "reasoning", ""
	emptyAnswer bool   // llama-server default with the answer cut: content ""
	proseTools  bool   // tool calls written into content
	timings     bool
	usageChunk  bool // usage in a separate choices:[] chunk (else on the finish chunk)
	noDone      bool
	toolsStatus int // non-zero: the tools request fails with this status
}

const (
	fakeThinking = "Okay, 17 times 23 is 391."
	fakeAnswer   = "17 × 23 = 391."
)

func (f fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool              `json:"stream"`
		Tools  []json.RawMessage `json:"tools"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error","code":400}}`, 400)
		return
	}
	tools := len(req.Tools) > 0
	if tools && f.toolsStatus != 0 {
		w.WriteHeader(f.toolsStatus)
		fmt.Fprintf(w, `{"error":{"code":%d,"message":"tools param requires --jinja flag","type":"invalid_request_error"}}`, f.toolsStatus)
		return
	}
	answer := fakeAnswer
	if f.emptyAnswer {
		answer = ""
	}
	// Pieces of the response in order: (field, text).
	type piece struct{ field, text string }
	var pieces []piece
	switch f.reasoning {
	case "inline":
		pieces = append(pieces, piece{"content", "<think>\n"}, piece{"content", fakeThinking}, piece{"content", "\n</think>\n\n"})
	case "reasoning_content", "reasoning":
		pieces = append(pieces, piece{f.reasoning, fakeThinking})
	}
	finish := "stop"
	var toolCall string
	switch {
	case tools && f.proseTools:
		pieces = append(pieces, piece{"content", `<tool_call>{"name": "get_weather", "arguments": {"location": "Paris"}}</tool_call>`})
	case tools:
		toolCall = `[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]`
		finish = "tool_calls"
	case answer != "":
		pieces = append(pieces, piece{"content", answer})
	}
	usage := `{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}`
	timings := ""
	if f.timings {
		timings = `,"timings":{"prompt_n":12,"prompt_ms":20.1,"predicted_n":30,"predicted_ms":300.5,"predicted_per_second":99.8}`
	}
	env := `"id":"chatcmpl-x","created":1,"model":"qwen3-4b"`

	if !req.Stream {
		msg := map[string]any{"role": "assistant"}
		content := ""
		for _, p := range pieces {
			if p.field == "content" {
				content += p.text
			} else {
				msg[p.field] = p.text
			}
		}
		msg["content"] = content
		if toolCall != "" {
			msg["tool_calls"] = json.RawMessage(toolCall)
		}
		m, _ := json.Marshal(msg)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{%s,"object":"chat.completion","choices":[{"index":0,"finish_reason":%q,"message":%s}],"usage":%s%s}`,
			env, finish, m, usage, timings)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(delta, finishReason, extra string) {
		fr := "null"
		if finishReason != "" {
			fr = `"` + finishReason + `"`
		}
		fmt.Fprintf(w, "data: {%s,\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]%s}\n\n", env, delta, fr, extra)
	}
	send(`{"role":"assistant","content":""}`, "", "")
	for _, p := range pieces {
		t, _ := json.Marshal(p.text)
		send(fmt.Sprintf(`{%q:%s}`, p.field, t), "", "")
	}
	if toolCall != "" {
		send(`{"tool_calls":`+toolCall+`}`, "", "")
	}
	if f.usageChunk {
		send(`{}`, finish, timings)
		fmt.Fprintf(w, "data: {%s,\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":%s%s}\n\n", env, usage, timings)
	} else {
		send(`{}`, finish, `,"usage":`+usage+timings)
	}
	if !f.noDone {
		io.WriteString(w, "data: [DONE]\n\n")
	}
}

func measureFake(t *testing.T, name string, f fakeEngine) Shape {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Measure(ctx, bench.Target{Name: name, BaseURL: srv.URL + "/v1", Model: "qwen3-4b"})
	if err != nil {
		t.Fatalf("Measure %s: %v", name, err)
	}
	return s
}

func find(t *testing.T, s Shape, request string, streamed bool) Answer {
	t.Helper()
	for _, p := range s.Answers {
		if p.Request == request && p.Streamed == streamed {
			return p
		}
	}
	t.Fatalf("no %s request (streamed %v) in %+v", request, streamed, s)
	return Answer{}
}

var (
	vllmInline   = fakeEngine{reasoning: "inline", usageChunk: true}
	vllmParser   = fakeEngine{reasoning: "reasoning", usageChunk: true}
	llamaDefault = fakeEngine{reasoning: "reasoning_content", emptyAnswer: true, timings: true, usageChunk: true}
	llamaNone    = fakeEngine{reasoning: "inline", timings: true, usageChunk: true}
)

func TestMeasureShape(t *testing.T) {
	tests := []struct {
		name         string
		engine       fakeEngine
		streamed     bool
		wantReason   string
		wantEmpty    bool
		wantTools    string
		wantFinish   string
		wantTimings  bool
		wantHidden   string // a path go-openai cannot see, or ""
		wantRoleOK   bool
		wantUsageChk bool
	}{
		{"vLLM inline", vllmInline, false, ReasoningInline, false, ToolCallsStructured, "stop", false, "", false, false},
		{"vLLM inline streamed", vllmInline, true, ReasoningInline, false, ToolCallsStructured, "stop", false, "", true, true},
		{"vLLM parser", vllmParser, false, ReasoningField, false, ToolCallsStructured, "stop", false, "choices[].message.reasoning", false, false},
		{"vLLM parser streamed", vllmParser, true, ReasoningField, false, ToolCallsStructured, "stop", false, "choices[].delta.reasoning", true, true},
		{"llama default", llamaDefault, false, ReasoningContentField, true, ToolCallsStructured, "stop", true, "timings", false, false},
		{"llama default streamed", llamaDefault, true, ReasoningContentField, true, ToolCallsStructured, "stop", true, "timings", true, true},
		{"llama without jinja", fakeEngine{reasoning: "inline", proseTools: true}, false, ReasoningInline, false, ToolCallsProse, "stop", false, "", false, false},
		{"usage on the finish chunk", fakeEngine{}, true, ReasoningNone, false, ToolCallsStructured, "stop", false, "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := measureFake(t, tt.name, tt.engine)
			if len(s.Answers) != 6 {
				t.Fatalf("want 6 answers (3 prompts × streamed or not), got %d", len(s.Answers))
			}
			r := find(t, s, RequestReasoning, tt.streamed)
			if r.Error != "" {
				t.Fatalf("reasoning request failed: %s", r.Error)
			}
			if r.Reasoning != tt.wantReason || r.ContentEmpty != tt.wantEmpty {
				t.Errorf("reasoning at %q, content empty %v; want %q, %v", r.Reasoning, r.ContentEmpty, tt.wantReason, tt.wantEmpty)
			}
			if r.FinishReason != tt.wantFinish || !r.Usage || r.Timings != tt.wantTimings {
				t.Errorf("finish %q usage %v timings %v; want %q, true, %v", r.FinishReason, r.Usage, r.Timings, tt.wantFinish, tt.wantTimings)
			}
			if tt.wantHidden != "" && !strings.Contains(strings.Join(r.Client.Hidden, ","), tt.wantHidden) {
				t.Errorf("go-openai hidden fields %v, want %s among them", r.Client.Hidden, tt.wantHidden)
			}
			if tt.wantHidden == "" && len(r.Client.Hidden) > 0 {
				t.Errorf("go-openai hidden fields %v, want none", r.Client.Hidden)
			}
			if tt.streamed {
				if r.Stream == nil || r.Stream.RoleFirst != tt.wantRoleOK || r.Stream.UsageChunk != tt.wantUsageChk || !r.Stream.Done {
					t.Errorf("stream shape %+v, want role first %v, usage chunk %v, [DONE]", r.Stream, tt.wantRoleOK, tt.wantUsageChk)
				}
			}
			if tt.wantReason == ReasoningContentField && !r.Client.ReasoningContent {
				t.Errorf("go-openai should see reasoning_content: %+v", r.Client)
			}
			if tt.wantReason == ReasoningField && r.Client.ReasoningContent {
				t.Errorf("go-openai has no field for vLLM's reasoning, yet saw it: %+v", r.Client)
			}
			tools := find(t, s, RequestTools, tt.streamed)
			if tools.ToolCalls != tt.wantTools {
				t.Errorf("tool calls %q, want %q", tools.ToolCalls, tt.wantTools)
			}
			if tt.wantTools == ToolCallsStructured && (tools.FinishReason != "tool_calls" || tools.Client.ToolCalls != 1) {
				t.Errorf("tools request: finish %q, go-openai saw %d calls", tools.FinishReason, tools.Client.ToolCalls)
			}
			// A shape must survive the store: JSON in, JSON out, same verdict.
			raw, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back Shape
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			if ok, rep := Matches(s, back); !ok {
				t.Errorf("shape does not match its own JSON round trip:\n%s", rep.Text(100, false))
			}
		})
	}
}

func TestMeasureFailures(t *testing.T) {
	t.Run("tools rejected is a finding, not a failure", func(t *testing.T) {
		s := measureFake(t, "nojinja", fakeEngine{toolsStatus: 400})
		tools := find(t, s, RequestTools, false)
		if tools.Error == "" || tools.Status != 400 || !strings.Contains(tools.Error, "--jinja") {
			t.Errorf("tools request error %q status %d", tools.Error, tools.Status)
		}
		d := Diff(measureFake(t, "ok", fakeEngine{}), s)
		if d.Verdict != VerdictDiffers || !strings.Contains(d.Text(100, false), "failed on nojinja") {
			t.Errorf("diff does not report the failed request:\n%s", d.Text(100, false))
		}
	})
	t.Run("nothing answers", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":{"message":"model not loaded","type":"server_error","code":503}}`, http.StatusServiceUnavailable)
		}))
		defer srv.Close()
		_, err := Measure(context.Background(), bench.Target{Name: "down", BaseURL: srv.URL + "/v1", Model: "m"})
		if err == nil || !strings.Contains(err.Error(), "no shape request to down") || !strings.Contains(err.Error(), "503") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("bad target", func(t *testing.T) {
		for _, tg := range []bench.Target{{Name: "x", BaseURL: "127.0.0.1:8080", Model: "m"}, {Name: "y", BaseURL: "http://h/v1"}} {
			if _, err := Measure(context.Background(), tg); err == nil {
				t.Errorf("target %+v accepted", tg)
			}
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		srv := httptest.NewServer(fakeEngine{})
		defer srv.Close()
		if _, err := Measure(ctx, bench.Target{Name: "c", BaseURL: srv.URL + "/v1", Model: "m"}); err == nil {
			t.Error("cancelled measurement succeeded")
		}
	})
}

func TestDiff(t *testing.T) {
	rig := measureFake(t, "rig", vllmInline)
	ultra := measureFake(t, "ultra", llamaDefault)
	fixed := measureFake(t, "ultra", llamaNone)
	parser := measureFake(t, "gpu", vllmParser)
	prose := measureFake(t, "mac", fakeEngine{reasoning: "inline", proseTools: true, usageChunk: true})

	tests := []struct {
		name        string
		a, b        Shape
		wantVerdict string
		wantText    []string
		notText     []string
	}{
		{
			name: "the seed's difference", a: rig, b: ultra, wantVerdict: VerdictDiffers,
			wantText: []string{"every prompt, streamed and not: content empty, reasoning in reasoning_content on ultra; inline <think> on rig",
				"timings only on ultra"},
		},
		{
			name: "after --reasoning-format none", a: rig, b: fixed, wantVerdict: VerdictSame,
			wantText: []string{"SAME", "timings only on ultra"}, notText: []string{"✗"},
		},
		{
			name: "vLLM reasoning field is invisible to go-openai", a: rig, b: parser, wantVerdict: VerdictDiffers,
			wantText: []string{"reasoning in reasoning (go-openai cannot see it) on gpu", "choices[].message.reasoning"},
		},
		{
			name: "tool calls as prose", a: rig, b: prose, wantVerdict: VerdictDiffers,
			wantText: []string{"tools prompt, streamed and not: tool calls structured on rig; as prose in content on mac"},
		},
		{name: "identical", a: rig, b: rig, wantVerdict: VerdictSame},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Diff(tt.a, tt.b)
			text := r.Text(160, false)
			if r.Verdict != tt.wantVerdict {
				t.Errorf("verdict %s, want %s\n%s", r.Verdict, tt.wantVerdict, text)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(text, w) {
					t.Errorf("report lacks %q:\n%s", w, text)
				}
			}
			for _, w := range tt.notText {
				if strings.Contains(text, w) {
					t.Errorf("report has %q:\n%s", w, text)
				}
			}
			if ok, _ := Matches(tt.a, tt.b); ok != (tt.wantVerdict == VerdictSame) {
				t.Errorf("Matches = %v, disagrees with the verdict", ok)
			}
			coloured := r.Text(80, true)
			if !strings.Contains(coloured, "\x1b[") {
				t.Error("colour asked for, none given")
			}
			for _, line := range strings.Split(r.Text(80, false), "\n") {
				if n := visibleWidth(line); n > 82 {
					t.Errorf("line wider than the terminal (%d): %q", n, line)
				}
			}
		})
	}
}

// The shape requests cap their answers with max_completion_tokens: max_tokens is
// deprecated in the OpenAI API, and vLLM, llama-server and sim read both.
func TestShapeRequestsCapWithMaxCompletionTokens(t *testing.T) {
	bodies := make(chan map[string]any, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("request body: %v", err)
		}
		bodies <- body
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	if _, err := Measure(context.Background(), bench.Target{Name: "cap", BaseURL: srv.URL + "/v1", Model: "m"}); err == nil {
		t.Fatal("Measure of an engine that answers 503 succeeded")
	}
	close(bodies)
	n := 0
	for body := range bodies {
		n++
		if _, ok := body["max_tokens"]; ok {
			t.Errorf("a shape request sent the deprecated max_tokens: %v", body)
		}
		if v, ok := body["max_completion_tokens"].(float64); !ok || v < 1 {
			t.Errorf("a shape request sent no max_completion_tokens cap: %v", body)
		}
	}
	if n == 0 {
		t.Fatal("no shape request reached the engine")
	}
}
