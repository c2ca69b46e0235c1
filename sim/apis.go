package sim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
)

// apiKind is the wire format a generation request came in, and is answered, in.
type apiKind int

const (
	apiOpenAI    apiKind = iota // chat and text completions
	apiMessages                 // Anthropic Messages (/v1/messages)
	apiResponses                // OpenAI Responses (/v1/responses)
)

// apiStreamState is where an Anthropic or Responses stream stands.
type apiStreamState struct {
	// block is the kind of the open content block ("" none): "text",
	// "thinking" or "tool_use"; index counts the blocks opened before it.
	block string
	index int
	// seq is the Responses stream's sequence_number (vLLM sends it).
	seq int
	// itemID names the Responses output message.
	itemID string
	// text is the Responses output text so far.
	text strings.Builder
}

// blockKind says which content block a piece belongs to in an Anthropic or
// Responses answer, and its text there; "" when it shows nothing (a <think>
// tag when thoughts go to their own block).
func (j *job) blockKind(p piece) string {
	switch p.kind {
	case pieceThinkTag:
		if j.placement == thoughtsField {
			return ""
		}
		return "text"
	case pieceReasoning:
		if j.placement == thoughtsInline {
			return "text"
		}
		return "thinking"
	case pieceToolArgs:
		return "tool_use"
	}
	return "text"
}

func (j *job) apiStart() {
	if j.api == apiMessages {
		j.sendNamed("message_start", obj{{"type", "message_start"}, {"message", j.messageObject(true)}})
		return
	}
	j.apiStream.itemID = "msg_" + j.s.newID(32, !j.s.llama())
	j.sendResponseEvent("response.created", obj{{"response", j.responseObject("in_progress", false)}})
	j.sendResponseEvent("response.in_progress", obj{{"response", j.responseObject("in_progress", false)}})
	item := obj{{"content", []any{}}, {"id", j.apiStream.itemID}, {"role", "assistant"}, {"status", "in_progress"}, {"type", "message"}}
	j.sendResponseEvent("response.output_item.added", j.atOutput(obj{{"item", item}}, false))
	j.sendResponseEvent("response.content_part.added", j.atOutput(obj{{"item_id", j.apiStream.itemID},
		{"part", obj{{"type", "output_text"}, {"text", ""}}}}, true))
}

func (j *job) apiPiece(p piece) {
	kind := j.blockKind(p)
	if kind == "" {
		return
	}
	if j.api == apiResponses {
		// Thoughts in their own field are not part of the output text.
		if kind != "text" {
			return
		}
		j.apiStream.text.WriteString(p.text)
		j.sendResponseEvent("response.output_text.delta", j.atOutput(obj{{"item_id", j.apiStream.itemID}, {"delta", p.text}}, true))
		return
	}
	st := &j.apiStream
	if st.block != kind {
		j.stopBlock()
		st.block = kind
		var start obj
		switch kind {
		case "thinking":
			start = obj{{"type", "thinking"}, {"thinking", ""}}
		case "tool_use":
			start = obj{{"type", "tool_use"}, {"id", j.plan.tool.id}, {"name", j.plan.tool.name}, {"input", obj{}}}
		default:
			start = obj{{"type", "text"}, {"text", ""}}
		}
		j.sendNamed("content_block_start", obj{{"type", "content_block_start"}, {"index", st.index}, {"content_block", start}})
	}
	var delta obj
	switch kind {
	case "thinking":
		delta = obj{{"type", "thinking_delta"}, {"thinking", p.text}}
	case "tool_use":
		delta = obj{{"type", "input_json_delta"}, {"partial_json", p.text}}
	default:
		delta = obj{{"type", "text_delta"}, {"text", p.text}}
	}
	j.sendNamed("content_block_delta", obj{{"type", "content_block_delta"}, {"index", st.index}, {"delta", delta}})
}

func (j *job) stopBlock() {
	st := &j.apiStream
	if st.block == "" {
		return
	}
	j.sendNamed("content_block_stop", obj{{"type", "content_block_stop"}, {"index", st.index}})
	st.block = ""
	st.index++
}

