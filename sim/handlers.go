package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"

	"fleet"
)

const maxBodyBytes = 32 << 20

func (s *Server) llama() bool { return s.opts.Mimic == fleet.EngineLlamaCpp }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("POST /v1/completions", s.handleCompletion)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /detokenize", s.handleDetokenize)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	if s.llama() {
		mux.HandleFunc("POST /chat/completions", s.handleChat)
		mux.HandleFunc("POST /completions", s.handleCompletion)
		mux.HandleFunc("POST /embeddings", s.handleEmbeddings)
		mux.HandleFunc("GET /models", s.handleModels)
		mux.HandleFunc("GET /v1/health", s.handleHealth)
		mux.HandleFunc("GET /props", s.handleProps)
		mux.HandleFunc("GET /slots", s.handleSlots)
	} else {
		mux.HandleFunc("GET /version", s.handleVersion)
	}
	mux.HandleFunc("/", s.handleNotFound)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// llama-server answers every endpoint with 503 until the model is in.
		if s.llama() && s.loading() {
			s.writeError(w, http.StatusServiceUnavailable, "unavailable_error", "Loading model", nil)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	w.Write(marshal(v))
}

// writeError answers in the mimicked engine's error shape. extra carries
// llama-server's additional fields (n_prompt_tokens, n_ctx).
func (s *Server) writeError(w http.ResponseWriter, status int, typ, msg string, extra obj) {
	if s.llama() {
		e := obj{{"code", status}, {"message", msg}, {"type", typ}}
		writeJSON(w, status, obj{{"error", append(e, extra...)}})
		return
	}
	writeJSON(w, status, obj{{"error", obj{{"message", msg}, {"type", typ}, {"param", nil}, {"code", status}}}})
}

func (s *Server) badRequest(w http.ResponseWriter, msg string) {
	typ := "BadRequestError"
	if s.llama() {
		typ = "invalid_request_error"
	}
	s.writeError(w, http.StatusBadRequest, typ, msg, nil)
}

func (s *Server) handleNotFound(w http.ResponseWriter, r *http.Request) {
	if s.llama() {
		s.writeError(w, http.StatusNotFound, "not_found_error", "File Not Found", nil)
		return
	}
	writeJSON(w, http.StatusNotFound, obj{{"detail", "Not Found"}})
}

// readBody decodes a JSON request body, answering 400 itself on failure.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, into any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", fmt.Sprintf("request body over %d bytes", maxBodyBytes), nil)
			return false
		}
		s.badRequest(w, "cannot read request body: "+err.Error())
		return false
	}
	if err := json.Unmarshal(body, into); err != nil {
		s.badRequest(w, "request body is not valid JSON: "+err.Error())
		return false
	}
	return true
}

// checkModel: vLLM refuses names it does not serve; llama-server serves any.
func (s *Server) checkModel(w http.ResponseWriter, name string) bool {
	if s.llama() || name == "" {
		return true
	}
	for _, n := range s.opts.ServedNames {
		if n == name {
			return true
		}
	}
	writeJSON(w, http.StatusNotFound, obj{{"error", obj{
		{"message", fmt.Sprintf("The model `%s` does not exist.", name)},
		{"type", "NotFoundError"}, {"param", "model"}, {"code", http.StatusNotFound}}}})
	return false
}

// checkMessages is the check every messages API starts with: a non-empty
// conversation for a model the engine serves.
func (s *Server) checkMessages(w http.ResponseWriter, n int, model string) bool {
	if n == 0 {
		s.badRequest(w, "messages must be a non-empty array")
		return false
	}
	return s.checkModel(w, model)
}

// structuredToolCalls reports whether tool calls come back parsed (a
// tool_calls field) rather than as text: llama-server with --jinja, vLLM with
// --enable-auto-tool-choice and a --tool-call-parser.
func (s *Server) structuredToolCalls() bool {
	if s.llama() {
		return s.opts.Jinja
	}
	return s.opts.AutoToolChoice && s.opts.ToolCallParser != ""
}

