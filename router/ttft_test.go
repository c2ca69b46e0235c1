package router

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTTFTIsTimedAtTheFirstToken: an engine (or proxy) that sends its
// headers, its role-only chunk and a comment at once and the first token
// only after prefill must show that prefill as its TTFT, whatever kind of
// token comes first. The bound is a lower one: a slow machine can only make
// the measured time longer.
func TestTTFTIsTimedAtTheFirstToken(t *testing.T) {
	for _, tc := range []struct{ name, first string }{
		{"content", `{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`},
		{"reasoning", `{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}`},
		{"reasoning_content", `{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`},
		{"tool call", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":""}}]}}]}`},
		{"completion text", `{"choices":[{"index":0,"text":"Hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkTTFTAfterPrefill(t, ": ping\n\n", "data: "+tc.first+"\n\n"+
				`data: {"choices":[{"index":0,"delta":{"content":" there"}}]}`+"\n\n"+
				`data: {"choices":[],"usage":{"completion_tokens":2}}`+"\n\n")
		})
	}
}

// checkTTFTAfterPrefill streams from a real upstream through the router:
// a role-only chunk and early at once, then, after a prefill, first (the
// first token) and the end; the router must have timed the first token,
// no earlier event. The bound is a lower one: a slow machine can only make
// the measured time longer.
func checkTTFTAfterPrefill(t *testing.T, early, first string) {
	t.Helper()
	const prefill = 300 * time.Millisecond
	_, b := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n"+early)
		w.(http.Flusher).Flush()
		time.Sleep(prefill)
		_, _ = io.WriteString(w, first+"data: [DONE]\n\n")
	})
	r, rs := startRouter(t, Options{}, b)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	resp := post(t, ctx, rs.URL, `{"model":"qwen3-4b","stream":true,"messages":[]}`)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(got), first) {
		t.Fatalf("the first token did not reach the client whole (%d bytes came)", len(got))
	}
	st := r.Stats()[0]
	if len(st.TTFTHistory) != 1 {
		t.Fatalf("TTFT history %v, want one measurement: the first token was not seen", st.TTFTHistory)
	}
	if got := time.Duration(st.TTFTms * float64(time.Millisecond)); got < prefill {
		t.Errorf("TTFT %s, shorter than the %s before the first token: an event before it was timed", got, prefill)
	}
}

// TestNonStreamedTTFT: a non-streamed answer's TTFT is the engine's own
// prefill time where it reports one (llama-server's timings.prompt_ms), not
// the whole request; where it reports none, TTFT is left out.
func TestNonStreamedTTFT(t *testing.T) {
	const took = time.Second
	for _, tc := range []struct {
		name    string
		body    string
		wantTTF bool
	}{
		{"llama-server timings", `{"choices":[{"index":0,"message":{"role":"assistant","content":"a b c"}}],"usage":{"completion_tokens":3},` +
			`"timings":{"prompt_n":40,"prompt_ms":123.4,"predicted_n":3,"predicted_ms":800}}`, true},
		{"no timings (vLLM)", `{"choices":[{"index":0,"message":{"role":"assistant","content":"a b c"}}],"usage":{"completion_tokens":3}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
				time.Sleep(took)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, tc.body)
			})
			r, rs := startRouter(t, Options{}, b)
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			resp := post(t, ctx, rs.URL, `{"model":"qwen3-4b","messages":[]}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			st := r.Stats()[0]
			if !tc.wantTTF {
				if len(st.TTFTHistory) != 0 || st.TTFTms != 0 {
					t.Errorf("TTFT %v ms, history %v: want none recorded without the engine's timings", st.TTFTms, st.TTFTHistory)
				}
				return
			}
			if len(st.TTFTHistory) != 1 {
				t.Fatalf("TTFT history %v, want one measurement", st.TTFTHistory)
			}
			// prompt_ms plus the router's own (sub-millisecond) wait: far
			// from the second the whole answer took.
			if st.TTFTms < 123.4 || st.TTFTms >= float64(took/time.Millisecond) {
				t.Errorf("TTFT %.1f ms, want the reported 123.4 ms prefill (the whole request took %s)", st.TTFTms, took)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{5}, 5}, {[]float64{9, 1, 5}, 5}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestLongFirstChunkIsTheFirstToken: a first chunk longer than the meter
// keeps of a line (a big tool call, or a whole text at once) is still the
// first token, from a real upstream through the router; a long first event
// that is not a token (response.created echoing long instructions) is not.
func TestLongFirstChunkIsTheFirstToken(t *testing.T) {
	big := strings.Repeat("x", 3*maxMeterLine)
	echo := `event: response.created` + "\n" + `data: {"response":{"instructions":"` + big + `","status":"in_progress"},"sequence_number":0,"type":"response.created"}` + "\n\n"
	for _, tc := range []struct{ name, early, first string }{
		{"content", "", `data: {"choices":[{"index":0,"delta":{"content":"` + big + `"}}]}` + "\n\n"},
		{"tool call", "", `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"write","arguments":"{\"text\":\"` + big + `\"}"}}]}}]}` + "\n\n"},
		{"completion text", "", `data: {"choices":[{"index":0,"text":"` + big + `"}]}` + "\n\n"},
		{"anthropic text", "", "event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + big + `"}}` + "\n\n"},
		{"responses delta, type last", echo, "event: response.output_text.delta\n" + `data: {"content_index":0,"delta":"` + big + `","item_id":"m1","output_index":0,"sequence_number":1,"type":"response.output_text.delta"}` + "\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkTTFTAfterPrefill(t, tc.early, tc.first) })
	}
}
