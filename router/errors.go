package router

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// OpenAI error types and codes the router emits. Clients written against the
// OpenAI SDKs branch on these strings, so they follow OpenAI's own spelling
// where one exists.
const (
	errTypeInvalidRequest = "invalid_request_error"
	errTypeAuthentication = "authentication_error"
	errTypeRateLimit      = "rate_limit_error"
	errTypeServer         = "server_error"

	codeModelNotFound   = "model_not_found"
	codeInvalidJSON     = "invalid_json"
	codeMissingModel    = "missing_model"
	codeBodyTooLarge    = "request_too_large"
	codeBodyTimeout     = "request_timeout"
	codeContextTooLong  = "context_length_exceeded"
	codeNoWorker        = "no_worker_available"
	codeQueueTimeout    = "queue_timeout"
	codeQueueFull       = "queue_full"
	codeKeyRateLimit    = "rate_limit_exceeded"
	codeInvalidAPIKey   = "invalid_api_key"
	codeUpstreamFailed  = "upstream_failed"
	codeMethodNotAllows = "method_not_allowed"
	codeBodiesInFlight  = "request_bodies_in_flight"
)

// apiError is the OpenAI error envelope's inner object. Param and Code are
// pointers so that "no value" encodes as null, as OpenAI does.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type errorEnvelope struct {
	Error apiError `json:"error"`
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func errorBody(typ, code, param, msg string) []byte {
	b, _ := json.Marshal(errorEnvelope{Error: apiError{Message: msg, Type: typ, Param: strOrNil(param), Code: strOrNil(code)}})
	return b
}

// writeError answers with an OpenAI-shaped error, or an Anthropic-shaped
// one on the Anthropic endpoints (see apiWriter). retryAfter > 0 adds a
// Retry-After header rounded up to whole seconds, the only unit the header has.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if retryAfter > 0 {
		secs := int((retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.Itoa(secs))
	}
	w.WriteHeader(status)
	if writerAPI(w) == apiAnthropic {
		_, _ = w.Write(anthropicErrorBody(status, msg))
		return
	}
	_, _ = w.Write(errorBody(typ, code, param, msg))
}

// sseErrorEvent is what a stream gets when its backend fails after the first
// byte: the headers are gone, so the error travels as one more SSE event.
func sseErrorEvent(msg string) []byte {
	b := errorBody(errTypeServer, codeUpstreamFailed, "", msg)
	out := make([]byte, 0, len(b)+8)
	out = append(out, "data: "...)
	out = append(out, b...)
	out = append(out, "\n\n"...)
	return out
}