// maxTokens reads max_tokens / max_completion_tokens: 0 means unset.
func (s *Server) maxTokens(w http.ResponseWriter, maxTok, maxCompl *int) (int, bool) {
	v := maxCompl
	if v == nil {
		v = maxTok
	}
	if v == nil || (s.llama() && *v == -1) {
		return 0, true
	}
	if *v < 1 {
		s.badRequest(w, fmt.Sprintf("max_tokens must be at least 1, got %d", *v))
		return 0, false
	}
	return *v, true
}

// checkContext answers 400 in the engine's shape when prompt plus
// max_tokens would not fit the context one request may use. The sum is
// never formed in int: a max_tokens near 2^63 would wrap it negative and
// let the request through to plan an endless answer.
func (s *Server) checkContext(w http.ResponseWriter, prompt, maxTok int) bool {
	ctx := s.opts.Ctx
	if prompt < ctx && maxTok <= ctx-prompt {
		return true
	}
	// Both are at most 2^63-1, so their sum fits a uint64.
	asked := uint64(prompt) + uint64(maxTok)
	if s.llama() {
		s.writeError(w, http.StatusBadRequest, "exceed_context_size_error",
			fmt.Sprintf("request (%d tokens) exceeds the available context size (%d tokens), try increasing it", asked, ctx),
			obj{{"n_prompt_tokens", prompt}, {"n_ctx", ctx}})
		return false
	}
	s.writeError(w, http.StatusBadRequest, "BadRequestError",
		fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			ctx, asked, prompt, maxTok), nil)
	return false
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text flattens a message content: a string or a list of parts.
func (m chatMessage) text() string {
	var str string
	if json.Unmarshal(m.Content, &str) == nil {
		return str
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Tools               []toolSpec      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ChatTemplateKwargs  map[string]any  `json:"chat_template_kwargs"`
	N                   *int            `json:"n"`
}

func toolChoiceName(raw json.RawMessage) string {
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &named) == nil {
		return named.Function.Name
	}
	return ""
}

// reasoningPlacement is where a request's thoughts go.
type reasoningPlacement int

const (
	thoughtsInline reasoningPlacement = iota // <think>…</think> in content
	thoughtsField                            // a separate reasoning field
	thoughtsBoth                             // deepseek-legacy: inline and the field
)

func (s *Server) placement() reasoningPlacement {
	if s.llama() {
		switch s.opts.ReasoningFormat {
		case ReasoningNone:
			return thoughtsInline
		case ReasoningDeepSeekLegacy:
			return thoughtsBoth
		}
		return thoughtsField
	}
	if s.opts.ReasoningParser != "" {
		return thoughtsField
	}
	return thoughtsInline
}

// fieldPlacement is placement for the APIs whose thoughts have their own
// block (Anthropic's thinking, Responses' reasoning item): inline thoughts
// stay inline, the others go there once.
func (s *Server) fieldPlacement() reasoningPlacement {
	if p := s.placement(); p != thoughtsBoth {
		return p
	}
	return thoughtsField
}

