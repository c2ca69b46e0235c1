package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"fleet"
)

// Every endpoint the engines serve is routed by the "model" of its JSON
// body, to a worker whose engine serves it. Which engine serves which path
// is known per engine kind (the table below, from each engine's own route
// list); an engine the table does not know for a path is tried, and a
// worker that answers a path with 404 (or llama-server's 501 for a feature
// it was not started with) is remembered as not serving it, until its
// engine restarts, and the request goes to another worker.

// wireAPI is the API family of an endpoint: the shape its errors take.
type wireAPI int

const (
	apiOpenAI wireAPI = iota
	apiAnthropic
	// apiResponses is OpenAI's Responses API: OpenAI's errors, but its
	// streams' own error event.
	apiResponses
)

// support is whether an engine kind serves an endpoint.
type support int8

const (
	supportUnknown support = iota // tried; a 404 teaches otherwise
	supportYes
	supportNo
)

// endpointSpec is one routed path.
type endpointSpec struct {
	api     wireAPI
	engines map[fleet.EngineKind]support
	// countsTokens marks the endpoints that count tokens and make none: a
	// key's request, not its tokens (keylimits.go, usage.go).
	countsTokens bool
	// noCompletion marks the endpoints that answer without generating
	// (embeddings, scores): a request reserves its prompt of its key's
	// day, and no answer (keylimits.go).
	noCompletion bool
}

func engines(vllm, llama, ollama support) map[fleet.EngineKind]support {
	return map[fleet.EngineKind]support{
		fleet.EngineVLLM: vllm, fleet.EngineVLLMMetal: vllm, fleet.EngineLlamaCpp: llama, fleet.EngineOllama: ollama,
	}
}

// endpointTable is which engine kind serves which path: vLLM's and
// llama-server's own route lists (vllm/entrypoints, llama.cpp
// tools/server), Ollama's OpenAI compatibility page. Multipart endpoints
// (audio transcriptions) carry no JSON model and are not routed.
var endpointTable = map[string]endpointSpec{
	"/v1/chat/completions":      {engines: engines(supportYes, supportYes, supportYes)},
	"/v1/completions":           {engines: engines(supportYes, supportYes, supportYes)},
	"/v1/embeddings":            {engines: engines(supportYes, supportYes, supportYes), noCompletion: true},
	"/v1/messages":              {api: apiAnthropic, engines: engines(supportYes, supportYes, supportUnknown)},
	"/v1/messages/count_tokens": {api: apiAnthropic, engines: engines(supportYes, supportYes, supportUnknown), countsTokens: true},
	"/v1/responses":             {api: apiResponses, engines: engines(supportYes, supportYes, supportYes)},
	"/v1/rerank":                {engines: engines(supportYes, supportYes, supportNo), noCompletion: true},
	"/v1/score":                 {engines: engines(supportYes, supportNo, supportNo), noCompletion: true},
	"/tokenize":                 {engines: engines(supportYes, supportYes, supportNo), countsTokens: true},
	"/detokenize":               {engines: engines(supportYes, supportYes, supportNo), countsTokens: true},
	"/pooling":                  {engines: engines(supportYes, supportNo, supportNo), noCompletion: true},
	"/classify":                 {engines: engines(supportYes, supportNo, supportNo), noCompletion: true},
	"/infill":                   {engines: engines(supportNo, supportYes, supportNo)},
	"/apply-template":           {engines: engines(supportNo, supportYes, supportNo), noCompletion: true},
}

// multiChoice is which engine kinds honour n > 1 on chat and text
// completions: vLLM does; llama-server answers 400 ("Field 'n': Value must
// be between 1 <= value <= 1"). Others are passed the request as it is.
var multiChoice = map[fleet.EngineKind]support{
	fleet.EngineVLLM: supportYes, fleet.EngineVLLMMetal: supportYes, fleet.EngineLlamaCpp: supportNo,
}

