package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"fleet"
)

// flushRecorder is a ResponseWriter that records how many body bytes each
// Flush sent.
type flushRecorder struct {
	header  http.Header
	mu      sync.Mutex
	pending int
	flushes []int
	// onFlush, when set, hears of every flush: the bytes of each so far.
	onFlush func(flushes []int)
}

func (w *flushRecorder) Header() http.Header { return w.header }
func (w *flushRecorder) WriteHeader(int)     {}
func (w *flushRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending += len(p)
	return len(p), nil
}

func (w *flushRecorder) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushes = append(w.flushes, w.pending)
	w.pending = 0
	if w.onFlush != nil {
		w.onFlush(w.flushes)
	}
}

// TestStreamHeadersLeaveWithTheFirstBytes: a stream's headers are not
// flushed in a write of their own (a system call and a client read per
// stream) but with the first bytes of the body, which the hedge has read
// already; and every flush carries body bytes.
func TestStreamHeadersLeaveWithTheFirstBytes(t *testing.T) {
	_, b := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a", "b", "c"} {
			_, _ = io.WriteString(w, sseEvent(tok))
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	r := mustNew(t, Options{})
	if err := r.SetModels(testModels()); err != nil {
		t.Fatal(err)
	}
	r.SetBackends([]Backend{b})
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"qwen3-4b","stream":true,"messages":[]}`))
	w := &flushRecorder{header: http.Header{}}
	r.Handler().ServeHTTP(w, req)
	if len(w.flushes) == 0 {
		t.Fatal("the stream was never flushed")
	}
	for i, n := range w.flushes {
		if n == 0 {
			t.Errorf("flush %d of %v sent no body bytes: headers were flushed alone", i, w.flushes)
		}
	}
}

// TestNoEventHeldBack: an event that has reached the router leaves for the
// client without waiting for a later one, through every piece of the chain
// that rewrites a stream. The engine writes up to the end of an event (some
// events cut across two writes, some written together with the one before)
// and then waits until the client has read that event whole: a router that
// held it back for more would never see the next, and the hang guard would
// fail the test. No timing is asserted.
func TestNoEventHeldBack(t *testing.T) {
	chat := func(tok string) string { return sseEvent(tok) }
	reasoning := func(tok string) string {
		return `data: {"choices":[{"index":0,"delta":{"reasoning_content":"` + tok + `"}}],"object":"chat.completion.chunk","model":"qwen3-4b"}` + "\n\n"
	}
	anthropic := func(tok string) string {
		return "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + tok + "\"}}\n\n"
	}
	const anthropicStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"qwen3-4b\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	const anthropicEnd = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	const chatEnd = `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}` + "\n\ndata: [DONE]\n\n"
	chatBody := `{"model":"qwen3-4b","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name      string
		path      string
		body      string
		reasoning string // the model's normalisation
		served    string // the name the engine serves, when not the model's
		event     func(tok string) string
		head, end string
	}{
		{name: "passed through", path: chatPath, body: chatBody, event: chat, end: chatEnd},
		{name: "reasoning normalised inline", path: chatPath, body: chatBody, reasoning: "inline", event: reasoning, end: chatEnd},
		{name: "reasoning normalised to a field", path: chatPath, body: chatBody, reasoning: "field", event: reasoning, end: chatEnd},
		{name: "model renamed", path: chatPath, body: chatBody, served: "Qwen/Qwen3-4B", event: chat, end: chatEnd},
		{name: "anthropic stream repaired", path: messagesPath, body: `{"model":"qwen3-4b","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			event: anthropic, head: anthropicStart, end: anthropicEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			toks := []string{"tokA", "tokB", "tokC", "tokD"}
			// What the engine writes, flushing after each write, before it
			// waits for the client to have read toks[i]: the first event
			// with the head, the second cut in two writes, the third and
			// fourth written together.
			cut := len(tc.event(toks[1])) / 2
			steps := [][]string{
				{tc.head + tc.event(toks[0])},
				{tc.event(toks[1])[:cut], tc.event(toks[1])[cut:]},
				nil,
				{tc.event(toks[2]) + tc.event(toks[3])},
			}
			read := make([]chan struct{}, len(toks))
			for i := range read {
				read[i] = make(chan struct{})
			}
			_, b := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for i, writes := range steps {
					for _, s := range writes {
						_, _ = io.WriteString(w, s)
						w.(http.Flusher).Flush()
					}
					if writes == nil {
						continue
					}
					select {
					case <-read[i]:
					case <-req.Context().Done():
						return
					}
				}
				_, _ = io.WriteString(w, tc.end)
			})
			b.ServedName = tc.served
			r := mustNew(t, Options{})
			models := testModels()
			models[0].Reasoning = tc.reasoning
			if err := r.SetModels(models); err != nil {
				t.Fatal(err)
			}
			r.SetBackends([]Backend{b})
			rs := httptest.NewServer(r.Handler())
			t.Cleanup(rs.Close)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, rs.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				body, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			br := bufio.NewReader(resp.Body)
			var got strings.Builder
			for i, tok := range toks {
				// Read whole events until the one that carries tok has
				// ended; then the engine may write on.
				for seen := false; !seen; {
					ev, err := readEvent(br)
					got.WriteString(ev)
					if err != nil {
						t.Fatalf("the event carrying %s did not reach the client before the engine wrote the next (%v); got so far:\n%s", tok, err, got.String())
					}
					seen = strings.Contains(ev, tok)
				}
				if steps[i] != nil {
					close(read[i])
				}
			}
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatalf("reading the end of the stream: %v", err)
			}
			if tc.path == chatPath && !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
				t.Errorf("the stream ends %q, want data: [DONE]", rest)
			}
		})
	}
}

// readEvent reads one SSE event: its lines up to and with the blank line
// that ends it.
func readEvent(br *bufio.Reader) (string, error) {
	var ev strings.Builder
	for {
		line, err := br.ReadString('\n')
		ev.WriteString(line)
		if err != nil {
			return ev.String(), err
		}
		if strings.TrimRight(line, "\r\n") == "" {
			return ev.String(), nil
		}
	}
}

// TestBurstIsReadAtOnce: events an engine sent in one go are read from the
// worker's connection at once and leave the router in one flush, however
// many: the transport's default 4 KiB buffer cut a fast engine's backlog
// into a system call per 4 KiB. The engine is a socket that writes its
// headers and 12 KiB of events, each in its own chunk as llama-server
// flushes them, in one write, then waits until the client has them all.
func TestBurstIsReadAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var burst strings.Builder
	burst.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	events := 0
	for events = 0; events*len(sseEvent("token")) < 12<<10; events++ {
		burst.WriteString(chunk(sseEvent("token")))
	}
	burstBytes := events * len(sseEvent("token"))
	got := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	engineDone := make(chan error, 1)
	go func() {
		engineDone <- func() error {
			conn, err := ln.Accept()
			if err != nil {
				return err
			}
			defer conn.Close()
			req, err := http.ReadRequest(bufio.NewReader(conn))
			if err != nil {
				return err
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return err
			}
			if _, err := io.WriteString(conn, burst.String()); err != nil {
				return err
			}
			select {
			case <-got:
			case <-ctx.Done():
				return ctx.Err()
			}
			_, err = io.WriteString(conn, chunk("data: [DONE]\n\n")+"0\r\n\r\n")
			return err
		}()
	}()
	r := mustNew(t, Options{})
	if err := r.SetModels(testModels()); err != nil {
		t.Fatal(err)
	}
	conn := &readCounter{}
	r.SetBackends([]Backend{{Name: "rig/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: ln.Addr().String(), Context: 16384, Slots: 1,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			conn.Conn = c
			return conn, err
		}}})
	burstReads := int64(-1)
	var burstFlushes []int
	w := &flushRecorder{header: http.Header{}, onFlush: func(flushes []int) {
		sum := 0
		for _, n := range flushes {
			sum += n
		}
		if burstFlushes == nil && sum >= burstBytes {
			burstFlushes = slices.Clone(flushes)
			burstReads = conn.reads.Load()
			close(got)
		}
	}}
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"qwen3-4b","stream":true,"messages":[]}`))
	r.Handler().ServeHTTP(w, req)
	if err := <-engineDone; err != nil {
		t.Fatalf("engine: %v", err)
	}
	if burstFlushes == nil {
		t.Fatalf("the client got %v bytes in flushes, not the %d of the burst", w.flushes, burstBytes)
	}
	// The first read is the hedge's (at most 4 KiB, hedge.go); all the
	// rest had arrived by then, and leaves in the next.
	// The headers and the burst are one read; the hedge takes the first
	// 4 KiB of it (hedge.go), the copy loop the rest, each in a flush.
	if burstReads != 1 {
		t.Errorf("the engine's headers and %d events, sent in one write, took %d reads of its connection, want 1", events, burstReads)
	}
	if len(burstFlushes) > 2 {
		t.Errorf("%d events sent in one write left in %d flushes %v, want at most 2", events, len(burstFlushes), burstFlushes)
	}
}

// readCounter counts the reads of a connection that brought bytes.
type readCounter struct {
	net.Conn
	reads atomic.Int64
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.reads.Add(1)
	}
	return n, err
}