func (s *Server) reasoningKey() string {
	if s.llama() {
		return "reasoning_content"
	}
	return "reasoning"
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !s.readBody(w, r, &req) {
		return
	}
	if !s.checkMessages(w, len(req.Messages), req.Model) {
		return
	}
	maxTok, ok := s.maxTokens(w, req.MaxTokens, req.MaxCompletionTokens)
	if !ok {
		return
	}
	n, ok := s.choiceCount(w, req.N)
	if !ok {
		return
	}
	var all strings.Builder
	lastUser := ""
	for _, m := range req.Messages {
		t := m.text()
		all.WriteString(t)
		if m.Role == "user" {
			lastUser = t
		}
	}
	toolsText := ""
	if len(req.Tools) > 0 {
		toolsText = string(marshal(req.Tools))
	}
	nPrompt := promptTokens(all.String() + toolsText)
	if !s.checkContext(w, nPrompt, maxTok) {
		return
	}
	thinking := s.opts.ThinkingByDefault
	if b, ok := req.ChatTemplateKwargs["enable_thinking"].(bool); ok {
		thinking = b
	}
	llama := s.llama()
	in := planInput{
		seed: s.opts.Seed, content: all.String() + toolsText, lastUser: lastUser, thinking: thinking,
		maxTokens: maxTok, tools: req.Tools, toolChoice: toolChoiceName(req.ToolChoice), structured: s.structuredToolCalls(),
		toolIDFmt: func(rng *rand.Rand) string {
			if llama {
				return randomAlnum(rng, 32)
			}
			return "chatcmpl-tool-" + randomHex(rng, 32)
		},
	}
	pl := makeChatPlan(in)
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if !llama && s.opts.ForceIncludeUsage {
		includeUsage = true
	}
	job := &job{
		s: s, w: w, r: r, plan: pl, promptTokens: nPrompt, promptText: toolsText + all.String(),
		stream: req.Stream, includeUsage: includeUsage, chat: true, placement: s.placement(),
	}
	job.addChoices(n, func(seed uint64) plan { in.seed = seed; return makeChatPlan(in) })
	job.run()
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int            `json:"max_tokens"`
	N             *int            `json:"n"`
}

// vllmMaxN is the most choices vLLM generates for one request: its
// VLLM_MAX_N_SEQUENCES, 16384 by default (vllm/sampling_params.py,
// _verify_num_sequences), which the sim does not read.
const vllmMaxN = 16384

// choiceCount reads n: vLLM generates that many choices, up to vllmMaxN,
// and refuses more in its words; llama-server refuses any n but 1, in its
// JSON schema check's words.
func (s *Server) choiceCount(w http.ResponseWriter, n *int) (int, bool) {
	if n == nil {
		return 1, true
	}
	if s.llama() && *n != 1 {
		s.badRequest(w, fmt.Sprintf("Field 'n': Value must be between 1 <= value <= 1, but got %d", *n))
		return 0, false
	}
	if *n < 1 {
		s.badRequest(w, fmt.Sprintf("n must be at least 1, got %d.", *n))
		return 0, false
	}
	if *n > vllmMaxN {
		s.badRequest(w, fmt.Sprintf("n must be at most %d, got %d. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.", vllmMaxN, *n))
		return 0, false
	}
	return *n, true
}

