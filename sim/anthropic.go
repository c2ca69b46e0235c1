package sim

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
)

// The Anthropic Messages API as each engine serves it. llama-server
// (tools/server/server-task.cpp) starts a block when its first token comes
// and closes every block at the end, a thinking block with an empty
// signature_delta first; vLLM (entrypoints/anthropic) closes a block when
// the next starts, and signs thinking with a random hex string.

func (j *job) messagesStart() {
	j.sendNamed("message_start", obj{{"type", "message_start"}, {"message", j.messageObject(true)}})
}

func (j *job) messagesPiece(kind, text string) {
	st := &j.apiStream
	if st.block != kind {
		if !j.s.llama() {
			j.closeBlocks()
		}
		st.block = kind
		var start obj
		switch kind {
		case "thinking":
			start = obj{{"type", "thinking"}, {"thinking", ""}}
		case "tool_use":
			start = obj{{"type", "tool_use"}, {"id", j.plan.tool.id}, {"name", j.plan.tool.name}}
			if !j.s.llama() {
				start = append(start, field{"input", obj{}})
			}
		default:
			start = obj{{"type", "text"}, {"text", ""}}
		}
		st.opened = append(st.opened, kind)
		j.sendNamed("content_block_start", obj{{"type", "content_block_start"}, {"index", len(st.opened) - 1}, {"content_block", start}})
	}
	var delta obj
	switch kind {
	case "thinking":
		delta = obj{{"type", "thinking_delta"}, {"thinking", text}}
	case "tool_use":
		delta = obj{{"type", "input_json_delta"}, {"partial_json", text}}
	default:
		delta = obj{{"type", "text_delta"}, {"text", text}}
	}
	j.sendNamed("content_block_delta", obj{{"type", "content_block_delta"}, {"index", len(st.opened) - 1}, {"delta", delta}})
}

// closeBlocks stops every block started and not yet stopped, in order.
func (j *job) closeBlocks() {
	st := &j.apiStream
	for ; st.closed < len(st.opened); st.closed++ {
		if st.opened[st.closed] == "thinking" {
			j.sendNamed("content_block_delta", obj{{"type", "content_block_delta"}, {"index", st.closed},
				{"delta", obj{{"type", "signature_delta"}, {"signature", j.signature()}}}})
		}
		j.sendNamed("content_block_stop", obj{{"type", "content_block_stop"}, {"index", st.closed}})
	}
	st.block = ""
}

// signature signs a thinking block: llama-server leaves it empty, vLLM
// makes up a uuid.
func (j *job) signature() string {
	if j.s.llama() {
		return ""
	}
	return j.s.newID(32, true)
}

func (j *job) messagesFinish() {
	if !j.stream {
		writeJSON(j.w, http.StatusOK, j.messageObject(false))
		return
	}
	j.closeBlocks()
	delta := obj{{"stop_reason", stopReason(j.plan.finish)}, {"stop_sequence", nil}}
	usage := obj{{"output_tokens", j.generated}}
	if !j.s.llama() {
		// vLLM leaves unset fields out and repeats the prompt's size.
		delta = delta[:1]
		usage = obj{{"input_tokens", j.promptTokens}, {"output_tokens", j.generated}}
	}
	j.sendNamed("message_delta", obj{{"type", "message_delta"}, {"delta", delta}, {"usage", usage}})
	j.sendNamed("message_stop", obj{{"type", "message_stop"}})
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
			content = append(content, obj{{"type", "thinking"}, {"thinking", j.reasoning.String()}, {"signature", j.signature()}})
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
	if !s.checkMessages(w, len(req.Messages), req.Model) {
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
	pl := makeChatPlan(planInput{
		seed: s.opts.Seed, content: text, lastUser: lastUser, thinking: thinking, maxTokens: maxTok,
		tools: tools, toolChoice: choice, structured: s.structuredToolCalls(),
		toolIDFmt: func(rng *rand.Rand) string { return "toolu_" + randomAlnum(rng, 24) },
	})
	j := &job{s: s, w: w, r: r, plan: pl, promptTokens: nPrompt, promptText: text, stream: req.Stream,
		chat: true, placement: s.fieldPlacement(), api: apiMessages, maxTokens: maxTok}
	j.run()
}

// handleCountTokens is /v1/messages/count_tokens: the prompt's size.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if !s.readBody(w, r, &req) {
		return
	}
	if !s.checkMessages(w, len(req.Messages), req.Model) {
		return
	}
	text, _, _ := req.prompt()
	writeJSON(w, http.StatusOK, obj{{"input_tokens", promptTokens(text)}})
}
