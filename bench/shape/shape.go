// Package shape sends the same requests (shape requests) to a worker that any client would send
// and reduces each response to its shape: which fields exist and with what
// JSON kinds, where a reasoning model's thinking is (inline <think> in
// content, reasoning_content, reasoning), whether tool calls come back
// structured or as prose, finish_reason, usage and timings, and how a stream
// is framed. Two shapes are compared with Diff, which words the differences
// as a client would notice them.
//
// The requests go through github.com/sashabaranov/go-openai, so a shape also
// records what a real client library surfaced, and the raw bytes of the
// same response are read too, so fields the library has no place for
// (vLLM's "reasoning", llama-server's "timings") are named rather than
// silently missed.
package shape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	openai "github.com/sashabaranov/go-openai"

	"fleet/bench"
)

// Where the thinking of a reasoning model was found.
const (
	ReasoningInline           = "inline <think>"
	ReasoningContentField     = "reasoning_content"
	ReasoningField            = "reasoning"
	ReasoningNone             = "none"
	ToolCallsStructured       = "structured"
	ToolCallsProse            = "prose"
	ToolCallsNone             = "none"
	RequestReasoning          = "reasoning"
	RequestTools              = "tools"
	RequestPlain              = "plain"
	reasoningPrompt           = "What is 17 multiplied by 23?"
	toolsPrompt               = "What is the weather in Paris right now? Use the tool."
	plainPrompt               = "Say hello in one short sentence."
	defaultMaxTokensReasoning = 512
	defaultMaxTokensPlain     = 64
)

// Shape is how one target answers the shape requests. It is JSON-serialisable so the
// hub can keep a model's reference shape and check new workers against it.
type Shape struct {
	Target  string   `json:"target"`
	Model   string   `json:"model"`
	Answers []Answer `json:"probes"`
}

// Answer is the shape of the answer to one shape request, streamed or
// not.
type Answer struct {
	Request  string `json:"probe"` // "reasoning", "tools", "plain"
	Streamed bool   `json:"streamed"`
	// Error is set when the request got no usable answer (HTTP error, broken
	// stream); Status is the HTTP status when one came.
	Error  string `json:"error,omitempty"`
	Status int    `json:"status,omitempty"`
	// Fields maps every JSON path of the response (arrays as [], stream
	// chunks merged) to the kinds seen there, "|"-joined: "string",
	// "empty string", "null", "number", "bool", "object", "array",
	// "empty array".
	Fields       map[string]string `json:"fields,omitempty"`
	ContentEmpty bool              `json:"content_empty"`
	// Reasoning is where the thinking was: ReasoningInline,
	// ReasoningContentField, ReasoningField or ReasoningNone, "+"-joined
	// when an engine put it in two places.
	Reasoning    string       `json:"reasoning"`
	ToolCalls    string       `json:"tool_calls"`
	FinishReason string       `json:"finish_reason"`
	Usage        bool         `json:"usage"`
	Timings      bool         `json:"timings"`
	Stream       *StreamShape `json:"stream,omitempty"`
	Client       ClientView   `json:"client"`
}

// Key names a request in reports: "reasoning, streamed".
func (p Answer) Key() string {
	if p.Streamed {
		return p.Request + ", streamed"
	}
	return p.Request + ", non-streamed"
}

// StreamShape is how a stream was framed.
type StreamShape struct {
	// RoleFirst: the first chunk's delta carried role "assistant".
	RoleFirst bool `json:"role_first"`
	// UsageChunk: usage came in a chunk of its own with choices: [], which a
	// client indexing choices[0] must be ready for.
	UsageChunk bool `json:"usage_chunk"`
	// Done: the stream ended with data: [DONE].
	Done bool `json:"done"`
	// Chunks is how many data events came; it varies with the text and is
	// never compared.
	Chunks int `json:"chunks"`
}

// ClientView is what go-openai made of the response.
type ClientView struct {
	Content          bool `json:"content"`
	ReasoningContent bool `json:"reasoning_content"`
	ToolCalls        int  `json:"tool_calls"`
	// Hidden lists paths that carried a value in the raw JSON but have no
	// field in go-openai's structs: a go-openai user cannot see them.
	Hidden []string `json:"hidden,omitempty"`
}

// Options tunes Measure. The zero value is what admission uses.
type Options struct {
	// MaxTokens caps the reasoning and tools requests (default 512: a small
	// reasoning model thinks about 17×23 in a few hundred tokens, and a
	// thought cut short still shows where the thinking goes). The plain
	// request is capped at 64.
	MaxTokens int
	Logger    *slog.Logger
}

