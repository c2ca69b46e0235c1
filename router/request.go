package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// requestInfo is what the router needs from a request body to route it; the
// body itself is forwarded byte for byte.
type requestInfo struct {
	Model  string
	Stream bool
	// MaxTokens is max_tokens or max_completion_tokens, 0 when absent.
	MaxTokens int
	// PromptTokens is an estimate (bytes/4 of the prompt fields): good enough
	// to keep long prompts off small contexts without running a tokenizer.
	PromptTokens int
	// Prefix is the chunk hash chain of the prompt as sent (tools, then
	// messages or prompt, raw JSON): a conversation that grows by
	// appending messages keeps its chain's head.
	Prefix []uint64
}

// requestError is a client mistake in the body, with the OpenAI code and
// param to report it under.
type requestError struct {
	code  string
	param string
	msg   string
}

func (e *requestError) Error() string { return e.msg }

// bytesPerToken is the usual English-text ratio for BPE tokenizers; it errs
// on the side of overestimating JSON-heavy prompts, which is the safe side.
const bytesPerToken = 4

type wireRequest struct {
	Model               json.RawMessage `json:"model"`
	Stream              *bool           `json:"stream"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`
	Tools               json.RawMessage `json:"tools"`
}

// parseRequest reads the routing facts out of an OpenAI request body.
func parseRequest(body []byte) (requestInfo, error) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return requestInfo{}, &requestError{code: codeInvalidJSON, param: typeErr.Field,
				msg: fmt.Sprintf("field %q has the wrong type (%s where %s was expected); fix the request body", typeErr.Field, typeErr.Value, typeErr.Type)}
		}
		return requestInfo{}, &requestError{code: codeInvalidJSON,
			msg: fmt.Sprintf("request body is not a valid JSON object: %v; send a JSON object such as {\"model\":\"…\",\"messages\":[…]}", err)}
	}
	var info requestInfo
	model := bytes.TrimSpace(w.Model)
	if len(model) == 0 || bytes.Equal(model, []byte("null")) {
		return requestInfo{}, &requestError{code: codeMissingModel, param: "model",
			msg: "the request has no \"model\" field; name the model to use (GET /v1/models lists them)"}
	}
	if err := json.Unmarshal(model, &info.Model); err != nil {
		return requestInfo{}, &requestError{code: codeInvalidJSON, param: "model",
			msg: "field \"model\" must be a string naming a model (GET /v1/models lists them)"}
	}
	if info.Model == "" {
		return requestInfo{}, &requestError{code: codeMissingModel, param: "model",
			msg: "field \"model\" is empty; name the model to use (GET /v1/models lists them)"}
	}
	if w.Stream != nil {
		info.Stream = *w.Stream
	}
	switch {
	case w.MaxTokens != nil:
		info.MaxTokens = *w.MaxTokens
	case w.MaxCompletionTokens != nil:
		info.MaxTokens = *w.MaxCompletionTokens
	}
	if info.MaxTokens < 0 {
		return requestInfo{}, &requestError{code: "invalid_value", param: "max_tokens",
			msg: fmt.Sprintf("max_tokens is %d; it must be zero or positive", info.MaxTokens)}
	}
	info.PromptTokens = (len(w.Messages) + len(w.Prompt) + len(w.Input) + bytesPerToken - 1) / bytesPerToken
	if len(w.Messages) > 0 || len(w.Prompt) > 0 {
		info.Prefix = PrefixChain(w.Tools, w.Messages, w.Prompt)
	}
	return info, nil
}
