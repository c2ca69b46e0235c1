package reasoning_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"fleet/router/reasoning"
)

// upstream is a fake engine: it answers non-streamed with body, and streamed
// with events one at a time, each sent only after the client acknowledged
// the previous one. A proxy that buffered the stream would deadlock it.
type upstream struct {
	body   string
	events []string
	ack    chan struct{}
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	if !bytes.Contains(raw, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, u.body)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	for i, ev := range u.events {
		fmt.Fprintf(w, "data: %s\n\n", ev)
		flusher.Flush()
		if i == len(u.events)-1 {
			break // [DONE] is never acknowledged: Recv turns it into io.EOF
		}
		select {
		case <-u.ack:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second): // hang guard only
			return
		}
	}
}

// proxy applies the rewriter the way the router will: line by line, flushed
// after every event, and RewriteJSON on whole bodies.
// An event the rewriter swallows whole (a chunk that was only "<think>")
// never reaches the client, so the proxy acknowledges it itself.
func proxy(target string, mode reasoning.Mode, swallowed func()) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.Path, r.Body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			body, _ := io.ReadAll(resp.Body)
			out, err := reasoning.RewriteJSON(body, mode)
			if err != nil {
				out = body
			}
			w.Write(out)
			return
		}
		rw := reasoning.NewStreamRewriter(mode)
		flusher := w.(http.Flusher)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			payload, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			out := rw.Rewrite([]byte(payload))
			if len(out) == 0 {
				swallowed()
			}
			for _, ev := range out {
				fmt.Fprintf(w, "data: %s\n\n", ev)
			}
			flusher.Flush()
		}
	})
}

const (
	think  = "Okay, 17 times 23: 17×20 is 340, 17×3 is 51, so 391."
	answer = "17 × 23 = 391."
)

func chunk(delta, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3-4b","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + fr + `}]}`
}

const usage = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3-4b","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}`

func completion(message string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"qwen3-4b","choices":[{"index":0,"finish_reason":"stop","message":` + message + `}],"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}`
}

// Three upstreams that put the same thinking in three places.
var upstreams = map[string]*upstream{
	"vLLM without parser": {
		body: completion(`{"role":"assistant","content":"<think>\n` + think + `\n</think>\n\n` + answer + `"}`),
		events: []string{chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"content":"<think>"}`, ""),
			chunk(`{"content":"\n`+think[:20]+`"}`, ""), chunk(`{"content":"`+think[20:]+`\n</thi"}`, ""),
			chunk(`{"content":"nk>\n\n"}`, ""), chunk(`{"content":"`+answer+`"}`, ""), chunk(`{}`, "stop"), usage, "[DONE]"},
	},
	"vLLM with parser": {
		body: completion(`{"role":"assistant","content":"` + answer + `","reasoning":"` + think + `"}`),
		events: []string{chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"reasoning":"`+think[:20]+`"}`, ""),
			chunk(`{"reasoning":"`+think[20:]+`"}`, ""), chunk(`{"content":"`+answer+`"}`, ""), chunk(`{}`, "stop"), usage, "[DONE]"},
	},
	"llama-server default": {
		body: completion(`{"role":"assistant","content":"` + answer + `","reasoning_content":"` + think + `"}`),
		events: []string{chunk(`{"role":"assistant","content":null}`, ""), chunk(`{"reasoning_content":"`+think[:20]+`"}`, ""),
			chunk(`{"reasoning_content":"`+think[20:]+`"}`, ""), chunk(`{"content":"`+answer+`"}`, ""), chunk(`{}`, "stop"), usage, "[DONE]"},
	},
}

// seen is what a go-openai user gets out of one response.
type seen struct {
	Content, ReasoningContent string
	Usage                     bool
}

func TestGoOpenAIClientSeesOneShape(t *testing.T) {
	want := map[reasoning.Mode]seen{
		reasoning.Inline: {Content: "<think>\n" + think + "\n</think>\n\n" + answer, Usage: true},
		reasoning.Field:  {Content: answer, ReasoningContent: think, Usage: true},
	}
	for _, mode := range []reasoning.Mode{reasoning.Inline, reasoning.Field} {
		for name, up := range upstreams {
			t.Run(string(mode)+"/"+name, func(t *testing.T) {
				up.ack = make(chan struct{}, 1)
				engine := httptest.NewServer(up)
				defer engine.Close()
				router := httptest.NewServer(proxy(engine.URL, mode, func() { up.ack <- struct{}{} }))
				defer router.Close()

				cfg := openai.DefaultConfig("unused")
				cfg.BaseURL = router.URL + "/v1"
				client := openai.NewClientWithConfig(cfg)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				req := openai.ChatCompletionRequest{
					Model:    "qwen3-4b",
					Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "What is 17 multiplied by 23?"}},
				}

				resp, err := client.CreateChatCompletion(ctx, req)
				if err != nil {
					t.Fatalf("non-streamed: %v", err)
				}
				got := seen{resp.Choices[0].Message.Content, resp.Choices[0].Message.ReasoningContent, resp.Usage.TotalTokens > 0}
				if got != want[mode] {
					t.Errorf("non-streamed: go-openai sees %+v\nwant %+v", got, want[mode])
				}

				req.Stream = true
				req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
				stream, err := client.CreateChatCompletionStream(ctx, req)
				if err != nil {
					t.Fatalf("streamed: %v", err)
				}
				defer stream.Close()
				var streamed seen
				for {
					chunk, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatalf("streamed: %v", err)
					}
					// Releases the upstream's next event: proves this one
					// crossed the proxy before the next was even written.
					up.ack <- struct{}{}
					if chunk.Usage != nil {
						streamed.Usage = true
					}
					for _, c := range chunk.Choices {
						streamed.Content += c.Delta.Content
						streamed.ReasoningContent += c.Delta.ReasoningContent
					}
				}
				if streamed != want[mode] {
					t.Errorf("streamed: go-openai sees %+v\nwant %+v", streamed, want[mode])
				}
			})
		}
	}
}
