package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/sim/simtest"
)

// counterValue sums the named counter's series on the router's /metrics
// whose labels include want.
func counterValue(t *testing.T, ctx context.Context, url, name string, want map[string]string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	return metricSum(t, req, name, want)
}

// metricSum sums the named series of req's /metrics answer whose labels
// include want.
func metricSum(t *testing.T, req *http.Request, name string, want map[string]string) float64 {
	t.Helper()
	sum := 0.0
next:
	for _, s := range scrapeValues(t, req)[name] {
		for k, v := range want {
			if s.labels[k] != v {
				continue next
			}
		}
		sum += s.value
	}
	return sum
}

// neverReads sends a streamed chat request on a raw connection with a small
// receive buffer and reads nothing of the answer, like the clients of issue
// 19 that held every llama slot. The connection is closed when the test ends.
func neverReads(t *testing.T, addr string, maxTokens int) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := fmt.Sprintf(`{"model":"qwen3-4b","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"tell me everything"}]}`, maxTokens)
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
}

// A streaming client that reads nothing is cut once a write to it has
// blocked for the write timeout: its engine request is cancelled (the slot
// freed), it is counted on /metrics and as a 499, and the worker serves
// others. Before, the router's write blocked for as long as the engine had
// tokens, holding the slot.
func TestClientThatNeverReadsIsCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*hangGuard)
	defer cancel()
	const slots = 2
	ended := make(chan struct{}, slots+1)
	// An engine with tokens for ever, in large events: the connection's
	// buffers fill within milliseconds of the client's last read.
	event := sseEvent(strings.Repeat("token ", 4<<10))
	_, b := startBackend(t, "mac/qwen3-4b", slots, func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			okJSON(w, req)
			return
		}
		defer func() { ended <- struct{}{} }()
		w.Header().Set("Content-Type", "text/event-stream")
		for req.Context().Err() == nil {
			if _, err := io.WriteString(w, event); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	r, rsrv := startRouter(t, Options{WriteTimeout: 300 * time.Millisecond, QueueTimeout: hangGuard}, b)
	addr := serveReal(t, r)
	for range slots {
		neverReads(t, addr, 0)
	}
	for i := range slots {
		select {
		case <-ended:
		case <-ctx.Done():
			t.Fatalf("%d of %d engine requests of clients that never read were cancelled; the others hold their slots", i, slots)
		}
	}
	waitFor(t, func() bool { return r.InFlight(b.Name) == 0 })
	// The slots serve others again.
	resp := post(t, ctx, "http://"+addr, `{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a request after the stalled clients were cut: status %d, want 200", resp.StatusCode)
	}
	if got := counterValue(t, ctx, rsrv.URL, "fleet_router_client_write_timeouts_total", map[string]string{"model": "qwen3-4b"}); got != slots {
		t.Errorf("fleet_router_client_write_timeouts_total = %v, want %d", got, slots)
	}
	if got := counterValue(t, ctx, rsrv.URL, "fleet_router_requests_total", map[string]string{"backend": b.Name, "status": "499"}); got != slots {
		t.Errorf("requests counted as 499 = %v, want %d (the cut clients)", got, slots)
	}
}

// The same against the simulated llama-server, whose slots are what the
// clients of issue 19 held: once they are cut, it reports none busy.
func TestClientThatNeverReadsFreesTheEngineSlot(t *testing.T) {
	const slots, ctx = 2, 1 << 20
	engine := simtest.Start(t, strings.Fields(fmt.Sprintf("--mimic llamacpp --profile instant -- -m q.gguf -a qwen3-4b -np %d -c %d --metrics", slots, slots*ctx))...)
	b := Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: engine.Listener.Addr().String(), Context: ctx, Slots: slots}
	r, _ := startRouter(t, Options{WriteTimeout: 300 * time.Millisecond}, b)
	// Small send buffers on the router's side too: the engine (slow under
	// the race detector) need not fill megabytes before the cut.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer("", r.Handler())
	go func() { _ = srv.Serve(smallSendBuffers{ln}) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()
	busy := func() float64 {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, engine.URL+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		return metricSum(t, req, "llamacpp:requests_processing", nil)
	}
	for range slots {
		// An answer of 100,000 tokens: far more than the connection's
		// buffers hold.
		neverReads(t, addr, 100000)
	}
	// Each client is cut once the engine's answer has filled its buffers:
	// counted only for an answer under way, so both requests held a slot.
	// (Not "both slots busy at once": under load the first may be cut
	// before the second reaches the engine.)
	waitFor(t, func() bool {
		return counterValue(t, t.Context(), "http://"+addr, "fleet_router_client_write_timeouts_total", map[string]string{"model": "qwen3-4b"}) == slots
	})
	// The engine itself reports its slots free: the cut cancelled them.
	waitFor(t, func() bool { return busy() == 0 })
	waitFor(t, func() bool { return r.InFlight(b.Name) == 0 })
}

// smallSendBuffers gives each accepted connection an 8 KiB send buffer.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// A client that never reads, with the receive buffer a client has by
// default, is cut within the write timeout even when what the engine has
// sent (here 512 KiB) would fit in the socket buffers the kernel grows on
// its own (up to 4 MiB): the router's send buffer is bounded
// (ClientSendBuffer), so its writes block and the timeout fires. The
// engine sends that much, then waits for the cut (or hangGuard) before it
// ends the answer: cut, it never ends it.
func TestClientThatNeverReadsIsCutBeforeItsAnswerFitsTheBuffers(t *testing.T) {
	ended := make(chan bool, 1) // whether the engine ended its answer
	event := sseEvent(strings.Repeat("token ", 1<<10))
	const events = (512 << 10) / (6 << 10)
	_, b := startBackend(t, "mac/qwen3-4b", 1, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range events {
			if _, err := io.WriteString(w, event); err != nil {
				ended <- false
				return
			}
			w.(http.Flusher).Flush()
		}
		select {
		case <-req.Context().Done():
			ended <- false
		case <-time.After(hangGuard):
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			ended <- true
		}
	})
	r, _ := startRouter(t, Options{WriteTimeout: 300 * time.Millisecond, QueueTimeout: hangGuard}, b)
	addr := serveReal(t, r)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"qwen3-4b","stream":true,"messages":[{"role":"user","content":"tell me everything"}]}`
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	if whole := <-ended; whole {
		t.Fatal("the router took 512 KiB for a client that read none of it and never cut it; it should have been cut at the write timeout")
	}
	waitFor(t, func() bool {
		return counterValue(t, t.Context(), "http://"+addr, "fleet_router_client_write_timeouts_total", map[string]string{"model": "qwen3-4b"}) == 1
	})
}

// The write deadline an answer leaves on its connection does not cut the
// next request on it: a keep-alive connection idle for longer than the
// write timeout between two requests gets both answers, an error reply
// included. (net/http lifts a handler's write deadline after each
// response; this holds the router to it.)
func TestWriteDeadlineDoesNotOutliveItsAnswer(t *testing.T) {
	_, b := startBackend(t, "mac/qwen3-4b", 2, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a", "b", "c"} {
			_, _ = io.WriteString(w, sseEvent(tok))
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	const timeout = 200 * time.Millisecond
	r, _ := startRouter(t, Options{WriteTimeout: timeout}, b)
	conn, err := net.Dial("tcp", serveReal(t, r))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(hangGuard))
	rd := bufio.NewReader(conn)
	for i, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"model":"qwen3-4b","stream":true}`, 200, "[DONE]"},
		{`{"model":"qwen3-4b","stream":true}`, 200, "[DONE]"},
		{`{"model":"no-such-model"}`, 404, "GET /v1/models"},
		{`{"model":"qwen3-4b","stream":true}`, 200, "[DONE]"},
	} {
		if i > 0 {
			time.Sleep(3 * timeout) // past the deadline the last answer left
		}
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(tc.body), tc.body)
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("request %d on the kept-alive connection: %v", i+1, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || !strings.Contains(string(got), tc.want) {
			t.Fatalf("request %d on the kept-alive connection: status %d, err %v, body %q; want %d with %q", i+1, resp.StatusCode, err, got, tc.status, tc.want)
		}
	}
}

// deadlineRecorder is a flushRecorder that records the write deadlines set
// on it.
type deadlineRecorder struct {
	flushRecorder
	deadlines []time.Time
}

func (w *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	w.deadlines = append(w.deadlines, t)
	return nil
}

// eventReads gives one event per Read, as an engine that flushes each.
type eventReads struct{ events []string }

func (r *eventReads) Read(p []byte) (int, error) {
	if len(r.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.events[0])
	r.events = r.events[1:]
	return n, nil
}

func (r *eventReads) Close() error { return nil }

// The copy loop flushes every read of a stream, but gives each write a
// deadline of at least the write timeout without setting one before every
// write (a lock and a runtime timer at each read): within a sixteenth of
// the timeout, one deadline serves all of them. Before, 50 reads set 50.
func TestWriteDeadlineIsNotSetAtEveryWrite(t *testing.T) {
	const timeout = time.Hour
	r := mustNew(t, Options{WriteTimeout: timeout})
	events := make([]string, 50)
	for i := range events {
		events[i] = sseEvent(fmt.Sprint("tok", i))
	}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &eventReads{events: events}}
	w := &deadlineRecorder{flushRecorder: flushRecorder{header: http.Header{}}}
	start := time.Now()
	streamErr, clientErr, deadlines := r.copyAnswer(t.Context(), w, http.NewResponseController(w), resp, true)
	if streamErr != nil || clientErr != nil || !deadlines {
		t.Fatalf("copy: stream error %v, client error %v, deadlines %v", streamErr, clientErr, deadlines)
	}
	if len(w.flushes) != len(events) {
		t.Errorf("%d reads left in %d flushes, want one each: none waits for a later one", len(events), len(w.flushes))
	}
	if len(w.deadlines) != 1 {
		t.Fatalf("%d write deadlines set for %d writes within a second, want 1", len(w.deadlines), len(events))
	}
	if d := w.deadlines[0]; d.Before(start.Add(timeout)) || d.After(time.Now().Add(timeout+timeout/16)) {
		t.Errorf("write deadline %v after the start, want between the timeout %v and a sixteenth more", d.Sub(start), timeout)
	}
}