// routedPaths lists the routed paths in order, for the router's mux and its
// 404 message.
func routedPaths() []string {
	paths := make([]string, 0, len(endpointTable))
	for p := range endpointTable {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths
}

func apiOf(path string) wireAPI { return endpointTable[path].api }

// servesLocked says whether b may be sent path (n choices): not when its kind is
// known not to, nor when it answered the path with "not found" before.
func (b *backend) servesLocked(path string, n int) bool {
	if b.notServed[path] {
		return false
	}
	if endpointTable[path].engines[b.cfg.Engine] == supportNo {
		return false
	}
	return n <= 1 || multiChoice[b.cfg.Engine] != supportNo
}

// endpointExclusions lists the ready workers of model that must not be
// sent path with n choices. When there are ready workers and none may take
// it, it says why instead, with the answer's status.
func (p *pool) endpointExclusions(model, path string, n int) ([]string, *schedError) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var excluded, kinds []string
	ready, nOnly := 0, 0
	for _, b := range p.byModel[model] {
		ready++
		if b.servesLocked(path, n) {
			continue
		}
		if b.servesLocked(path, 1) {
			nOnly++
		}
		excluded = append(excluded, b.cfg.Name)
		kinds = append(kinds, fmt.Sprintf("%s (%s)", b.cfg.Name, engineName(b.cfg.Engine)))
	}
	if ready == 0 || len(excluded) < ready {
		return excluded, nil
	}
	if nOnly > 0 {
		return nil, &schedError{status: http.StatusBadRequest, typ: errTypeInvalidRequest, code: "unsupported_value",
			msg: fmt.Sprintf("n = %d: no ready worker of %q returns more than one choice (%s; vLLM does, llama-server does not); send n = 1, or several requests",
				n, model, strings.Join(kinds, ", "))}
	}
	return nil, &schedError{status: http.StatusNotFound, typ: errTypeInvalidRequest, code: "endpoint_not_served",
		msg: fmt.Sprintf("no ready worker of %q serves %s: %s; use a model whose engine serves it (docs/endpoints.md lists which engine serves which endpoint)",
			model, path, strings.Join(kinds, ", "))}
}

func engineName(k fleet.EngineKind) string {
	switch k {
	case fleet.EngineLlamaCpp:
		return "llama-server"
	case "":
		return "engine unknown"
	}
	return string(k)
}

// notServedAnswer reports whether an engine's answer to a request says it
// does not serve the path at all (as opposed to refusing this request):
// 404 from FastAPI ({"detail":"Not Found"}) or llama-server ("File Not
// Found"), or llama-server's 501 for a feature it was not started with
// (reranking, embeddings). A 404 about the model is not one.
func notServedAnswer(status int, body []byte) bool {
	switch status {
	case http.StatusNotImplemented:
		return true
	case http.StatusNotFound:
		return !bytes.Contains(body, []byte(`"model"`)) && !bytes.Contains(body, []byte("model `")) &&
			!bytes.Contains(body, []byte("does not exist"))
	}
	return false
}

// MaxChoices bounds n, the choices one request asks for: OpenAI's own API
// takes n from 1 to 128. An engine takes far more (vLLM up to its
// VLLM_MAX_N_SEQUENCES, 16384 by default) and holds every choice's text
// until the request ends: one request with n = 2^63-1 took a simulated vLLM
// from 27 MB to 4 GB in 15 s.
const MaxChoices = 128

// MaxChoiceTokens bounds n × max_tokens for n > 1, the tokens one request
// may ask to generate over all its choices (n = 1,000,000 with max_tokens 8
// once served 8 M tokens): 128 choices of 8192 tokens, 8 of 131072. One
// choice is bounded by its model's context, which the engine holds.
const MaxChoiceTokens = 1 << 20

// choiceCount is the choices a request for path asks for: n (parseRequest)
// on chat and text completions, 1 when absent or elsewhere, bounded by
// MaxChoices and, with maxTokens (0: absent), MaxChoiceTokens.
func choiceCount(path string, n *int, maxTokens int) (int, error) {
	if path != "/v1/chat/completions" && path != "/v1/completions" || n == nil {
		return 1, nil
	}
	switch {
	case *n < 1:
		return 0, &requestError{code: "invalid_value", param: "n", msg: fmt.Sprintf("n is %d; it must be at least 1", *n)}
	case *n > MaxChoices:
		return 0, &requestError{code: "invalid_value", param: "n", msg: fmt.Sprintf("n is %d; this router takes at most %d choices a request (as OpenAI's API does): send fewer, or several requests", *n, MaxChoices)}
	case *n > 1 && maxTokens > MaxChoiceTokens / *n:
		return 0, &requestError{code: "invalid_value", param: "n",
			msg: fmt.Sprintf("n %d × max_tokens %d asks for more than %d tokens, this router's bound on one request's choices together; lower n or max_tokens", *n, maxTokens, MaxChoiceTokens)}
	}
	return *n, nil
}

