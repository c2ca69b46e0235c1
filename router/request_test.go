package router

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		want    requestInfo
		errCode string
		param   string
	}{
		{"chat", `{"model":"qwen3-4b","messages":[{"role":"user","content":"hello there"}]}`,
			requestInfo{Model: "qwen3-4b", PromptTokens: 11}, "", ""},
		{"stream and max_tokens", `{"model":"m","stream":true,"max_tokens":256,"prompt":"abcd"}`,
			requestInfo{Model: "m", Stream: true, MaxTokens: 256, PromptTokens: 2}, "", ""},
		{"max_completion_tokens", `{"model":"m","max_completion_tokens":9}`, requestInfo{Model: "m", MaxTokens: 9}, "", ""},
		{"embedding input", `{"model":"e","input":["a","b"]}`, requestInfo{Model: "e", PromptTokens: 3}, "", ""},
		// Anthropic: the system prompt counts.
		{"anthropic system", `{"model":"m","max_tokens":5,"system":"abcdefgh","messages":[]}`,
			requestInfo{Model: "m", MaxTokens: 5, PromptTokens: 3}, "", ""},
		// Responses: instructions and input count, max_output_tokens bounds.
		{"responses", `{"model":"m","max_output_tokens":7,"instructions":"abcdef","input":"ab"}`,
			requestInfo{Model: "m", MaxTokens: 7, PromptTokens: 3}, "", ""},
		{"malformed", `{"model":"m"`, requestInfo{}, codeInvalidJSON, ""},
		{"empty body", ``, requestInfo{}, codeInvalidJSON, ""},
		{"array", `[]`, requestInfo{}, codeInvalidJSON, ""},
		{"missing model", `{"messages":[]}`, requestInfo{}, codeMissingModel, "model"},
		{"null model", `{"model":null}`, requestInfo{}, codeMissingModel, "model"},
		{"empty model", `{"model":""}`, requestInfo{}, codeMissingModel, "model"},
		{"numeric model", `{"model":3}`, requestInfo{}, codeInvalidJSON, "model"},
		{"stream not bool", `{"model":"m","stream":"yes"}`, requestInfo{}, codeInvalidJSON, "stream"},
		{"negative max_tokens", `{"model":"m","max_tokens":-1}`, requestInfo{}, "invalid_value", "max_tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRequest([]byte(tc.body))
			if tc.errCode != "" {
				var rerr *requestError
				if !errors.As(err, &rerr) {
					t.Fatalf("err %v, want a requestError", err)
				}
				if rerr.code != tc.errCode || rerr.param != tc.param || rerr.msg == "" {
					t.Errorf("got code %q param %q msg %q, want %q %q", rerr.code, rerr.param, rerr.msg, tc.errCode, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Embeddings are not prompt-cached: only prompts get a chain.
			hasPrompt := strings.Contains(tc.body, `"messages"`) || strings.Contains(tc.body, `"prompt"`) || strings.Contains(tc.body, `"instructions"`)
			if (len(got.Prefix) > 0) != hasPrompt {
				t.Errorf("prefix chain %v for %s", got.Prefix, tc.body)
			}
			got.Prefix = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A conversation that grows by appending messages keeps its chain's head,
// tools included, so the router can find the worker holding it.
func TestParseRequestPrefixGrows(t *testing.T) {
	sys := strings.Repeat("You are a coding agent with tools. ", 40)
	tools := `[{"type":"function","function":{"name":"read_file","parameters":{}}}]`
	turn1 := `{"model":"m","tools":` + tools + `,"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"fix the bug"}]}`
	turn2 := `{"model":"m","tools":` + tools + `,"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"fix the bug"},{"role":"assistant","content":"reading"},{"role":"tool","content":"` + strings.Repeat("x", 2000) + `"}]}`
	a, err := parseRequest([]byte(turn1))
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseRequest([]byte(turn2))
	if err != nil {
		t.Fatal(err)
	}
	shared := (len(tools) + len(sys)) / PrefixChunkBytes
	if shared < 4 || len(b.Prefix) <= len(a.Prefix) {
		t.Fatalf("chains of %d and %d chunks, %d shared expected", len(a.Prefix), len(b.Prefix), shared)
	}
	x := NewPrefixIndex(0)
	x.Insert(a.Prefix)
	if got := x.Match(b.Prefix); got < shared || got >= len(b.Prefix) {
		t.Errorf("the second turn matches %d chunks of the first's, want %d to %d", got, shared, len(a.Prefix))
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"m","max_tokens":1,"prompt":["a","b"]}`,
		`{"model":null}`, `{"model":1e400}`, `{"stream":true}`, `[]`, ``, `{"model":"\u0000"}`,
		`{"model":"m","max_tokens":99999999999999999999}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		info, err := parseRequest(body)
		if err != nil {
			var rerr *requestError
			if !errors.As(err, &rerr) || rerr.code == "" || rerr.msg == "" {
				t.Fatalf("error without an OpenAI code and message: %#v", err)
			}
			return
		}
		if info.Model == "" {
			t.Fatal("accepted a request without a model")
		}
		if info.MaxTokens < 0 || info.PromptTokens < 0 || info.PromptTokens > len(body) {
			t.Fatalf("implausible figures %+v for %d bytes", info, len(body))
		}
	})
}

// Reading the routing facts out of a body copies none of it: a hostile
// viewer's eight 15 MiB bodies, held at the bodies-in-flight bound and
// completed at once, took the hub from 289 to 409 MiB while they were
// parsed, as each prompt field was copied whole (json.RawMessage copies),
// a cost the bound does not count (issue 19's combined test).
func TestParseRequestCopiesNoPrompt(t *testing.T) {
	const size = 8 << 20
	for _, field := range []string{"messages", "prompt", "input", "system", "tools"} {
		head := fmt.Sprintf(`{"model":"qwen3-4b","max_tokens":4,"instructions":"be brief",%q:[{"role":"user","content":"`, field)
		tail := `"}]}`
		body := bytes.Repeat([]byte{'a'}, size)
		copy(body, head)
		copy(body[size-len(tail):], tail)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		info, err := parseRequest(body)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		// Tools are part of the prefix, not of the prompt's estimate.
		if field != "tools" && info.PromptTokens < size/bytesPerToken-100 {
			t.Errorf("%s: PromptTokens = %d, want about %d", field, info.PromptTokens, size/bytesPerToken)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > size/8 {
			t.Errorf("parsing a %d MiB body with its prompt in %q allocated %.1f MiB; want far less than the body (no copy of the prompt)",
				size>>20, field, float64(got)/(1<<20))
		}
	}
}
