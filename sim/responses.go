package sim

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
)

// The OpenAI Responses API as each engine serves it. llama-server
// (tools/server/server-task.cpp) sends response.created and in_progress with
// the first token, adds each output item (reasoning, message, function call)
// when its first token comes, and at the end sends each item's done events
// and response.completed with the usage (and its timings); vLLM sends the
// same events with sequence numbers, output and content indexes, and the
// full response object.

func (j *job) responsesStart() {
	st := &j.apiStream
	hex := !j.s.llama()
	st.msgID = "msg_" + j.s.newID(32, hex)
	st.reasoningID = "rs_" + j.s.newID(32, hex)
	j.sendResponseEvent("response.created", obj{{"response", j.responseObject("in_progress", false)}})
	j.sendResponseEvent("response.in_progress", obj{{"response", j.responseObject("in_progress", false)}})
}

// outputIndex is the place of an output item, added when first asked for.
func (j *job) outputIndex(kind string) (int, bool) {
	st := &j.apiStream
	for i, k := range st.items {
		if k == kind {
			return i, false
		}
	}
	st.items = append(st.items, kind)
	return len(st.items) - 1, true
}

func (j *job) responsesPiece(kind, text string) {
	st := &j.apiStream
	at, added := j.outputIndex(kind)
	switch kind {
	case "thinking":
		if added {
			j.sendResponseEvent("response.output_item.added", j.atOutput(obj{{"item", obj{{"id", st.reasoningID}, {"summary", []any{}},
				{"type", "reasoning"}, {"content", []any{}}, {"encrypted_content", ""}, {"status", "in_progress"}}}}, at, false))
		}
		st.reasoning.WriteString(text)
		j.sendResponseEvent("response.reasoning_text.delta", j.atOutput(obj{{"delta", text}, {"item_id", st.reasoningID}}, at, true))
	case "tool_use":
		if added {
			j.sendResponseEvent("response.output_item.added", j.atOutput(obj{{"item", j.functionCall("in_progress")}}, at, false))
		}
		st.args.WriteString(text)
		j.sendResponseEvent("response.function_call_arguments.delta", j.atOutput(obj{{"delta", text}, {"item_id", "fc_" + j.plan.tool.id}}, at, false))
	default:
		if added {
			j.sendResponseEvent("response.output_item.added", j.atOutput(obj{{"item", obj{{"content", []any{}}, {"id", st.msgID},
				{"role", "assistant"}, {"status", "in_progress"}, {"type", "message"}}}}, at, false))
			j.sendResponseEvent("response.content_part.added", j.atOutput(obj{{"item_id", st.msgID},
				{"part", obj{{"type", "output_text"}, {"text", ""}}}}, at, true))
		}
		st.text.WriteString(text)
		j.sendResponseEvent("response.output_text.delta", j.atOutput(obj{{"item_id", st.msgID}, {"delta", text}}, at, true))
	}
}

func (j *job) functionCall(status string) obj {
	args := ""
	if status == "completed" {
		args = j.apiStream.args.String()
	}
	return obj{{"id", "fc_" + j.plan.tool.id}, {"type", "function_call"}, {"status", status}, {"arguments", args},
		{"call_id", "call_" + j.plan.tool.id}, {"name", j.plan.tool.name}}
}

func outputText(text string) obj {
	return obj{{"type", "output_text"}, {"annotations", []any{}}, {"logprobs", []any{}}, {"text", text}}
}

// outputItems are the answer's output items, in the order they started.
func (j *job) outputItems() []any {
	st := &j.apiStream
	out := []any{}
	for _, kind := range st.items {
		switch kind {
		case "thinking":
			out = append(out, obj{{"id", st.reasoningID}, {"summary", []any{}}, {"type", "reasoning"},
				{"content", []any{obj{{"text", st.reasoning.String()}, {"type", "reasoning_text"}}}}, {"encrypted_content", ""}, {"status", "completed"}})
		case "tool_use":
			out = append(out, j.functionCall("completed"))
		default:
			out = append(out, obj{{"type", "message"}, {"status", "completed"}, {"id", st.msgID},
				{"content", []any{outputText(st.text.String())}}, {"role", "assistant"}})
		}
	}
	return out
}