func (j *job) apiFinish() {
	if j.api == apiMessages {
		if !j.stream {
			writeJSON(j.w, http.StatusOK, j.messageObject(false))
			return
		}
		j.stopBlock()
		delta := obj{{"stop_reason", stopReason(j.plan.finish)}, {"stop_sequence", nil}}
		usage := obj{{"output_tokens", j.generated}}
		if !j.s.llama() {
			// vLLM leaves unset fields out and repeats the prompt's size.
			delta = delta[:1]
			usage = obj{{"input_tokens", j.promptTokens}, {"output_tokens", j.generated}}
		}
		j.sendNamed("message_delta", obj{{"type", "message_delta"}, {"delta", delta}, {"usage", usage}})
		j.sendNamed("message_stop", obj{{"type", "message_stop"}})
		return
	}
	final := j.responseObject(j.responseStatus(), true)
	if !j.stream {
		writeJSON(j.w, http.StatusOK, final)
		return
	}
	text := j.apiStream.text.String()
	j.sendResponseEvent("response.output_text.done", j.atOutput(obj{{"item_id", j.apiStream.itemID}, {"text", text}}, true))
	j.sendResponseEvent("response.content_part.done", j.atOutput(obj{{"item_id", j.apiStream.itemID}, {"part", outputText(text)}}, true))
	j.sendResponseEvent("response.output_item.done", j.atOutput(obj{{"item", j.outputMessage(text)}}, false))
	ev := obj{{"response", final}}
	if j.s.llama() {
		ev = append(ev, field{"timings", j.timings()})
	}
	j.sendResponseEvent("response."+j.responseStatus(), ev)
}

// stopReason is Anthropic's name for an OpenAI finish reason.
func stopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls":
		return "tool_use"
	}
	return "end_turn"
}

// messageObject is the Anthropic message: empty and without a stop reason
// for message_start, whole for a non-streamed answer.
func (j *job) messageObject(start bool) obj {
	var content []any
	var stop any
	if !start {
		stop = stopReason(j.plan.finish)
		if j.placement != thoughtsInline && j.reasoning.Len() > 0 {
			content = append(content, obj{{"type", "thinking"}, {"thinking", j.reasoning.String()}, {"signature", j.s.newID(32, true)}})
		}
		if j.content.Len() > 0 {
			content = append(content, obj{{"type", "text"}, {"text", j.content.String()}})
		}
		if j.plan.tool != nil && j.plan.structuredTool {
			content = append(content, obj{{"type", "tool_use"}, {"id", j.plan.tool.id}, {"name", j.plan.tool.name},
				{"input", json.RawMessage(completeJSON(j.toolArgs.String()))}})
		}
	}
	if content == nil {
		content = []any{}
	}
	out := 0
	if !start {
		out = j.generated
	}
	if j.s.llama() {
		// llama-server counts the cached prompt apart, as Anthropic does.
		return obj{{"id", j.id}, {"type", "message"}, {"role", "assistant"}, {"content", content}, {"model", j.s.opts.ModelID()},
			{"stop_reason", stop}, {"stop_sequence", nil},
			{"usage", obj{{"cache_read_input_tokens", j.cached}, {"input_tokens", j.promptTokens - j.cached}, {"output_tokens", out}}}}
	}
	usage := obj{{"input_tokens", j.promptTokens}, {"output_tokens", out}}
	if start {
		// vLLM's message_start leaves out the fields it did not set.
		return obj{{"id", j.id}, {"content", content}, {"model", j.s.opts.ModelID()}, {"stop_reason", nil}, {"stop_sequence", nil}, {"usage", usage}}
	}
	return obj{{"id", j.id}, {"type", "message"}, {"role", "assistant"}, {"content", content}, {"model", j.s.opts.ModelID()},
		{"stop_reason", stop}, {"stop_sequence", nil}, {"usage", usage}}
}

// completeJSON closes a tool call's arguments cut by max_tokens, so the
// tool_use input stays an object.
func completeJSON(s string) string {
	if json.Valid([]byte(s)) {
		return s
	}
	return "{}"
}

func (j *job) responseStatus() string {
	if j.plan.finish == "length" && !j.s.llama() {
		return "incomplete"
	}
	return "completed"
}

func outputText(text string) obj {
	return obj{{"type", "output_text"}, {"annotations", []any{}}, {"logprobs", []any{}}, {"text", text}}
}

func (j *job) outputMessage(text string) obj {
	if j.s.llama() {
		return obj{{"type", "message"}, {"status", "completed"}, {"id", j.apiStream.itemID}, {"content", []any{outputText(text)}}, {"role", "assistant"}}
	}
	return obj{{"id", j.apiStream.itemID}, {"content", []any{outputText(text)}}, {"role", "assistant"}, {"status", "completed"}, {"type", "message"}}
}

