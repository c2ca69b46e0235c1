package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestNotServedAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   bool
	}{
		{"vLLM unknown path", 404, `{"detail":"Not Found"}`, true},
		{"llama-server unknown path", 404, `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`, true},
		{"llama-server without --reranking", 501, `{"error":{"code":501,"message":"This server does not support reranking. Start it with ` + "`--reranking`" + `","type":"not_supported_error"}}`, true},
		{"vLLM unknown model", 404, `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`, false},
		{"a bad request", 400, `{"error":{"message":"bad"}}`, false},
		{"a server error", 500, `{"error":{"message":"boom"}}`, false},
	} {
		if got := notServedAnswer(tc.status, []byte(tc.body)); got != tc.want {
			t.Errorf("%s: notServedAnswer = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestChoiceCount(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		want       int
		bad        bool
	}{
		{"/v1/chat/completions", `{"model":"m","n":3}`, 3, false},
		{"/v1/completions", `{"model":"m"}`, 1, false},
		{"/v1/chat/completions", `{"model":"m","n":0}`, 0, true},
		{"/v1/chat/completions", `{"model":"m","n":-2}`, 0, true},
		{"/v1/embeddings", `{"model":"m","n":5}`, 1, false},
		// Not an integer: the engine's to refuse, as before n was read
		// with the rest of the body.
		{"/v1/chat/completions", `{"model":"m","n":null}`, 1, false},
		{"/v1/chat/completions", `{"model":"m","n":"3"}`, 1, false},
		{"/v1/chat/completions", `{"model":"m","n":2.5}`, 1, false},
		{"/v1/chat/completions", `{"model":"m","n":2,"n":4}`, 4, false},
		// The n bomb: bounded by MaxChoices and, with max_tokens, by
		// MaxChoiceTokens.
		{"/v1/chat/completions", `{"model":"m","n":128}`, 128, false},
		{"/v1/chat/completions", `{"model":"m","n":129}`, 0, true},
		{"/v1/completions", `{"model":"m","n":9223372036854775807}`, 0, true},
		{"/v1/completions", `{"model":"m","n":1e30}`, 0, true},
		{"/v1/chat/completions", `{"model":"m","n":1000000,"max_tokens":8}`, 0, true},
		{"/v1/chat/completions", `{"model":"m","n":128,"max_tokens":8192}`, 128, false},
		{"/v1/chat/completions", `{"model":"m","n":128,"max_tokens":8193}`, 0, true},
		{"/v1/chat/completions", `{"model":"m","n":2,"max_tokens":524289}`, 0, true},
		{"/v1/chat/completions", `{"model":"m","n":1,"max_tokens":2000000}`, 1, false},
	} {
		info, err := parseRequest([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		n, err := choiceCount(tc.path, info.N, info.MaxTokens)
		if (err != nil) != tc.bad || (!tc.bad && n != tc.want) {
			t.Errorf("%s %s: n %d err %v", tc.path, tc.body, n, err)
		}
	}
}

func TestWriteErrorTakesTheAPIsShape(t *testing.T) {
	for _, tc := range []struct {
		api     wireAPI
		status  int
		errType string
	}{
		{apiAnthropic, 404, "not_found_error"},
		{apiAnthropic, 401, "authentication_error"},
		{apiAnthropic, 429, "rate_limit_error"},
		{apiAnthropic, 503, "overloaded_error"},
		{apiAnthropic, 502, "api_error"},
		{apiAnthropic, 400, "invalid_request_error"},
		{apiOpenAI, 404, "invalid_request_error"},
	} {
		rec := httptest.NewRecorder()
		var w http.ResponseWriter = rec
		if tc.api == apiAnthropic {
			w = &apiWriter{ResponseWriter: rec, api: apiAnthropic}
		}
		writeError(w, tc.status, errTypeInvalidRequest, codeModelNotFound, "model", "the message", 0)
		var body struct {
			Type  string `json:"type"`
			Error struct {
				Type    string  `json:"type"`
				Message string  `json:"message"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tc.status {
			t.Fatalf("HTTP %d body %s: %v", rec.Code, rec.Body, err)
		}
		anthropic := body.Type == "error" && body.Error.Code == nil
		if anthropic != (tc.api == apiAnthropic) || body.Error.Type != tc.errType || body.Error.Message != "the message" {
			t.Errorf("api %d status %d: body %s, want error type %s", tc.api, tc.status, rec.Body, tc.errType)
		}
	}
}

func TestAnswerModelName(t *testing.T) {
	q := quoteJSON("qwen3")
	for _, tc := range []struct{ in, want string }{
		{`{"id":"x","model":"qwen3-4b","choices":[]}`, `{"id":"x","model":"qwen3","choices":[]}`},
		{`{"type":"message_start","message":{"id":"m","content":[{"model":"keep"}],"model":"Qwen/Qwen3-4B-AWQ"}}`,
			`{"type":"message_start","message":{"id":"m","content":[{"model":"keep"}],"model":"qwen3"}}`},
		{`{"type":"response.completed","response":{"id":"r","model":"qwen3-4b","output":[]}}`,
			`{"type":"response.completed","response":{"id":"r","model":"qwen3","output":[]}}`},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\"model\":\"x\""}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\"model\":\"x\""}}`},
		{`{"type":"response.created","response":{"id":"r","object":"response","status":"in_progress"}}`,
			`{"type":"response.created","response":{"id":"r","object":"response","status":"in_progress"}}`},
	} {
		if got := string(withAnswerModel([]byte(tc.in), q)); got != tc.want {
			t.Errorf("withAnswerModel(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestScanAPIUsage(t *testing.T) {
	for _, tc := range []struct {
		name           string
		payload        string
		prompt, cached int
	}{
		// llama-server's message_start: the cached part apart.
		{"anthropic", `{"type":"message_start","message":{"usage":{"cache_read_input_tokens":62,"input_tokens":1,"output_tokens":0}}}`, 63, 62},
		// vLLM's: no cache field.
		{"anthropic vllm", `{"type":"message_delta","usage":{"input_tokens":40,"output_tokens":9}}`, 40, -1},
		// Responses: input_tokens includes the cached ones.
		{"responses", `{"usage":{"input_tokens":57,"output_tokens":3,"total_tokens":60,"input_tokens_details":{"cached_tokens":17}}}`, 57, 17},
	} {
		c := unknownPromptCache()
		c.scanAPIUsage([]byte(tc.payload))
		if c.promptTokens != tc.prompt || c.cached != tc.cached {
			t.Errorf("%s: prompt %d cached %d, want %d and %d", tc.name, c.promptTokens, c.cached, tc.prompt, tc.cached)
		}
	}
}