type request struct {
	name      string
	messages  []openai.ChatCompletionMessage
	tools     []openai.Tool
	maxTokens int
}

func requests(maxTokens int) []request {
	user := func(s string) []openai.ChatCompletionMessage {
		return []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: s}}
	}
	weather := openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
		Name:        "get_weather",
		Description: "Get the current weather in a city",
		Parameters: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"location": map[string]any{"type": "string", "description": "City name, e.g. Paris"},
				"unit":     map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}},
			},
			"required": []string{"location"},
		},
	}}
	return []request{
		{name: RequestReasoning, messages: user(reasoningPrompt), maxTokens: maxTokens},
		{name: RequestTools, messages: user(toolsPrompt), tools: []openai.Tool{weather}, maxTokens: maxTokens},
		{name: RequestPlain, messages: user(plainPrompt), maxTokens: defaultMaxTokensPlain},
	}
}

// Measure sends the reasoning, tools and plain requests to target, each
// non-streamed then streamed, and returns the shape of the answers. A request
// that fails is part of the shape (a tools request rejected for want of
// --jinja is a finding); Measure fails only when no request got an answer or
// ctx ends.
func Measure(ctx context.Context, target bench.Target) (Shape, error) {
	return MeasureWith(ctx, target, Options{})
}

// MeasureWith is Measure with options.
func MeasureWith(ctx context.Context, target bench.Target, opts Options) (Shape, error) {
	if err := target.Validate(); err != nil {
		return Shape{}, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxTokens := opts.MaxTokens
	if maxTokens <= 0 {
		maxTokens = defaultMaxTokensReasoning
	}
	cfg := openai.DefaultConfig(target.APIKey)
	cfg.BaseURL = strings.TrimRight(target.BaseURL, "/")
	cfg.HTTPClient = target.RecordingClient()
	client := openai.NewClientWithConfig(cfg)

	shape := Shape{Target: target.Label(), Model: target.Model}
	var firstErr error
	answered := 0
	for _, p := range requests(maxTokens) {
		for _, streamed := range []bool{false, true} {
			if err := ctx.Err(); err != nil {
				return Shape{}, fmt.Errorf("shape requests to %s interrupted: %w", target.Label(), err)
			}
			ps := ask(ctx, client, target.Model, p, streamed)
			log.Debug("shape request", "target", target.Label(), "request", ps.Key(), "reasoning", ps.Reasoning,
				"content_empty", ps.ContentEmpty, "error", ps.Error)
			if ps.Error == "" {
				answered++
			} else if firstErr == nil {
				firstErr = errors.New(ps.Error)
			}
			shape.Answers = append(shape.Answers, ps)
		}
	}
	if answered == 0 {
		return Shape{}, fmt.Errorf("no shape request to %s (%s) got an answer; is the worker up and serving %q? first error: %w",
			target.Label(), target.BaseURL, target.Model, firstErr)
	}
	return shape, nil
}

func ask(ctx context.Context, client *openai.Client, model string, p request, streamed bool) Answer {
	ps := Answer{Request: p.name, Streamed: streamed}
	req := openai.ChatCompletionRequest{Model: model, Messages: p.messages, Tools: p.tools, MaxCompletionTokens: p.maxTokens}
	if len(p.tools) > 0 {
		req.ToolChoice = "auto"
	}
	capture := &bench.Capture{}
	cctx := bench.WithCapture(ctx, capture)
	if !streamed {
		resp, err := client.CreateChatCompletion(cctx, req)
		ps.Status = capture.Status()
		if err != nil {
			ps.Error = describeError(err)
			return ps
		}
		reduceResponse(&ps, capture.Body(), resp)
		return ps
	}
	req.Stream = true
	req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
	stream, err := client.CreateChatCompletionStream(cctx, req)
	ps.Status = capture.Status()
	if err != nil {
		ps.Error = describeError(err)
		return ps
	}
	defer stream.Close()
	var chunks []openai.ChatCompletionStreamResponse
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			ps.Error = "stream broke: " + describeError(err)
			break
		}
		chunks = append(chunks, chunk)
	}
	reduceStream(&ps, capture.Body(), chunks)
	return ps
}

func describeError(err error) string {
	var apiErr *openai.APIError
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("HTTP %d: %s", apiErr.HTTPStatusCode, apiErr.Message)
	}
	var reqErr *openai.RequestError
	if errors.As(err, &reqErr) {
		return fmt.Sprintf("HTTP %d: %v", reqErr.HTTPStatusCode, reqErr.Err)
	}
	return err.Error()
}