// responseObject is the Responses API response object. llama-server sends a
// bare one while in progress and few fields at the end; vLLM the full
// object each time.
func (j *job) responseObject(status string, final bool) obj {
	if j.apiStream.itemID == "" {
		j.apiStream.itemID = "msg_" + j.s.newID(32, !j.s.llama())
	}
	text := j.content.String()
	usage := obj{{"input_tokens", j.promptTokens}, {"output_tokens", j.generated}, {"total_tokens", j.promptTokens + j.generated},
		{"input_tokens_details", obj{{"cached_tokens", j.cached}}}}
	if j.s.llama() {
		if !final {
			return obj{{"id", j.id}, {"object", "response"}, {"status", status}}
		}
		if !j.stream {
			out := obj{{"content", []any{outputText(text)}}, {"id", j.apiStream.itemID}, {"role", "assistant"}, {"status", "completed"}, {"type", "message"}}
			now := j.s.now().Unix()
			return obj{{"completed_at", now}, {"created_at", j.created}, {"id", j.id}, {"model", j.s.opts.ModelID()},
				{"object", "response"}, {"output", []any{out}}, {"status", status}, {"usage", usage}}
		}
		return obj{{"id", j.id}, {"object", "response"}, {"created_at", j.created}, {"status", status}, {"model", j.s.opts.ModelID()},
			{"output", []any{j.outputMessage(text)}}, {"usage", usage}}
	}
	output := []any{}
	var u, incomplete, maxOut any
	if j.maxTokens > 0 {
		maxOut = j.maxTokens
	}
	if final {
		output = []any{j.outputMessage(text)}
		u = obj{{"input_tokens", j.promptTokens}, {"input_tokens_details", obj{{"cached_tokens", j.cached}}},
			{"output_tokens", j.generated}, {"output_tokens_details", obj{{"reasoning_tokens", j.reasoningTokens()}}},
			{"total_tokens", j.promptTokens + j.generated}}
		if status == "incomplete" {
			incomplete = obj{{"reason", "max_output_tokens"}}
		}
	}
	return obj{{"id", j.id}, {"created_at", j.created}, {"incomplete_details", incomplete}, {"instructions", nil},
		{"metadata", nil}, {"model", j.s.opts.ModelID()}, {"object", "response"}, {"output", output},
		{"parallel_tool_calls", true}, {"temperature", 1.0}, {"tool_choice", "auto"}, {"tools", []any{}}, {"top_p", 1.0},
		{"background", false}, {"max_output_tokens", maxOut}, {"previous_response_id", nil}, {"reasoning", nil},
		{"service_tier", "auto"}, {"status", status}, {"text", nil}, {"truncation", "disabled"}, {"usage", u}, {"user", nil}}
}

func (j *job) reasoningTokens() int {
	n := 0
	for _, p := range j.plan.pieces[:j.generated] {
		if p.kind == pieceReasoning {
			n++
		}
	}
	return n
}

// atOutput places a Responses event at output item 0 (and content part 0):
// vLLM says where, llama-server does not.
func (j *job) atOutput(ev obj, part bool) obj {
	if j.s.llama() {
		return ev
	}
	ev = append(obj{{"output_index", 0}}, ev...)
	if part {
		ev = append(ev, field{"content_index", 0})
	}
	if ev[len(ev)-1].k == "content_index" && hasKey(ev, "delta") {
		ev = append(ev, field{"logprobs", []any{}})
	}
	return ev
}

func hasKey(o obj, k string) bool {
	for _, f := range o {
		if f.k == k {
			return true
		}
	}
	return false
}

// sendResponseEvent writes one Responses stream event: its type first, and
// vLLM's sequence number.
func (j *job) sendResponseEvent(typ string, ev obj) {
	head := obj{{"type", typ}}
	if !j.s.llama() {
		head = append(head, field{"sequence_number", j.apiStream.seq})
		j.apiStream.seq++
	}
	j.sendNamed(typ, append(head, ev...))
}

// sendNamed writes one SSE event with an event: line, as both Anthropic and
// Responses streams carry, and flushes it.
func (j *job) sendNamed(event string, payload obj) {
	if j.writeErr != nil {
		return
	}
	if _, err := fmt.Fprintf(j.w, "event: %s\ndata: %s\n\n", event, marshal(payload)); err != nil {
		j.writeErr = err
		return
	}
	j.flush()
}

// blockText flattens Anthropic or Responses content: a string, or a list of
// blocks whose text, tool input or nested content is taken in order.
func blockText(raw json.RawMessage) string {
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str
	}
	var blocks []struct {
		Text    string          `json:"text"`
		Input   json.RawMessage `json:"input"`
		Content json.RawMessage `json:"content"`
		Output  json.RawMessage `json:"output"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return ""
	}
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
		if len(bl.Input) > 0 {
			b.Write(bl.Input)
		}
		if len(bl.Content) > 0 {
			b.WriteString(blockText(bl.Content))
		}
		if len(bl.Output) > 0 {
			b.WriteString(blockText(bl.Output))
		}
	}
	return b.String()
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type messagesRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	System     json.RawMessage `json:"system"`
	MaxTokens  *int            `json:"max_tokens"`
	Stream     bool            `json:"stream"`
	Tools      []anthropicTool `json:"tools"`
	ToolChoice *struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tool_choice"`
	Thinking *struct {
		Type string `json:"type"`
	} `json:"thinking"`
}

