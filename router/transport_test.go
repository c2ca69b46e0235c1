package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"fleet/router/reasoning"
	"fleet/sim/simtest"
)

// A check talking to one worker through NormalisingTransport sees the shape
// the router's clients get, streamed and not.
func TestNormalisingTransportShowsWhatRouterClientsGet(t *testing.T) {
	es := simtest.Start(t, "--mimic", "vllm", "--profile", "instant", "--", "serve", "m", "--served-model-name", "m", "--reasoning-parser", "qwen3")

	ask := func(rt http.RoundTripper) (plain, streamed string) {
		cfg := openai.DefaultConfig("unused")
		cfg.BaseURL = es.URL + "/v1"
		cfg.HTTPClient = &http.Client{Transport: rt}
		client := openai.NewClientWithConfig(cfg)
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		req := openai.ChatCompletionRequest{Model: "m", MaxCompletionTokens: 40,
			Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "What is 17 multiplied by 23?"}}}
		resp, err := client.CreateChatCompletion(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		plain = resp.Choices[0].Message.Content
		req.Stream = true
		stream, err := client.CreateChatCompletionStream(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return plain, streamed
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range chunk.Choices {
				streamed += c.Delta.Content
			}
		}
	}
	rawPlain, rawStreamed := ask(http.DefaultTransport)
	if strings.Contains(rawPlain, "<think>") || strings.Contains(rawStreamed, "<think>") {
		t.Fatalf("the engine already inlines its reasoning; the test proves nothing: %q", rawPlain)
	}
	plain, streamed := ask(NormalisingTransport(nil, reasoning.Inline))
	for name, content := range map[string]string{"non-streamed": plain, "streamed": streamed} {
		if !strings.HasPrefix(content, "<think>\n") {
			t.Errorf("%s through the transport: content %q does not start with the inline <think>", name, content)
		}
	}
	if plain != streamed {
		t.Errorf("streamed and non-streamed differ:\n%q\n%q", plain, streamed)
	}
	if rt := NormalisingTransport(http.DefaultTransport, reasoning.Off); rt != http.DefaultTransport {
		t.Errorf("mode off must leave the transport as it was")
	}
}