func (j *job) responsesFinish() {
	st := &j.apiStream
	if !j.stream {
		// A non-streamed answer is made of the same items, in order.
		st.msgID = "msg_" + j.s.newID(32, !j.s.llama())
		st.reasoningID = "rs_" + j.s.newID(32, !j.s.llama())
		for _, p := range j.plan.pieces[:j.generated] {
			if kind := j.blockKind(p); kind != "" {
				j.outputIndex(kind)
				switch kind {
				case "thinking":
					st.reasoning.WriteString(p.text)
				case "tool_use":
					st.args.WriteString(p.text)
				default:
					st.text.WriteString(p.text)
				}
			}
		}
		writeJSON(j.w, http.StatusOK, j.responseObject(j.responseStatus(), true))
		return
	}
	items := j.outputItems()
	for i, kind := range st.items {
		if kind == "text" {
			text := st.text.String()
			j.sendResponseEvent("response.output_text.done", j.atOutput(obj{{"item_id", st.msgID}, {"text", text}}, i, true))
			j.sendResponseEvent("response.content_part.done", j.atOutput(obj{{"item_id", st.msgID}, {"part", outputText(text)}}, i, true))
		}
		j.sendResponseEvent("response.output_item.done", j.atOutput(obj{{"item", items[i]}}, i, false))
	}
	ev := obj{{"response", j.responseObject(j.responseStatus(), true)}}
	if j.s.llama() {
		ev = append(ev, field{"timings", j.timings()})
	}
	j.sendResponseEvent("response."+j.responseStatus(), ev)
}

func (j *job) responseStatus() string {
	if j.plan.finish == "length" && !j.s.llama() {
		return "incomplete"
	}
	return "completed"
}

// responseObject is the Responses API response object. llama-server sends a
// bare one while in progress and few fields at the end; vLLM the full
// object each time.
func (j *job) responseObject(status string, final bool) obj {
	usage := obj{{"input_tokens", j.promptTokens}, {"output_tokens", j.generated}, {"total_tokens", j.promptTokens + j.generated},
		{"input_tokens_details", obj{{"cached_tokens", j.cached}}}}
	if j.s.llama() {
		if !final {
			return obj{{"id", j.id}, {"object", "response"}, {"status", status}}
		}
		if !j.stream {
			return obj{{"completed_at", j.s.now().Unix()}, {"created_at", j.created}, {"id", j.id}, {"model", j.s.opts.ModelID()},
				{"object", "response"}, {"output", j.outputItems()}, {"status", status}, {"usage", usage}}
		}
		return obj{{"id", j.id}, {"object", "response"}, {"created_at", j.created}, {"status", status}, {"model", j.s.opts.ModelID()},
			{"output", j.outputItems()}, {"usage", usage}}
	}
	output := []any{}
	var u, incomplete, maxOut any
	if j.maxTokens > 0 {
		maxOut = j.maxTokens
	}
	if final {
		output = j.outputItems()
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

// atOutput places a Responses event at output item at (and its content
// part 0): vLLM says where, llama-server does not.
func (j *job) atOutput(ev obj, at int, part bool) obj {
	if j.s.llama() {
		return ev
	}
	ev = append(obj{{"output_index", at}}, ev...)
	if part {
		ev = append(ev, field{"content_index", 0})
	}
	return ev
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

// responsesTool is a function tool as the Responses API declares it.
type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
	Tools           []responsesTool `json:"tools"`
	ToolChoice      json.RawMessage `json:"tool_choice"`
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
			Role      string          `json:"role"`
			Content   json.RawMessage `json:"content"`
			Output    json.RawMessage `json:"output"`
			Arguments string          `json:"arguments"`
		}
		if json.Unmarshal(req.Input, &items) != nil || len(items) == 0 {
			s.badRequest(w, "input must be a string or a non-empty array of input items")
			return
		}
		var b strings.Builder
		for _, it := range items {
			t := blockText(it.Content) + blockText(it.Output) + it.Arguments
			b.WriteString(t)
			if it.Role == "user" {
				lastUser = t
			}
		}
		text = b.String()
	}
	var tools []toolSpec
	for _, t := range req.Tools {
		if t.Type != "function" {
			continue
		}
		var spec toolSpec
		spec.Type = "function"
		spec.Function.Name = t.Name
		spec.Function.Parameters = t.Parameters
		tools = append(tools, spec)
	}
	toolsText := ""
	if len(tools) > 0 {
		toolsText = string(marshal(req.Tools))
	}
	text = toolsText + req.Instructions + text
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
	// tool_choice: "auto", "required", "none" or {"type":"function","name":…}.
	choice := toolChoiceName(req.ToolChoice)
	var named struct {
		Name string `json:"name"`
	}
	if choice == "" && json.Unmarshal(req.ToolChoice, &named) == nil {
		choice = named.Name
	}
	pl := makeChatPlan(planInput{seed: s.opts.Seed, content: text, lastUser: lastUser, thinking: s.opts.ThinkingByDefault,
		maxTokens: maxTok, tools: tools, toolChoice: choice, structured: s.structuredToolCalls(),
		toolIDFmt: func(rng *rand.Rand) string { return randomAlnum(rng, 32) }})
	j := &job{s: s, w: w, r: r, plan: pl, promptTokens: nPrompt, promptText: text, stream: req.Stream,
		chat: true, placement: s.fieldPlacement(), api: apiResponses, maxTokens: maxTok}
	j.run()
}