// prompt is the request as the cache sees it (tools, system, then every
// message in order) and the last user message.
func (req *messagesRequest) prompt() (text, lastUser string, tools []toolSpec) {
	var b strings.Builder
	for _, t := range req.Tools {
		var spec toolSpec
		spec.Type = "function"
		spec.Function.Name = t.Name
		spec.Function.Parameters = t.InputSchema
		tools = append(tools, spec)
	}
	if len(tools) > 0 {
		b.Write(marshal(req.Tools))
	}
	b.WriteString(blockText(req.System))
	for _, m := range req.Messages {
		t := blockText(m.Content)
		b.WriteString(t)
		if m.Role == "user" {
			lastUser = t
		}
	}
	return b.String(), lastUser, tools
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if !s.readBody(w, r, &req) {
		return
	}
	if len(req.Messages) == 0 {
		s.badRequest(w, "messages must be a non-empty array")
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	if req.MaxTokens == nil && !s.llama() {
		// vLLM validates Anthropic's required field; llama-server defaults it.
		s.badRequest(w, "max_tokens: Field required")
		return
	}
	maxTok, ok := s.maxTokens(w, req.MaxTokens, nil)
	if !ok {
		return
	}
	text, lastUser, tools := req.prompt()
	nPrompt := promptTokens(text)
	if !s.checkContext(w, nPrompt, maxTok) {
		return
	}
	thinking := s.opts.ThinkingByDefault
	if req.Thinking != nil {
		thinking = req.Thinking.Type == "enabled"
	}
	choice := ""
	if req.ToolChoice != nil {
		switch req.ToolChoice.Type {
		case "any":
			choice = "required"
		case "tool":
			choice = req.ToolChoice.Name
		default:
			choice = req.ToolChoice.Type
		}
	}
	structured := s.opts.Jinja
	if !s.llama() {
		structured = s.opts.AutoToolChoice && s.opts.ToolCallParser != ""
	}
	pl := makeChatPlan(planInput{
		seed: s.opts.Seed, content: text, lastUser: lastUser, thinking: thinking, maxTokens: maxTok,
		tools: tools, toolChoice: choice, structured: structured,
		toolIDFmt: func(rng *rand.Rand) string { return "toolu_" + randomAlnum(rng, 24) },
	})
	place := s.placement()
	if place == thoughtsBoth {
		place = thoughtsField
	}
	j := &job{s: s, w: w, r: r, plan: pl, promptTokens: nPrompt, promptText: text, stream: req.Stream,
		chat: true, placement: place, api: apiMessages, maxTokens: maxTok}
	j.run()
}

// handleCountTokens is /v1/messages/count_tokens: the prompt's size.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if !s.readBody(w, r, &req) {
		return
	}
	if len(req.Messages) == 0 {
		s.badRequest(w, "messages must be a non-empty array")
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	text, _, _ := req.prompt()
	writeJSON(w, http.StatusOK, obj{{"input_tokens", promptTokens(text)}})
}

type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	if !s.readBody(w, r, &req) {
		return
	}
	var text, lastUser string
	var str string
	if json.Unmarshal(req.Input, &str) == nil {
		text, lastUser = str, str
	} else {
		var items []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Output  json.RawMessage `json:"output"`
		}
		if json.Unmarshal(req.Input, &items) != nil || len(items) == 0 {
			s.badRequest(w, "input must be a string or a non-empty array of input items")
			return
		}
		var b strings.Builder
		for _, it := range items {
			t := blockText(it.Content) + blockText(it.Output)
			b.WriteString(t)
			if it.Role == "user" {
				lastUser = t
			}
		}
		text = b.String()
	}
	text = req.Instructions + text
	if !s.checkModel(w, req.Model) {
		return
	}
	maxTok, ok := s.maxTokens(w, req.MaxOutputTokens, nil)
	if !ok {
		return
	}
	nPrompt := promptTokens(text)
	if !s.checkContext(w, nPrompt, maxTok) {
		return
	}
	pl := makeChatPlan(planInput{seed: s.opts.Seed, content: text, lastUser: lastUser, thinking: s.opts.ThinkingByDefault,
		maxTokens: maxTok, toolIDFmt: func(rng *rand.Rand) string { return randomAlnum(rng, 24) }})
	place := s.placement()
	if place == thoughtsBoth {
		place = thoughtsField
	}
	j := &job{s: s, w: w, r: r, plan: pl, promptTokens: nPrompt, promptText: text, stream: req.Stream,
		chat: true, placement: place, api: apiResponses, maxTokens: maxTok}
	j.run()
}
