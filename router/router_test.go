package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fleet"
)

// hangGuard bounds every wait in these tests; nothing should come near it.
const hangGuard = 10 * time.Second

func testModels() []fleet.Model {
	return []fleet.Model{{ID: "qwen3-4b", Aliases: []string{"qwen3"}, Context: 16384}, {ID: "idle-model", Context: 4096}}
}

// startBackend serves h on a real loopback socket and returns its Backend.
func startBackend(t *testing.T, name string, slots int, h http.HandlerFunc) (*httptest.Server, Backend) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, Backend{Name: name, Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: srv.Listener.Addr().String(), Context: 16384, Slots: slots}
}

// mustNew is New for a test whose options are valid.
func mustNew(t testing.TB, opts Options) *Router {
	t.Helper()
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestNewRefusesUnknownPolicy: a mistyped policy is an error that names the
// known ones, not a silent fallback to the default.
func TestNewRefusesUnknownPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy string
		ok     bool
	}{{"", true}, {PolicyFleet, true}, {PolicyRoundRobin, true}, {"fastest", false}, {"Fleet", false}} {
		r, err := New(Options{Policy: tc.policy})
		if tc.ok != (err == nil) || tc.ok != (r != nil) {
			t.Errorf("New(policy %q) = %v, %v; want ok=%v", tc.policy, r, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), PolicyRoundRobin) {
			t.Errorf("New(policy %q) error %q does not list the known policies", tc.policy, err)
		}
	}
}

func startRouter(t *testing.T, opts Options, bs ...Backend) (*Router, *httptest.Server) {
	t.Helper()
	r := mustNew(t, opts)
	r.SetModels(testModels())
	r.SetBackends(bs)
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	return r, srv
}

func okJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`)
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// Errorf, not Fatal: post runs in goroutines too.
		t.Errorf("POST: %v", err)
		return &http.Response{Body: io.NopCloser(strings.NewReader(""))}
	}
	return resp
}

type errorReply struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, resp *http.Response) errorReply {
	t.Helper()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e errorReply
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, raw)
	}
	// The OpenAI shape has all four keys, null or not.
	var generic map[string]map[string]any
	_ = json.Unmarshal(raw, &generic)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := generic["error"][k]; !ok {
			t.Errorf("error body lacks %q: %s", k, raw)
		}
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body without message or type: %s", raw)
	}
	return e
}

func TestErrorShapes(t *testing.T) {
	_, good := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	small := good
	small.Name, small.Context = "small/qwen3-4b", 64
	_, rsrv := startRouter(t, Options{MaxBodyBytes: 1024}, small)
	cases := []struct {
		name       string
		method     string
		path       string
		body       string
		status     int
		code       string
		retryAfter bool
	}{
		{"malformed json", "POST", "/v1/chat/completions", `{"model":`, 400, codeInvalidJSON, false},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, 400, codeInvalidJSON, false},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[]}`, 400, codeMissingModel, false},
		{"model not a string", "POST", "/v1/completions", `{"model":7}`, 400, codeInvalidJSON, false},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-9"}`, 404, codeModelNotFound, false},
		{"body over limit", "POST", "/v1/chat/completions", `{"model":"qwen3-4b","prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, codeBodyTooLarge, false},
		{"known model without worker", "POST", "/v1/embeddings", `{"model":"idle-model","input":"x"}`, 503, codeNoWorker, true},
		{"context too long", "POST", "/v1/chat/completions", `{"model":"qwen3-4b","max_tokens":500,"messages":[]}`, 400, codeContextTooLong, false},
		{"wrong method", "GET", "/v1/chat/completions", ``, 405, codeMethodNotAllows, false},
		{"unknown path", "POST", "/v2/anything", `{}`, 404, "unknown_url", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, rsrv.URL+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := resp.Header.Get("Retry-After"); (got != "") != tc.retryAfter {
				t.Errorf("Retry-After %q, want present=%v", got, tc.retryAfter)
			}
			e := decodeError(t, resp)
			if e.Error.Code == nil || *e.Error.Code != tc.code {
				t.Errorf("code %v, want %q", e.Error.Code, tc.code)
			}
		})
	}
}

func TestModelsList(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	_, rsrv := startRouter(t, Options{}, b)
	resp, err := http.Get(rsrv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
		if d.OwnedBy != "fleet" || d.Object != "model" {
			t.Errorf("card %+v: want object model, owned_by fleet", d)
		}
	}
	if list.Object != "list" || strings.Join(ids, ",") != "qwen3-4b,qwen3,idle-model" {
		t.Errorf("got %q %v", list.Object, ids)
	}
}

func TestBodiesPassThroughUntouched(t *testing.T) {
	var got []byte
	var gotHeader string
	reply := `{"weird":  "spacing" ,"usage":{"completion_tokens":3}}` + "\n"
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		got, _ = io.ReadAll(req.Body)
		gotHeader = req.Header.Get("X-Client")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, reply)
	})
	_, rsrv := startRouter(t, Options{}, b)
	body := `{ "model" : "qwen3", "messages":[{"role":"user","content":"h\u00e9"}], "extra_field": [1,2] }`
	req, _ := http.NewRequest("POST", rsrv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Client", "kept")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Only the alias becomes the name the engine serves; every other byte
	// is the client's.
	if want := strings.Replace(body, `"qwen3"`, `"qwen3-4b"`, 1); string(got) != want {
		t.Errorf("backend got %q, want the client's bytes with the served name %q", got, want)
	}
	if gotHeader != "kept" {
		t.Errorf("client header not forwarded: %q", gotHeader)
	}
	if string(out) != reply {
		t.Errorf("client got %q, want the backend's bytes %q", out, reply)
	}
}

// sseEvent is one streamed chunk as llama-server sends it.
func sseEvent(content string) string {
	return `data: {"choices":[{"index":0,"delta":{"content":"` + content + `"}}],"object":"chat.completion.chunk"}` + "\n\n"
}

func TestStreamingIsNotBuffered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	clientGotFirst := make(chan struct{})
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		_, _ = io.WriteString(w, sseEvent("a"))
		f.Flush()
		// The next chunk only goes once the client has seen the first: a
		// buffering proxy deadlocks here and the hang guard fails the test.
		select {
		case <-clientGotFirst:
		case <-req.Context().Done():
			return
		}
		_, _ = io.WriteString(w, sseEvent("b"))
		_, _ = io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`+"\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	samples := make(chan fleet.Sample, 1)
	r, rsrv := startRouter(t, Options{OnSample: func(s fleet.Sample) { samples <- s }}, b)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b","stream":true,"messages":[]}`)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(first, `"content":"a"`) {
		t.Fatalf("first line %q", first)
	}
	close(clientGotFirst)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), `"content":"b"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest of stream %q", rest)
	}
	select {
	case s := <-samples:
		if s.Kind != "request" || s.Worker != "ultra/qwen3-4b" || s.OutputTokens != 2 || s.E2E <= 0 || s.TTFT <= 0 {
			t.Errorf("sample %+v", s)
		}
	case <-ctx.Done():
		t.Fatal("no sample")
	}
	st := r.Stats()
	if len(st) != 1 || len(st[0].TTFTHistory) != 1 || st[0].InFlight != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	upstreamGone := make(chan struct{})
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sseEvent("a"))
		w.(http.Flusher).Flush()
		<-req.Context().Done()
		close(upstreamGone)
	})
	r, rsrv := startRouter(t, Options{}, b)
	clientCtx, clientCancel := context.WithCancel(ctx)
	resp := post(t, clientCtx, rsrv.URL, `{"model":"qwen3-4b","stream":true}`)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	clientCancel()
	resp.Body.Close()
	select {
	case <-upstreamGone:
	case <-ctx.Done():
		t.Fatal("upstream request still running after the client went away")
	}
	if err := r.WaitIdle(ctx, b.Name); err != nil {
		t.Fatal(err)
	}
}

func TestDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		started <- struct{}{}
		<-release
		okJSON(w, req)
	})
	r, rsrv := startRouter(t, Options{}, b)
	defer close(release)
	inflight := make(chan int, 1)
	go func() {
		resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		inflight <- resp.StatusCode
	}()
	<-started
	r.Drain(b.Name)
	if n := r.InFlight(b.Name); n != 1 {
		t.Fatalf("in flight %d, want 1", n)
	}
	// Draining the last worker: a new request does not reach it, and does
	// not fail either; it waits in the queue for the worker to come back.
	queued := make(chan int, 1)
	go func() {
		resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		queued <- resp.StatusCode
	}()
	waitFor(t, func() bool { return r.queueLen("qwen3-4b") == 1 })
	if !r.Stats()[0].Draining {
		t.Error("stats do not show draining")
	}
	idle := make(chan error, 1)
	go func() { idle <- r.WaitIdle(ctx, b.Name) }()
	release <- struct{}{}
	if got := <-inflight; got != 200 {
		t.Errorf("in-flight request finished with %d, want 200", got)
	}
	if err := <-idle; err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if err := r.WaitIdle(short, b.Name); err != nil {
		t.Errorf("WaitIdle on an idle backend: %v", err)
	}
	select {
	case <-started:
		t.Fatal("a request reached the drained worker")
	default:
	}
	r.Undrain(b.Name)
	<-started
	release <- struct{}{}
	if got := <-queued; got != 200 {
		t.Errorf("the request queued during the drain got %d after undrain, want 200", got)
	}
}

// waitFor polls cond until it holds, failing the test after hangGuard.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within the hang guard")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countingDial counts dials per address, so a test can see whether the
// router still tries a dead backend.
type countingDial struct {
	mu    sync.Mutex
	dials map[string]int
}

func (c *countingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	c.dials[addr]++
	c.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (c *countingDial) count(addr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials[addr]
}

func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestDeadBackendLeavesTheChoice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	cd := &countingDial{dials: map[string]int{}}
	var goodHits atomic.Int32
	_, good := startBackend(t, "max/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		goodHits.Add(1)
		okJSON(w, req)
	})
	dead := Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Addr: deadAddr(t), Context: 16384, Slots: 4, Dial: cd.dial}
	// Round-robin starts with the first backend: the dead one.
	r, rsrv := startRouter(t, Options{Policy: PolicyRoundRobin, Cooldown: time.Hour}, dead, good)
	for i := range 5 {
		resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d, want 200 via retry", i, resp.StatusCode)
		}
	}
	if n := cd.count(dead.Addr); n != 1 {
		t.Errorf("dead backend dialled %d times, want exactly once (then cooled down)", n)
	}
	if goodHits.Load() != 5 {
		t.Errorf("good backend served %d, want 5", goodHits.Load())
	}
	if st := r.Stats(); !st[0].Cooling {
		t.Errorf("dead backend not shown cooling: %+v", st[0])
	}
	// Removed from the ready set: still no traffic, even after cooling.
	r.SetBackends([]Backend{good})
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	resp.Body.Close()
	if n := cd.count(dead.Addr); n != 1 {
		t.Errorf("removed backend dialled again (%d)", n)
	}
}

func TestRetryBeforeFirstByteLandsOnAnotherWorkerOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var badHits, goodHits atomic.Int32
	_, bad := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		badHits.Add(1)
		http.Error(w, `{"error":{"message":"engine dead"}}`, http.StatusInternalServerError)
	})
	_, good := startBackend(t, "max/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		goodHits.Add(1)
		okJSON(w, req)
	})
	_, rsrv := startRouter(t, Options{Policy: PolicyRoundRobin}, bad, good)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"content":"hi"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if badHits.Load() != 1 || goodHits.Load() != 1 {
		t.Errorf("bad %d good %d, want 1 and 1", badHits.Load(), goodHits.Load())
	}
	m, _ := http.Get(rsrv.URL + "/metrics")
	text, _ := io.ReadAll(m.Body)
	m.Body.Close()
	if !strings.Contains(string(text), `fleet_router_retries_total{model="qwen3-4b"} 1`) {
		t.Errorf("retry not counted in /metrics")
	}
}

func TestRetriesStopAtTwoAndNeverRepeatABackend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var hits [4]atomic.Int32
	var bs []Backend
	for i := range 4 {
		_, b := startBackend(t, fmt.Sprintf("n%d/qwen3-4b", i), 4, func(w http.ResponseWriter, req *http.Request) {
			hits[i].Add(1)
			w.WriteHeader(http.StatusBadGateway)
		})
		bs = append(bs, b)
	}
	_, rsrv := startRouter(t, Options{Policy: PolicyRoundRobin}, bs...)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502 after the retries", resp.StatusCode)
	}
	decodeError(t, resp)
	total := 0
	for i := range hits {
		if h := hits[i].Load(); h > 1 {
			t.Errorf("backend %d tried %d times", i, h)
		}
		total += int(hits[i].Load())
	}
	if total != 3 {
		t.Errorf("%d attempts, want 3 (one try and two retries)", total)
	}
}

// abortAfterFirstChunk sends one SSE event then drops the connection
// without ending the chunked body: a worker dying mid-stream.
func abortAfterFirstChunk(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, sseEvent("a"))
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

func TestMidStreamFailureSendsSSEError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(abortAfterFirstChunk))
	srv.Config.ErrorLog = nil
	srv.Start()
	t.Cleanup(srv.Close)
	b := Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Addr: srv.Listener.Addr().String(), Context: 16384, Slots: 4}
	_, rsrv := startRouter(t, Options{}, b)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b","stream":true}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if len(events) != 2 || !strings.Contains(events[0], `"content":"a"`) {
		t.Fatalf("events %q", events)
	}
	payload, ok := strings.CutPrefix(events[1], "data: ")
	if !ok {
		t.Fatalf("last event %q is not a data event", events[1])
	}
	var e errorReply
	if err := json.Unmarshal([]byte(payload), &e); err != nil || e.Error.Message == "" || e.Error.Type != errTypeServer {
		t.Errorf("error event %q: %v", payload, err)
	}
}

func TestQueueTimeoutGives429(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	_, b := startBackend(t, "ultra/qwen3-4b", 1, func(w http.ResponseWriter, req *http.Request) {
		started <- struct{}{}
		select {
		case <-release:
		case <-req.Context().Done():
		}
		okJSON(w, req)
	})
	_, rsrv := startRouter(t, Options{QueueTimeout: 20 * time.Millisecond}, b)
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		resp, err := http.Post(rsrv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"qwen3-4b"}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	defer func() { close(release); <-firstDone }()
	<-started
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("status %d, want 429", resp.StatusCode)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if e := decodeError(t, resp); *e.Error.Code != codeQueueTimeout {
		t.Errorf("code %q", *e.Error.Code)
	}
}

func TestQueuedRequestGetsTheFreedSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	started := make(chan struct{}, 2)
	release := make(chan struct{}, 2)
	var maxConc, conc atomic.Int32
	_, b := startBackend(t, "ultra/qwen3-4b", 1, func(w http.ResponseWriter, req *http.Request) {
		n := conc.Add(1)
		if n > maxConc.Load() {
			maxConc.Store(n)
		}
		started <- struct{}{}
		<-release
		conc.Add(-1)
		okJSON(w, req)
	})
	r, rsrv := startRouter(t, Options{}, b)
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	<-started
	// One runs, one waits in the router's queue.
	for r.queueLen("qwen3-4b") != 1 {
		select {
		case <-ctx.Done():
			t.Fatal("second request never queued")
		case <-time.After(time.Millisecond):
		}
	}
	release <- struct{}{}
	<-started
	release <- struct{}{}
	for range 2 {
		if c := <-codes; c != 200 {
			t.Errorf("status %d", c)
		}
	}
	if maxConc.Load() != 1 {
		t.Errorf("backend with 1 slot saw %d concurrent requests", maxConc.Load())
	}
}

func (r *Router) queueLen(model string) int {
	r.sched.mu.Lock()
	defer r.sched.mu.Unlock()
	if q := r.sched.queues[model]; q != nil {
		return q.Len()
	}
	return 0
}

func TestCooledDownWorkerGetsNoTrafficUntilProbePasses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var healthy atomic.Bool
	var flakyHits, probes atomic.Int32
	_, flaky := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/health" {
			probes.Add(1)
			if !healthy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, `{"status":"ok"}`)
			return
		}
		flakyHits.Add(1)
		if !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		okJSON(w, req)
	})
	_, good := startBackend(t, "max/qwen3-4b", 4, okJSON)
	r, rsrv := startRouter(t, Options{Policy: PolicyRoundRobin, FailureThreshold: 2, Cooldown: time.Millisecond}, flaky, good)
	send := func() {
		resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	for range 6 {
		send()
	}
	if got := flakyHits.Load(); got != 2 {
		t.Fatalf("flaky backend got %d requests, want 2 (then cooled down)", got)
	}
	// The hub hands over the same ready set whenever any worker changes
	// state; that must not lift the cooldown.
	r.SetBackends([]Backend{flaky, good})
	// Probes fail while it is unhealthy: still no traffic.
	for probes.Load() < 2 {
		send()
		if ctx.Err() != nil {
			t.Fatal("no probes")
		}
	}
	if got := flakyHits.Load(); got != 2 {
		t.Errorf("cooled-down backend got traffic before passing a probe: %d", got)
	}
	healthy.Store(true)
	for flakyHits.Load() == 2 {
		send()
		if ctx.Err() != nil {
			t.Fatal("backend never came back after a passing probe")
		}
		time.Sleep(time.Millisecond)
	}
	if st := r.Stats(); st[0].Cooling {
		t.Errorf("still cooling after the probe passed")
	}
}

func TestConnectionsCappedAtSlotsPlusExtra(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var open, peak atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(okJSON))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			if n := open.Add(1); n > peak.Load() {
				peak.Store(n)
			}
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	b := Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Addr: srv.Listener.Addr().String(), Context: 16384, Slots: 2}
	_, rsrv := startRouter(t, Options{ExtraConns: 1}, b)
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	if p := peak.Load(); p > 3 {
		t.Errorf("router opened %d connections to a 2-slot backend, cap is 3", p)
	}
}

type keys map[string]string

func (k keys) VerifyAPIKey(_ context.Context, key string) (string, bool, error) {
	if key == "boom" {
		return "", false, errors.New("store down")
	}
	name, ok := k[key]
	return name, ok, nil
}

func TestAPIKeys(t *testing.T) {
	var sawAuth atomic.Value
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		sawAuth.Store(req.Header.Get("Authorization"))
		okJSON(w, req)
	})
	_, rsrv := startRouter(t, Options{Keys: keys{"sk-good": "alice"}}, b)
	cases := []struct {
		name, auth string
		status     int
	}{
		{"no key", "", 401},
		{"wrong key", "Bearer sk-bad", 401},
		{"not bearer", "Basic sk-good", 401},
		{"verifier error", "Bearer boom", 500},
		{"good key", "Bearer sk-good", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", rsrv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"qwen3-4b"}`))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status != 200 {
				e := decodeError(t, resp)
				if tc.status == 401 && (e.Error.Code == nil || *e.Error.Code != codeInvalidAPIKey) {
					t.Errorf("code %v", e.Error.Code)
				}
				return
			}
			resp.Body.Close()
		})
	}
	if a, _ := sawAuth.Load().(string); a != "" {
		t.Errorf("router forwarded its own API key to the engine: %q", a)
	}
	// A router without keys answers a request that sent one, and says the
	// key was not checked; one that sent none is told nothing.
	_, open := startRouter(t, Options{}, b)
	for _, auth := range []string{"Bearer sk-bad", ""} {
		req, _ := http.NewRequest("POST", open.URL+"/v1/chat/completions", strings.NewReader(`{"model":"qwen3-4b"}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get(HeaderKeyNotChecked); resp.StatusCode != 200 || (got != "") != (auth != "") {
			t.Errorf("a router without keys, Authorization %q: %d, %s %q", auth, resp.StatusCode, HeaderKeyNotChecked, got)
		}
	}
	m, _ := http.Get(rsrv.URL + "/metrics")
	text, _ := io.ReadAll(m.Body)
	m.Body.Close()
	// /metrics answers without a key: it must not tell who holds one.
	if bytes.Contains(text, []byte("alice")) {
		t.Errorf("/metrics names the API key \"alice\":\n%s", text)
	}
}

func TestHealthz(t *testing.T) {
	_, rsrv := startRouter(t, Options{})
	resp, err := http.Get(rsrv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

// TestHealthzAsksTheHub: with Options.Health, /healthz answers what the hub
// says (a hub of several: its role, or 503 when it cannot route).
func TestHealthzAsksTheHub(t *testing.T) {
	_, rsrv := startRouter(t, Options{Health: func() (int, []byte) {
		return http.StatusServiceUnavailable, []byte(`{"status":"cannot route","role":"follower"}`)
	}})
	resp, err := http.Get(rsrv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || string(body) != `{"status":"cannot route","role":"follower"}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("/healthz: %d %s %q", resp.StatusCode, body, resp.Header.Get("Content-Type"))
	}
}

func TestSetBackendsUsesTheNewDial(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	first, second := &countingDial{dials: map[string]int{}}, &countingDial{dials: map[string]int{}}
	b.Dial = first.dial
	r, rsrv := startRouter(t, Options{}, b)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	resp.Body.Close()
	// The tunnel was re-established: new connections go through the new one.
	b.Dial = second.dial
	r.SetBackends([]Backend{b})
	r.pool.mu.Lock()
	r.pool.backends[0].transport.CloseIdleConnections()
	r.pool.mu.Unlock()
	resp = post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	resp.Body.Close()
	if first.count(b.Addr) != 1 || second.count(b.Addr) != 1 {
		t.Errorf("dials: first %d, second %d; want 1 and 1", first.count(b.Addr), second.count(b.Addr))
	}
}

// A client's Accept-Encoding does not reach the engine: an engine that
// honoured it would answer in gzip, which the meter cannot read, and the
// answer would escape usage counting and the key's token limit.
func TestClientAcceptEncodingNotForwarded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	seen := make(chan string, 1)
	_, b := startBackend(t, "ultra/qwen3-4b", 1, func(w http.ResponseWriter, req *http.Request) {
		seen <- req.Header.Get("Accept-Encoding")
		okJSON(w, req)
	})
	_, rsrv := startRouter(t, Options{}, b)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rsrv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"qwen3-4b"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip, br")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := <-seen; got != "" {
		t.Errorf("the engine was sent Accept-Encoding %q; want none, so it answers in a form the meter reads", got)
	}
}