// apiWriter marks a response as belonging to an API whose errors have their
// own shape, so that writeError, wherever it is called, answers in it.
type apiWriter struct {
	http.ResponseWriter
	api wireAPI
}

func (a *apiWriter) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// FlushError is Flush with the write's error, for http.ResponseController
// (a client that stopped reading).
func (a *apiWriter) FlushError() error { return http.NewResponseController(a.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the connection (read deadlines).
func (a *apiWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func writerAPI(w http.ResponseWriter) wireAPI {
	if a, ok := w.(*apiWriter); ok {
		return a.api
	}
	return apiOpenAI
}

// anthropicErrorType is Anthropic's error type for an HTTP status.
func anthropicErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable || status == 529:
		return "overloaded_error"
	case status == http.StatusGatewayTimeout || status == http.StatusRequestTimeout:
		return "timeout_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// anthropicErrorBody is Anthropic's error envelope:
// {"type":"error","error":{"type":"not_found_error","message":"…"}}.
func anthropicErrorBody(status int, msg string) []byte {
	type inner struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error inner  `json:"error"`
	}{"error", inner{anthropicErrorType(status), msg}})
	return b
}

// answerModelField finds the model name an answer carries: its top-level
// "model", else that of the object an Anthropic message_start event
// ("message") or a Responses event ("response") wraps.
func answerModelField(p []byte) (start, end int, ok bool) {
	if start, end, ok = modelField(p); ok {
		return start, end, true
	}
	for _, key := range []string{"message", "response"} {
		vs, ve, found := topLevelValue(p, key)
		if !found || p[vs] != '{' {
			continue
		}
		if s, e, ok := modelField(p[vs:ve]); ok {
			return vs + s, vs + e, true
		}
	}
	return 0, 0, false
}

// withAnswerModel is withModel for an answer: the name it carries, where
// answerModelField finds it, set to quoted.
func withAnswerModel(p, quoted []byte) []byte { return withField(p, quoted, answerModelField) }

// sseErrorEventFor is sseErrorEvent in the API's own shape: an Anthropic
// stream gets Anthropic's error event, a Responses stream the Responses
// API's (type "error", numbered after the stream's last event, seq).
func sseErrorEventFor(w http.ResponseWriter, seq int, msg string) []byte {
	var b []byte
	switch writerAPI(w) {
	case apiAnthropic:
		b = anthropicErrorBody(http.StatusBadGateway, msg)
	case apiResponses:
		b, _ = json.Marshal(responsesErrorEvent{Type: "error", Code: codeUpstreamFailed, Message: msg, SequenceNumber: seq + 1})
	default:
		return sseErrorEvent(msg)
	}
	out := make([]byte, 0, len(b)+32)
	out = append(out, "event: error\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// responsesErrorEvent is the Responses API's stream error event
// (ResponseErrorEvent in OpenAI's SDKs); param is always null here.
type responsesErrorEvent struct {
	Type           string  `json:"type"`
	Code           string  `json:"code"`
	Message        string  `json:"message"`
	Param          *string `json:"param"`
	SequenceNumber int     `json:"sequence_number"`
}

var (
	outputTokensField   = []byte(`"output_tokens":`)
	inputTokensField    = []byte(`"input_tokens":`)
	cacheReadInputField = []byte(`"cache_read_input_tokens":`)
)

// apiUsageTokens reads the output tokens of an Anthropic or Responses usage
// ("output_tokens"), or -1.
func apiUsageTokens(p []byte) int { return intField(p, outputTokensField) }

// scanAPIUsage reads the prompt's size and cached part from an Anthropic
// usage (input_tokens apart from cache_read_input_tokens, as llama-server
// and Anthropic count them) or a Responses usage (input_tokens including
// input_tokens_details.cached_tokens).
func (c *promptCache) scanAPIUsage(p []byte) {
	in := intField(p, inputTokensField)
	if read := intField(p, cacheReadInputField); read >= 0 {
		c.cached = read
		if in >= 0 {
			c.promptTokens = in + read
		}
		return
	}
	if in >= 0 {
		c.promptTokens = in
	}
	if n := intField(p, cachedTokensField); n >= 0 {
		c.cached = n
	}
}