// addChoices gives j its n-1 other choices, each planned with its own seed.
func (j *job) addChoices(n int, planFor func(seed uint64) plan) {
	for k := 1; k < n; k++ {
		e := *j
		e.plan = planFor(j.s.opts.Seed + uint64(k))
		e.index = k
		j.extra = append(j.extra, &e)
	}
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !s.readBody(w, r, &req) {
		return
	}
	prompt, ok := promptText(req.Prompt)
	if !ok {
		s.badRequest(w, "prompt must be a string or an array of strings")
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	maxTok, ok := s.maxTokens(w, req.MaxTokens, nil)
	if !ok {
		return
	}
	n, ok := s.choiceCount(w, req.N)
	if !ok {
		return
	}
	if maxTok == 0 && !s.llama() {
		// vLLM's completions API defaults max_tokens to 16.
		maxTok = 16
	}
	nPrompt := promptTokens(prompt)
	if !s.checkContext(w, nPrompt, maxTok) {
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if !s.llama() && s.opts.ForceIncludeUsage {
		includeUsage = true
	}
	job := &job{
		s: s, w: w, r: r, plan: makeTextPlan(s.opts.Seed, prompt, maxTok), promptTokens: nPrompt,
		promptText: prompt, stream: req.Stream, includeUsage: includeUsage,
	}
	job.addChoices(n, func(seed uint64) plan { return makeTextPlan(seed, prompt, maxTok) })
	job.run()
}

// promptText reads a completion or embedding input: a string or strings.
func promptText(raw json.RawMessage) (string, bool) {
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str, true
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		return strings.Join(strs, "\n"), true
	}
	return "", false
}

const embeddingDims = 256

// embedding is a deterministic unit vector for text.
func embedding(seed uint64, text string) []float64 {
	rng := rand.New(rand.NewPCG(seedHash(seed, "embedding", text), seed))
	v := make([]float64, embeddingDims)
	var norm float64
	for i := range v {
		v[i] = rng.NormFloat64()
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] /= norm
	}
	return v
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if !s.readBody(w, r, &req) {
		return
	}
	var inputs []string
	var one string
	if json.Unmarshal(req.Input, &one) == nil {
		inputs = []string{one}
	} else if json.Unmarshal(req.Input, &inputs) != nil || len(inputs) == 0 {
		s.badRequest(w, "input must be a string or a non-empty array of strings")
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	total := 0
	data := make([]any, len(inputs))
	for i, in := range inputs {
		n := promptTokens(in)
		if n > s.opts.Ctx {
			s.checkContext(w, n, 0)
			return
		}
		total += n
		data[i] = obj{{"object", "embedding"}, {"embedding", embedding(s.opts.Seed, in)}, {"index", i}}
	}
	if err := sleepCtx(r.Context(), s.opts.Profile.PrefillDelay(total)); err != nil {
		return
	}
	s.metrics.prefilled(total, 0, 0, s.opts.Profile.PrefillDelay(total).Seconds(), 0)
	writeJSON(w, http.StatusOK, obj{
		{"object", "list"}, {"data", data}, {"model", s.opts.ModelID()},
		{"usage", obj{{"prompt_tokens", total}, {"total_tokens", total}}},
	})
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.llama() {
		writeJSON(w, http.StatusOK, obj{{"status", "ok"}})
		return
	}
	// vLLM answers 200 with an empty body.
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, obj{{"version", vllmVersion}})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	created := s.created.Unix()
	id := s.opts.ModelID()
	if !s.llama() {
		data := make([]any, 0, len(s.opts.ServedNames))
		for _, name := range s.opts.ServedNames {
			data = append(data, obj{
				{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "vllm"},
				{"root", s.opts.ModelPath}, {"parent", nil}, {"max_model_len", s.opts.Ctx},
				{"permission", []any{obj{
					{"id", "modelperm-" + s.newID(32, true)}, {"object", "model_permission"}, {"created", created},
					{"allow_create_engine", false}, {"allow_sampling", true}, {"allow_logprobs", true},
					{"allow_search_indices", false}, {"allow_view", true}, {"allow_fine_tuning", false},
					{"organization", "*"}, {"group", nil}, {"is_blocking", false},
				}}},
			})
		}
		writeJSON(w, http.StatusOK, obj{{"object", "list"}, {"data", data}})
		return
	}
	writeJSON(w, http.StatusOK, obj{
		{"models", []any{obj{
			{"name", id}, {"model", id}, {"modified_at", ""}, {"size", ""}, {"digest", ""}, {"type", "model"},
			{"description", ""}, {"tags", []string{""}}, {"capabilities", []string{"completion"}},
			{"parameters", ""}, {"details", obj{{"parent_model", ""}, {"format", "gguf"}, {"family", ""},
				{"families", []string{""}}, {"parameter_size", ""}, {"quantization_level", ""}}},
		}}},
		{"object", "list"},
		{"data", []any{obj{
			{"id", id}, {"aliases", s.opts.ServedNames}, {"tags", []string{}}, {"object", "model"},
			{"created", created}, {"owned_by", "llamacpp"},
			{"meta", obj{{"vocab_type", 2}, {"n_vocab", 151936}, {"n_ctx", s.opts.Ctx}, {"n_ctx_train", defaultTrainCtx},
				{"n_embd", 2560}, {"n_params", 4022468096}, {"size", 2497280256}, {"ftype", "Q4_K - Medium"}}},
		}}},
	})
}

