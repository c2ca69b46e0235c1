package router

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// madeUpID is the random id of a message_start the repair made up.
var madeUpID = regexp.MustCompile(`"id":"msg_[0-9a-f]{24}"`)

// repairAll runs stream through the repair fed step bytes at a time.
func repairAll(stream string, step int) string {
	s := &sseAnthropicRepair{model: "qwen3"}
	var out bytes.Buffer
	for p := []byte(stream); len(p) > 0; {
		n := min(step, len(p))
		out.Write(s.feed(p[:n]))
		p = p[n:]
	}
	out.Write(s.finish())
	return madeUpID.ReplaceAllString(out.String(), `"id":"msg_X"`)
}

func TestAnthropicRepair(t *testing.T) {
	const madeUp = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_X\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"qwen3\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n"
	const rightStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"qwen3\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n"
	const rest = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\U0001F600\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	const textStart = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"right stream passes byte for byte", rightStart + textStart + rest, rightStart + textStart + rest},
		{"right stream with ping and CRLF passes",
			strings.ReplaceAll(rightStart+"event: ping\ndata: {\"type\":\"ping\"}\n\n"+textStart+rest, "\n", "\r\n"),
			strings.ReplaceAll(rightStart+"event: ping\ndata: {\"type\":\"ping\"}\n\n"+textStart+rest, "\n", "\r\n")},
		{"llama-server without message_start", textStart + rest, madeUp + textStart + rest},
		{"a ping first decides nothing",
			"event: ping\ndata: {\"type\":\"ping\"}\n\n" + rightStart + textStart,
			"event: ping\ndata: {\"type\":\"ping\"}\n\n" + rightStart + textStart},
		{"a ping then no message_start",
			": hi\nevent: ping\ndata: {\"type\":\"ping\"}\n\n" + textStart,
			": hi\nevent: ping\ndata: {\"type\":\"ping\"}\n\n" + madeUp + textStart},
		{"without message_start nor event lines",
			"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
			madeUp + "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"},
		{"an error first is left alone",
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n",
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n"},
		{"vLLM #45367 message_start without type and role",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"model\":\"qwen3\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n" + rest,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"type\":\"message\",\"role\":\"assistant\",\"id\":\"m\",\"content\":[],\"model\":\"qwen3\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n" + rest},
		{"message_start with an empty message",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n"},
		{"llama.cpp #22960 tool_use without input",
			rightStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\"}}\n\n",
			rightStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"input\":{},\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\"}}\n\n"},
		{"tool_use with input passes",
			rightStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n",
			rightStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n"},
		{"llama.cpp #20090 thinking without signature",
			rightStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
			rightStart + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"signature\":\"\",\"type\":\"thinking\",\"thinking\":\"\"}}\n\n"},
		{"data without event lines repaired too",
			"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{}}}\n\n" +
				"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\"}}\n\n",
			"data: {\"type\":\"message_start\",\"message\":{\"type\":\"message\",\"role\":\"assistant\",\"id\":\"m\",\"content\":[],\"usage\":{}}}\n\n" +
				"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"input\":{},\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\"}}\n\n"},
		{"a tool_use named in a delta is not a block start",
			rightStart + "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{\\\"type\\\":\\\"content_block_start\\\"}\"}}\n\n",
			rightStart + "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{\\\"type\\\":\\\"content_block_start\\\"}\"}}\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []int{1, 7, len(tc.in)} {
				if got := repairAll(tc.in, step); got != tc.want {
					t.Errorf("fed %d bytes at a time:\n got %q\nwant %q", step, got, tc.want)
				}
			}
		})
	}
}

// TestAnthropicRepairOnlyMessagesStreams: the repair touches /v1/messages
// event streams and nothing else.
func TestAnthropicRepairOnlyMessagesStreams(t *testing.T) {
	const noStart = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	for _, tc := range []struct {
		path, ctype string
		status      int
		repaired    bool
	}{
		{"/v1/messages", "text/event-stream", 200, true},
		{"/v1/messages", "application/json", 200, false},
		{"/v1/messages", "text/event-stream", 500, false},
		{"/v1/chat/completions", "text/event-stream", 200, false},
		{"/v1/messages/count_tokens", "text/event-stream", 200, false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", tc.ctype)
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, noStart)
		}))
		req, _ := http.NewRequest("POST", srv.URL+tc.path, strings.NewReader(`{}`))
		resp, err := (&anthropicRepairTransport{next: http.DefaultTransport, model: "qwen3"}).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if got := strings.HasPrefix(string(b), "event: message_start\n"); got != tc.repaired {
			t.Errorf("%s %s %d: repaired %v, want %v: %q", tc.path, tc.ctype, tc.status, got, tc.repaired, b)
		}
	}
}

// BenchmarkAnthropicRepair is the repair's cost on a right stream of 128
// text deltas, one read per event as an engine flushes them.
func BenchmarkAnthropicRepair(b *testing.B) {
	events := []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"qwen3\",\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"}
	for range 128 {
		events = append(events, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" word\"}}\n\n")
	}
	reads := make([][]byte, len(events))
	for i, e := range events {
		reads[i] = []byte(e)
	}
	b.ReportAllocs()
	for b.Loop() {
		s := &sseAnthropicRepair{model: "qwen3"}
		for _, p := range reads {
			s.feed(p)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
}