// text is what one choice said, accumulated over a stream.
type text struct {
	content, reasoningContent, reasoning string
	toolCalls                            int
	finish                               string
}

func reduceResponse(ps *Answer, raw []byte, resp openai.ChatCompletionResponse) {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		ps.Error = fmt.Sprintf("response is not JSON: %v", err)
		return
	}
	fields := map[string]map[string]bool{}
	collectKinds(fields, "", doc)
	ps.Fields = joinKinds(fields)
	top, _ := doc.(map[string]any)
	var t text
	if choice := firstChoice(top); choice != nil {
		msg, _ := choice["message"].(map[string]any)
		t.add(msg)
		t.finish, _ = choice["finish_reason"].(string)
	}
	ps.Usage = isObject(top["usage"])
	_, ps.Timings = top["timings"]
	ps.summarise(t)

	if len(resp.Choices) > 0 {
		m := resp.Choices[0].Message
		ps.Client = ClientView{Content: m.Content != "", ReasoningContent: m.ReasoningContent != "", ToolCalls: len(m.ToolCalls)}
	}
	seen, _ := json.Marshal(resp)
	ps.Client.Hidden = hiddenPaths(doc, seen)
}

func reduceStream(ps *Answer, raw []byte, chunks []openai.ChatCompletionStreamResponse) {
	fields := map[string]map[string]bool{}
	hidden := map[string]bool{}
	st := &StreamShape{}
	var t text
	first := true
	for _, payload := range dataEvents(raw) {
		if payload == "[DONE]" {
			st.Done = true
			continue
		}
		st.Chunks++
		var doc any
		if err := json.Unmarshal([]byte(payload), &doc); err != nil {
			if ps.Error == "" {
				ps.Error = fmt.Sprintf("stream event is not JSON: %q", truncate(payload, 80))
			}
			continue
		}
		collectKinds(fields, "", doc)
		top, _ := doc.(map[string]any)
		if _, isErr := top["error"]; isErr && ps.Error == "" {
			ps.Error = "error event in stream: " + truncate(payload, 200)
		}
		choices, _ := top["choices"].([]any)
		if first && len(choices) > 0 {
			first = false
			if delta, _ := firstChoice(top)["delta"].(map[string]any); delta != nil {
				st.RoleFirst = delta["role"] == "assistant"
			}
		}
		if isObject(top["usage"]) {
			ps.Usage = true
			if choices != nil && len(choices) == 0 {
				st.UsageChunk = true
			}
		}
		if _, ok := top["timings"]; ok {
			ps.Timings = true
		}
		if choice := firstChoice(top); choice != nil {
			delta, _ := choice["delta"].(map[string]any)
			t.add(delta)
			if fr, ok := choice["finish_reason"].(string); ok && fr != "" {
				t.finish = fr
			}
		}
	}
	ps.Fields = joinKinds(fields)
	ps.Stream = st
	ps.summarise(t)

	var client ClientView
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue
			}
			client.Content = client.Content || ch.Delta.Content != ""
			client.ReasoningContent = client.ReasoningContent || ch.Delta.ReasoningContent != ""
			client.ToolCalls += countNewToolCalls(ch.Delta.ToolCalls)
		}
	}
	rawEvents := dataEvents(raw)
	for i, c := range chunks {
		if i >= len(rawEvents) {
			break
		}
		var doc any
		if json.Unmarshal([]byte(rawEvents[i]), &doc) != nil {
			continue
		}
		seen, _ := json.Marshal(c)
		for _, h := range hiddenPaths(doc, seen) {
			hidden[h] = true
		}
	}
	client.Hidden = sortedKeys(hidden)
	ps.Client = client
}

// countNewToolCalls counts tool-call deltas that open a call (carry an id or
// a name); the rest continue an earlier one's arguments.
func countNewToolCalls(calls []openai.ToolCall) int {
	n := 0
	for _, c := range calls {
		if c.ID != "" || c.Function.Name != "" {
			n++
		}
	}
	return n
}

func (t *text) add(m map[string]any) {
	if m == nil {
		return
	}
	s, _ := m["content"].(string)
	t.content += s
	s, _ = m["reasoning_content"].(string)
	t.reasoningContent += s
	s, _ = m["reasoning"].(string)
	t.reasoning += s
	if calls, ok := m["tool_calls"].([]any); ok {
		for _, c := range calls {
			call, _ := c.(map[string]any)
			fn, _ := call["function"].(map[string]any)
			if id, _ := call["id"].(string); id != "" {
				t.toolCalls++
			} else if name, _ := fn["name"].(string); name != "" {
				t.toolCalls++
			}
		}
	}
}