func (s *Server) generationParams() obj {
	return obj{
		{"n_predict", -1}, {"seed", s.opts.Seed}, {"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95},
		{"min_p", 0.05}, {"stream", false}, {"reasoning_format", s.opts.ReasoningFormat},
		{"chat_format", "Hermes 2 Pro"}, {"samplers", []string{"penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"}},
	}
}

func (s *Server) handleProps(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, obj{
		{"default_generation_settings", obj{
			{"id", 0}, {"id_task", -1}, {"n_ctx", s.opts.Ctx}, {"speculative", false}, {"is_processing", false},
			{"params", s.generationParams()},
		}},
		{"total_slots", s.opts.Slots},
		{"model_alias", s.opts.ModelID()},
		{"model_path", s.opts.ModelPath},
		{"modalities", obj{{"vision", false}, {"audio", false}}},
		{"endpoint_slots", s.opts.SlotsEndpoint},
		{"endpoint_props", false},
		{"endpoint_metrics", s.opts.MetricsEnabled},
		{"chat_template", "{%- if tools %}…qwen3 chat template…{%- endif %}"},
		{"chat_template_caps", obj{{"supports_tools", true}, {"supports_tool_calls", true}, {"supports_parallel_tool_calls", true},
			{"supports_system_role", true}, {"supports_preserve_reasoning", true}}},
		{"bos_token", ""},
		{"eos_token", "<|im_end|>"},
		{"build_info", s.fingerprint()},
		{"is_sleeping", false},
	})
}

func (s *Server) handleSlots(w http.ResponseWriter, r *http.Request) {
	if !s.opts.SlotsEndpoint {
		s.writeError(w, http.StatusNotImplemented, "not_supported_error", "This server does not support slots endpoint. Start it with `--slots`", nil)
		return
	}
	snap := s.pool.snapshot()
	busy := 0
	out := make([]any, len(snap))
	for i, sl := range snap {
		if sl.busy {
			busy++
		}
		o := obj{{"id", i}, {"id_task", sl.taskID}, {"n_ctx", sl.nCtx}, {"speculative", false}, {"is_processing", sl.busy}}
		// A slot that has served a request shows its prompt cache use.
		if v := s.llamaCache.view(i); v.hadTask {
			o = append(o, field{"n_prompt_tokens", v.nTokens}, field{"n_prompt_tokens_processed", v.nProcessed},
				field{"n_prompt_tokens_cache", v.nCache})
		}
		out[i] = append(o, obj{
			{"params", s.generationParams()},
			// A list of one, as llama-server (b1-de3ff81) answers it.
			{"next_token", []any{obj{{"has_next_token", sl.busy}, {"has_new_line", false}, {"n_remain", sl.remain},
				{"n_decoded", sl.decoded}}}},
		}...)
	}
	if r.URL.Query().Get("fail_on_no_slot") == "1" && busy == len(snap) {
		s.writeError(w, http.StatusServiceUnavailable, "unavailable_error", "no slot available", nil)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if s.llama() && !s.opts.MetricsEnabled {
		s.writeError(w, http.StatusNotImplemented, "not_supported_error", "This server does not support metrics endpoint. Start it with `--metrics`", nil)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	st := s.pool.stats()
	var err error
	if s.llama() {
		err = s.metrics.writeLlama(w, st)
	} else {
		kv := s.opts.Profile.KVCacheTokens
		if kv < s.opts.Ctx {
			kv = s.opts.Ctx
		}
		err = s.metrics.writeVLLM(w, s.opts.ModelID(), st, kv)
	}
	if err != nil {
		s.log.Debug("metrics scrape ended early", "err", err)
	}
}
