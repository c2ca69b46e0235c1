package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"time"
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
	// N is the choices asked for (n), nil when absent or not an integer
	// (the engine judges that): choiceCount.
	N *int
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
	Model               bodyPart `json:"model"`
	Stream              *bool    `json:"stream"`
	MaxTokens           *int     `json:"max_tokens"`
	MaxCompletionTokens *int     `json:"max_completion_tokens"`
	Messages            bodyPart `json:"messages"`
	Prompt              bodyPart `json:"prompt"`
	Input               bodyPart `json:"input"`
	Tools               bodyPart `json:"tools"`
	// Anthropic's system prompt and the Responses API's instructions and
	// output limit.
	System          bodyPart `json:"system"`
	Instructions    bodyPart `json:"instructions"`
	MaxOutputTokens *int     `json:"max_output_tokens"`
	N               bodyPart `json:"n"`
}

// bodyPart is a field's raw JSON as a slice of the request body itself.
// json.RawMessage would copy it: a prompt of 15 MiB cost 15 MiB more while
// it was parsed, memory the bodies-in-flight bound does not count (a
// hostile client's bodies held at the bound, completed at once, took the
// hub past 400 MB). parseRequest reads the parts while the body is there
// and keeps none of them.
type bodyPart []byte

// UnmarshalJSON keeps data, which encoding/json slices out of the body.
func (p *bodyPart) UnmarshalJSON(data []byte) error {
	*p = data
	return nil
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
	case w.MaxOutputTokens != nil:
		info.MaxTokens = *w.MaxOutputTokens
	}
	if info.MaxTokens < 0 {
		return requestInfo{}, &requestError{code: "invalid_value", param: "max_tokens",
			msg: fmt.Sprintf("max_tokens is %d; it must be zero or positive", info.MaxTokens)}
	}
	if len(w.N) > 0 {
		// Read apart, so that an n of another type is the engine's to
		// refuse rather than a malformed body, as the router never
		// judged it.
		var n *int
		var f float64
		switch {
		case json.Unmarshal(w.N, &n) == nil:
			info.N = n
		case json.Unmarshal(w.N, &f) == nil && f == math.Trunc(f) && f > math.MaxInt:
			// A whole number past int (1e30) is a bound's to refuse, not
			// an engine's to read.
			most := math.MaxInt
			info.N = &most
		}
	}
	info.PromptTokens = (len(w.System) + len(w.Instructions) + len(w.Messages) + len(w.Prompt) + len(w.Input) + bytesPerToken - 1) / bytesPerToken
	if len(w.Messages) > 0 || len(w.Prompt) > 0 {
		// An Anthropic system prompt comes before the messages, as it
		// does in the prompt the engine renders.
		info.Prefix = PrefixChain(w.Tools, w.System, w.Messages, w.Prompt)
	} else if len(w.Input) > 0 && len(w.Instructions)+len(w.Tools) > 0 {
		// A Responses request: instructions, then the input items.
		info.Prefix = PrefixChain(w.Tools, w.Instructions, w.Input)
	}
	return info, nil
}

// needContext is the context a request needs, prompt + max_tokens, held at
// the largest int rather than wrapped: a max_tokens near 2^63 would wrap
// the sum negative, fit every worker and reach an engine that plans an
// endless answer. Both are zero or positive (parseRequest).
func needContext(prompt, maxTokens int) int {
	if maxTokens > math.MaxInt-prompt {
		return math.MaxInt
	}
	return prompt + maxTokens
}

// DefaultBodyTimeout gives a 16 MiB body (the default limit) 0.8 MB/s, far
// below any real link, while a client trickling a byte at a time is cut off.
const DefaultBodyTimeout = 20 * time.Second

// DefaultWriteTimeout is how long a write to a client may block before the
// client is taken for one that stopped reading: far beyond any pause of a
// client that reads (its buffers fill only when it reads nothing).
const DefaultWriteTimeout = 30 * time.Second

// errBodyTimeout is a request body that did not arrive within BodyTimeout.
var errBodyTimeout = errors.New("request body read deadline exceeded")

// readBody reads the request body within the size limit and the body
// deadline. The deadline is lifted once the body is in: the connection's
// later reads only watch for the client going away while the answer
// streams, which may take minutes.
//
// The body is taken from the bodies-in-flight budget (bodymem.go) through
// hold: at once when its length is known, before a byte is read, else as
// it arrives. A refusal is a *bodyRefusal.
func (r *Router) readBody(w http.ResponseWriter, req *http.Request, hold *bodyHold) ([]byte, error) {
	rc := http.NewResponseController(w)
	// Recorders and HTTP/2 streams may not support deadlines; the server's
	// own limits are all they get.
	deadline := rc.SetReadDeadline(time.Now().Add(r.opts.BodyTimeout)) == nil
	body, err := readLimited(w, req, r.opts.MaxBodyBytes, hold)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// Hang up after the 408: left open, the server would wait for the
		// rest of the trickle to reuse the connection.
		w.Header().Set("Connection", "close")
		return nil, fmt.Errorf("%w: %w", errBodyTimeout, err)
	}
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	return body, err
}

func readLimited(w http.ResponseWriter, req *http.Request, limit int64, hold *bodyHold) ([]byte, error) {
	if req.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	rd := http.MaxBytesReader(w, req.Body, limit)
	if req.ContentLength > 0 {
		if err := hold.grow(req.ContentLength); err != nil {
			return nil, err
		}
		buf := make([]byte, req.ContentLength)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		// A lying Content-Length must not smuggle bytes past the limit.
		var one [1]byte
		if n, _ := rd.Read(one[:]); n > 0 {
			return nil, fmt.Errorf("body longer than its Content-Length")
		}
		return buf, nil
	}
	return io.ReadAll(&holdingReader{rd: rd, hold: hold})
}