// summarise turns the accumulated text into the shape's verdict fields.
func (ps *Answer) summarise(t text) {
	var where []string
	if strings.Contains(t.content, "<think>") || strings.Contains(t.content, "</think>") {
		where = append(where, ReasoningInline)
	}
	if strings.TrimSpace(t.reasoningContent) != "" {
		where = append(where, ReasoningContentField)
	}
	if strings.TrimSpace(t.reasoning) != "" {
		where = append(where, ReasoningField)
	}
	ps.Reasoning = ReasoningNone
	if len(where) > 0 {
		ps.Reasoning = strings.Join(where, "+")
	}
	ps.ContentEmpty = strings.TrimSpace(t.content) == ""
	switch {
	case t.toolCalls > 0:
		ps.ToolCalls = ToolCallsStructured
	case strings.Contains(t.content, "<tool_call>") || strings.Contains(afterThinking(t.content), "get_weather"):
		ps.ToolCalls = ToolCallsProse
	default:
		ps.ToolCalls = ToolCallsNone
	}
	ps.FinishReason = t.finish
}

// afterThinking drops an inline <think> block, so a model musing about the
// get_weather tool is not taken for a tool call written as prose.
func afterThinking(content string) string {
	if _, after, found := strings.Cut(content, "</think>"); found {
		return after
	}
	if strings.Contains(content, "<think>") {
		return ""
	}
	return content
}

func firstChoice(top map[string]any) map[string]any {
	choices, _ := top["choices"].([]any)
	for _, c := range choices {
		if m, ok := c.(map[string]any); ok {
			if idx, ok := m["index"].(float64); !ok || idx == 0 {
				return m
			}
		}
	}
	return nil
}

func isObject(v any) bool {
	_, ok := v.(map[string]any)
	return ok
}

// dataEvents splits an SSE body into its data payloads, skipping comments
// (": ping") and other fields.
func dataEvents(raw []byte) []string {
	var out []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		line = strings.TrimRight(line, "\r")
		if payload, ok := strings.CutPrefix(line, "data:"); ok {
			out = append(out, strings.TrimSpace(payload))
		}
	}
	return out
}

// collectKinds records the JSON kind of every path under v.
func collectKinds(into map[string]map[string]bool, path string, v any) {
	add := func(kind string) {
		if into[path] == nil {
			into[path] = map[string]bool{}
		}
		into[path][kind] = true
	}
	switch x := v.(type) {
	case nil:
		add("null")
	case string:
		if x == "" {
			add("empty string")
		} else {
			add("string")
		}
	case float64:
		add("number")
	case bool:
		add("bool")
	case []any:
		if len(x) == 0 {
			add("empty array")
		} else {
			add("array")
		}
		for _, e := range x {
			collectKinds(into, path+"[]", e)
		}
	case map[string]any:
		if path != "" {
			add("object")
		}
		for k, e := range x {
			collectKinds(into, join(path, k), e)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func joinKinds(m map[string]map[string]bool) map[string]string {
	out := make(map[string]string, len(m))
	for path, kinds := range m {
		out[path] = strings.Join(sortedKeys(kinds), "|")
	}
	return out
}

// hiddenPaths lists the top-most paths that carry a value in raw but are
// absent once the client library's struct is marshalled back: the fields
// its users cannot read.
func hiddenPaths(raw any, clientJSON []byte) []string {
	var seen any
	_ = json.Unmarshal(clientJSON, &seen)
	seenPaths := map[string]map[string]bool{}
	collectKinds(seenPaths, "", seen)
	rawPaths := map[string]map[string]bool{}
	collectKinds(rawPaths, "", raw)
	var hidden []string
	for path, kinds := range rawPaths {
		if _, ok := seenPaths[path]; ok || !carriesValue(kinds) {
			continue
		}
		hidden = append(hidden, path)
	}
	slices.Sort(hidden)
	// Keep only top-most: "timings" covers "timings.prompt_n".
	var out []string
	for _, p := range hidden {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]+".") {
			continue
		}
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]+"[]") {
			continue
		}
		out = append(out, p)
	}
	return out
}

func carriesValue(kinds map[string]bool) bool {
	for k := range kinds {
		switch k {
		case "null", "empty string", "empty array":
		default:
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
