package router

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"fleet"
	"fleet/sim/simtest"
)

func TestWithModel(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"replaces", `{"model":"qwen3","messages":[]}`, `{"model":"qwen3-4b","messages":[]}`},
		{"spaces", `{ "stream" : true , "model" : "qwen3" }`, `{ "stream" : true , "model" : "qwen3-4b" }`},
		{"after nested objects", `{"messages":[{"role":"user","content":"{\"model\":\"x\"}"}],"meta":{"model":"keep"},"model":"qwen3"}`,
			`{"messages":[{"role":"user","content":"{\"model\":\"x\"}"}],"meta":{"model":"keep"},"model":"qwen3-4b"}`},
		{"nested only", `{"meta":{"model":"keep"}}`, `{"meta":{"model":"keep"}}`},
		{"not a string", `{"model":7}`, `{"model":7}`},
		{"already right", `{"model":"qwen3-4b"}`, `{"model":"qwen3-4b"}`},
		{"not JSON", `[DONE]`, `[DONE]`},
		{"repeated key: the last counts", `{"model":"a","model":"qwen3"}`, `{"model":"a","model":"qwen3-4b"}`},
		{"truncated", `{"model":"qwen3","messages":[`, `{"model":"qwen3","messages":[`},
		{"escaped value", `{"model":"a\"b","x":1}`, `{"model":"qwen3-4b","x":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(withModel([]byte(tc.in), quoteJSON("qwen3-4b"))); got != tc.want {
				t.Errorf("withModel(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestSSEModelRewriterSplitReads(t *testing.T) {
	in := "data: {\"id\":\"a\",\"model\":\"qwen3-4b\",\"choices\":[]}\n\n: ping\n\ndata: [DONE]\n\ndata: {\"model\":\"qwen3-4b\"}"
	want := strings.ReplaceAll(in, `"qwen3-4b"`, `"qwen3"`)
	for size := 1; size <= len(in); size += 7 {
		rw := newSSEModelRewriter("qwen3")
		var out bytes.Buffer
		for i := 0; i < len(in); i += size {
			out.Write(rw.feed([]byte(in[i:min(i+size, len(in))])))
		}
		out.Write(rw.finish())
		if out.String() != want {
			t.Fatalf("reads of %d bytes: got %q, want %q", size, out.String(), want)
		}
	}
}

// TestAliasServedByEveryEngine sends requests naming the model by its alias
// to a vLLM mimic (which refuses any name it does not serve, as vLLM does),
// a llama-server mimic and an engine serving under its own tag (Ollama), on
// every endpoint, streamed and not: each must answer, and every body and
// chunk must carry the name the client asked for.
func TestAliasServedByEveryEngine(t *testing.T) {
	engines := []struct {
		name, served string
		engine       fleet.EngineKind
		args         string
	}{
		{"rig/qwen3-4b", "", fleet.EngineVLLM, "--mimic vllm --profile instant -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b"},
		{"ultra/qwen3-4b", "", fleet.EngineLlamaCpp, "--mimic llamacpp --profile instant -- -m q.gguf -a qwen3-4b"},
		{"tag/qwen3-4b", "qwen3:4b", fleet.EngineOllama, "--mimic vllm --profile instant -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3:4b"},
	}
	var bs []Backend
	for _, e := range engines {
		srv := simtest.Start(t, strings.Fields(e.args)...)
		bs = append(bs, Backend{Name: e.name, Model: "qwen3-4b", ServedName: e.served, Engine: e.engine,
			Addr: srv.Listener.Addr().String(), Context: 16384, Slots: 4})
	}
	_, rs := startRouter(t, Options{Policy: PolicyRoundRobin, MaxRetries: -1}, bs...)
	type call struct{ path, body string }
	calls := []call{
		{"/v1/chat/completions", `{"model":"%s","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"%s","max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"model":"%s","max_tokens":8,"prompt":"hi"}`},
		{"/v1/completions", `{"model":"%s","max_tokens":8,"stream":true,"prompt":"hi"}`},
		{"/v1/embeddings", `{"model":"%s","input":"hi"}`},
	}
	for _, asked := range []string{"qwen3", "qwen3-4b"} {
		for _, c := range calls {
			// One request per engine: round robin visits each.
			for range engines {
				body := strings.Replace(c.body, "%s", asked, 1)
				resp, err := http.Post(rs.URL+c.path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s as %q: %s: %s", c.path, asked, resp.Status, raw)
				}
				for _, doc := range jsonDocs(raw) {
					var m struct {
						Model *string `json:"model"`
					}
					if err := json.Unmarshal(doc, &m); err != nil {
						t.Fatalf("%s: not JSON: %s", c.path, doc)
					}
					if m.Model == nil || *m.Model != asked {
						t.Fatalf("%s asked for %q, answer carries model %v: %s", c.path, asked, m.Model, doc)
					}
				}
			}
		}
	}
}

// jsonDocs is a non-streamed body, or the data events of a stream.
func jsonDocs(raw []byte) [][]byte {
	if !bytes.HasPrefix(raw, []byte("data:")) {
		return [][]byte{raw}
	}
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		p, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if ok && !bytes.Equal(p, []byte("[DONE]")) {
			out = append(out, bytes.Clone(p))
		}
	}
	return out
}

// TestAliasWithReasoningNormalisation: the answer is renamed after it is
// normalised, streamed or not.
func TestAliasWithReasoningNormalisation(t *testing.T) {
	srv := simtest.Start(t, strings.Fields("--mimic vllm --profile instant -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --reasoning-parser qwen3")...)
	r := mustNew(t, Options{})
	models := testModels()
	models[0].Reasoning = "inline"
	if err := r.SetModels(models); err != nil {
		t.Fatal(err)
	}
	r.SetBackends([]Backend{{Name: "rig/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineVLLM, Addr: srv.Listener.Addr().String(), Context: 16384, Slots: 4}})
	rs := httptest.NewServer(r.Handler())
	defer rs.Close()
	for _, stream := range []bool{false, true} {
		body := `{"model":"qwen3","max_tokens":32,"stream":` + map[bool]string{false: "false", true: "true"}[stream] +
			`,"messages":[{"role":"user","content":"What is 17 multiplied by 23?"}]}`
		resp, err := http.Post(rs.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%v: %s: %s", stream, resp.Status, raw)
		}
		if !bytes.Contains(raw, []byte("<think>")) {
			t.Errorf("stream=%v: the answer was not normalised to inline reasoning: %.300s", stream, raw)
		}
		for _, doc := range jsonDocs(raw) {
			var m struct{ Model string }
			if err := json.Unmarshal(doc, &m); err != nil || m.Model != "qwen3" {
				t.Fatalf("stream=%v: chunk carries model %q, want the alias: %s", stream, m.Model, doc)
			}
		}
	}
}
