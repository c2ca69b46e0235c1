package router

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"fleet/router/reasoning"
)

// The upstream pieces (transport.go), each alone against a fake next
// RoundTripper: what it sends on, and what it hands back.

// engine is a fake next hop answering with status, content type and body
// (as reads of the given pieces), recording the request it got.
type engine struct {
	status int
	ctype  string
	header http.Header
	reads  []string
	err    error // returned after the reads
	got    *http.Request
	body   []byte // the request body it got
}

func (e *engine) RoundTrip(req *http.Request) (*http.Response, error) {
	e.got = req
	if req.Body != nil {
		e.body, _ = io.ReadAll(req.Body)
	}
	h := http.Header{}
	for k, v := range e.header {
		h[k] = v
	}
	if e.ctype != "" {
		h.Set("Content-Type", e.ctype)
	}
	status := e.status
	if status == 0 {
		status = 200
	}
	return &http.Response{StatusCode: status, Header: h, Body: &piecesBody{reads: slices.Clone(e.reads), err: e.err}, ContentLength: -1, Request: req}, nil
}

// piecesBody returns one piece per Read (the rest of it on the next when p
// is short), then err (io.EOF when nil), and counts its reads.
type piecesBody struct {
	reads  []string
	err    error
	n      int
	closed bool
}

func (b *piecesBody) Read(p []byte) (int, error) {
	if b.n < len(b.reads) {
		n := copy(p, b.reads[b.n])
		if b.reads[b.n] = b.reads[b.n][n:]; b.reads[b.n] == "" {
			b.n++
		}
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return 0, io.EOF
}

func (b *piecesBody) Close() error { b.closed = true; return nil }

func chatRequest(t *testing.T, path, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://engine"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	return req
}

// readAll reads resp's body a Read at a time and returns what each gave.
func readAll(t *testing.T, body io.Reader) []string {
	t.Helper()
	var out []string
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			out = append(out, string(buf[:n]))
		}
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	}
}

func TestHopTransport(t *testing.T) {
	for _, tc := range []struct {
		name       string
		reqHeader  http.Header
		respHeader http.Header
		wantSent   http.Header // what must reach the engine (absent: "")
		wantBack   http.Header
	}{
		{
			name:      "none: the request passes as it is",
			reqHeader: http.Header{"X-Kept": {"yes"}},
			wantSent:  http.Header{"X-Kept": {"yes"}},
		},
		{
			name:      "fixed and Connection-named headers go, both ways",
			reqHeader: http.Header{"Connection": {"X-Hop, keep-alive"}, "X-Hop": {"secret"}, "Keep-Alive": {"timeout=5"}, "Te": {"trailers"}, "X-Kept": {"yes"}},
			wantSent:  http.Header{"Connection": {""}, "X-Hop": {""}, "Keep-Alive": {""}, "Te": {""}, "X-Kept": {"yes"}},
			respHeader: http.Header{"Connection": {"X-Engine-Hop"}, "X-Engine-Hop": {"secret"}, "Proxy-Authenticate": {"x"},
				"X-Engine-Kept": {"yes"}},
			wantBack: http.Header{"X-Engine-Hop": {""}, "Connection": {""}, "Proxy-Authenticate": {""}, "X-Engine-Kept": {"yes"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &engine{header: tc.respHeader, ctype: "application/json", reads: []string{"{}"}}
			req := chatRequest(t, chatPath, "{}")
			for k, v := range tc.reqHeader {
				req.Header[k] = v
			}
			before := req.Header.Clone()
			resp, err := (&hopTransport{next: e}).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.wantSent {
				if got := e.got.Header.Get(k); got != v[0] {
					t.Errorf("engine got %s=%q, want %q", k, got, v[0])
				}
			}
			for k, v := range tc.wantBack {
				if got := resp.Header.Get(k); got != v[0] {
					t.Errorf("client gets %s=%q, want %q", k, got, v[0])
				}
			}
			if len(req.Header) != len(before) {
				t.Errorf("the caller's request header changed: %v, was %v", req.Header, before)
			}
		})
	}
}

func TestModelNameTransport(t *testing.T) {
	const asked, served = "qwen", "Qwen/Qwen3-4B"
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		reads  []string
		want   string
	}{
		{
			name:  "non-streamed: the client's name comes back",
			ctype: "application/json",
			reads: []string{`{"id":"x","model":"Qwen/Qwen3-4B",`, `"choices":[]}`},
			want:  `{"id":"x","model":"qwen","choices":[]}`,
		},
		{
			name:  "streamed: every chunk, across reads",
			ctype: "text/event-stream",
			reads: []string{`data: {"model":"Qwen/Qw`, `en3-4B","choices":[]}` + "\n\n" + `data: {"model":"Qwen/Qwen3-4B"}` + "\n\n", "data: [DONE]\n\n"},
			want:  `data: {"model":"qwen","choices":[]}` + "\n\n" + `data: {"model":"qwen"}` + "\n\n" + "data: [DONE]\n\n",
		},
		{
			name:   "an error passes as the engine wrote it",
			status: 404,
			ctype:  "application/json",
			reads:  []string{`{"error":{"message":"The model Qwen/Qwen3-4B does not exist"},"model":"Qwen/Qwen3-4B"}`},
			want:   `{"error":{"message":"The model Qwen/Qwen3-4B does not exist"},"model":"Qwen/Qwen3-4B"}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &engine{status: tc.status, ctype: tc.ctype, reads: tc.reads}
			req := chatRequest(t, chatPath, `{"model":"qwen","messages":[{"role":"user","content":"model"}]}`)
			resp, err := newModelNameTransport(e, served, asked).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if want := `{"model":"Qwen/Qwen3-4B","messages":[{"role":"user","content":"model"}]}`; string(e.body) != want {
				t.Errorf("engine got %s, want %s", e.body, want)
			}
			if e.got.Header.Get("Accept-Encoding") != "" {
				t.Error("the engine was allowed to compress an answer the router reads")
			}
			if req.Header.Get("Accept-Encoding") == "" {
				t.Error("the caller's request was changed")
			}
			if got := strings.Join(readAll(t, resp.Body), ""); got != tc.want {
				t.Errorf("client got %s\nwant %s", got, tc.want)
			}
			if cl := resp.Header.Get("Content-Length"); tc.ctype == "application/json" && tc.status == 0 && cl != strconv.Itoa(len(tc.want)) {
				t.Errorf("Content-Length %q, want %d", cl, len(tc.want))
			}
		})
	}
}

func TestNormaliseTransport(t *testing.T) {
	const inlined = `{"choices":[{"finish_reason":"stop","index":0,"message":{"content":"<think>\n17×23\n</think>\n\n391.","role":"assistant"}}],"usage":{"completion_tokens":9}}`
	big := `{"choices":[{"message":{"content":"` + strings.Repeat("x", maxRewriteBody) + `"}}]}`
	for _, tc := range []struct {
		name     string
		path     string
		ctype    string
		encoding string
		reads    []string
		want     string
		wantGzip bool // Accept-Encoding left for the engine
	}{
		{name: "non-streamed: rewritten", path: chatPath, ctype: "application/json", reads: []string{llamaAnswer[:20], llamaAnswer[20:]}, want: inlined},
		{name: "not chat: untouched", path: "/v1/completions", ctype: "application/json", reads: []string{llamaAnswer}, want: llamaAnswer, wantGzip: true},
		{name: "not JSON: passes as it came", path: chatPath, ctype: "application/json", reads: []string{"{oops"}, want: "{oops"},
		{name: "compressed despite the ask: not ours to decode", path: chatPath, ctype: "application/json", encoding: "gzip", reads: []string{"\x1f\x8b..."}, want: "\x1f\x8b..."},
		{
			name: "streamed: rewritten", path: chatPath, ctype: "text/event-stream",
			reads: []string{`data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}` + "\n\n"},
			want:  `data: {"choices":[{"delta":{"content":"<think>\nhmm"},"finish_reason":null,"index":0}]}` + "\n\n",
		},
		// Over the limit the answer passes whole: the transport once sent
		// only the part it had read.
		{name: "over the limit: passes whole", path: chatPath, ctype: "application/json", reads: []string{big[:1<<20], big[1<<20:]}, want: big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.encoding != "" {
				h.Set("Content-Encoding", tc.encoding)
			}
			e := &engine{ctype: tc.ctype, header: h, reads: tc.reads}
			resp, err := NormalisingTransport(e, reasoning.Inline).RoundTrip(chatRequest(t, tc.path, `{}`))
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(readAll(t, resp.Body), "")
			if got != tc.want {
				t.Errorf("client got %d bytes %.200q\nwant %d bytes %.200q", len(got), got, len(tc.want), tc.want)
			}
			if (e.got.Header.Get("Accept-Encoding") != "") != tc.wantGzip {
				t.Errorf("Accept-Encoding sent: %q", e.got.Header.Get("Accept-Encoding"))
			}
			if cl := resp.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(tc.want)) {
				t.Errorf("Content-Length %s for %d bytes", cl, len(tc.want))
			}
		})
	}
}

// A failure reading an answer held for rewriting is the round trip's
// error: nothing reached the client, so another worker may answer.
func TestNormaliseTransportReadFailure(t *testing.T) {
	broken := errors.New("connection reset")
	e := &engine{ctype: "application/json", reads: []string{`{"choices":[`}, err: broken}
	resp, err := NormalisingTransport(e, reasoning.Inline).RoundTrip(chatRequest(t, chatPath, `{}`))
	if !errors.Is(err, broken) || resp != nil {
		t.Fatalf("got %v, %v; want the read error", resp, err)
	}
}

func TestMeterTransport(t *testing.T) {
	stream := sseEvent("a") + sseEvent("b") + `data: {"choices":[],"usage":{"completion_tokens":2}}` + "\n\n"
	for _, tc := range []struct {
		name       string
		ctype      string
		reads      []string
		wantSSE    bool
		wantTokens int
	}{
		{name: "stream", ctype: "text/event-stream; charset=utf-8", reads: []string{stream[:10], stream[10:]}, wantSSE: true, wantTokens: 2},
		{name: "body", ctype: "application/json", reads: []string{`{"choices":[],`, `"usage":{"completion_tokens":7}}`}, wantTokens: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMeter(false)
			resp, err := (&meterTransport{next: &engine{ctype: tc.ctype, reads: tc.reads}, m: m}).RoundTrip(chatRequest(t, chatPath, `{}`))
			if err != nil {
				t.Fatal(err)
			}
			got := readAll(t, resp.Body)
			if strings.Join(got, "") != strings.Join(tc.reads, "") || len(got) != len(tc.reads) {
				t.Errorf("the meter changed the reads: %q", got)
			}
			if m.sse != tc.wantSSE || m.outputTokens() != tc.wantTokens || m.firstRead.IsZero() {
				t.Errorf("sse %v tokens %d first read %v; want %v %d and a time", m.sse, m.outputTokens(), m.firstRead, tc.wantSSE, tc.wantTokens)
			}
		})
	}
}

// upperLines is a streamRewriter that upper-cases whole lines, holding a
// cut one, and says "end" at the finish.
type upperLines struct{ sseLines }

func (u *upperLines) feed(p []byte) []byte { return u.sseLines.feed(p, u) }
func (u *upperLines) finish() []byte {
	return append(u.sseLines.finish(u, true), "END\n"...)
}
func (u *upperLines) emitLine(line []byte) { u.out = append(u.out, bytes.ToUpper(line)...) }

// A rewritten stream reads its source once per Read, so what one upstream
// read brought leaves in one flush of the copy loop; a source error comes
// after what was read before it.
func TestRewrittenStreamOneReadPerRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reads   []string
		err     error
		want    []string
		wantErr error
	}{
		{name: "two events in one read leave together", reads: []string{"a\nb\n", "c\n"}, want: []string{"A\nB\n", "C\n", "END\n"}},
		{name: "a cut line waits for its end, no longer", reads: []string{"a\nb", "c\n"}, want: []string{"A\n", "BC\n", "END\n"}},
		{name: "an unended last line at the finish", reads: []string{"a\nb"}, want: []string{"A\n", "B\nEND\n"}},
		{name: "an error after the data", reads: []string{"a\n"}, err: errors.New("reset"), want: []string{"A\n"}, wantErr: errors.New("reset")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &piecesBody{reads: tc.reads, err: tc.err}
			s := &rewrittenStream{src: src, rw: &upperLines{}}
			var got []string
			buf := make([]byte, 64)
			var err error
			for {
				var n int
				before := src.n
				n, err = s.Read(buf)
				if src.n-before > 1 {
					t.Errorf("one Read took %d source reads", src.n-before)
				}
				if n > 0 {
					got = append(got, string(buf[:n]))
				}
				if err != nil {
					break
				}
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("reads %q, want %q", got, tc.want)
			}
			if tc.wantErr == nil && err != io.EOF || tc.wantErr != nil && (err == nil || err.Error() != tc.wantErr.Error()) {
				t.Errorf("ended with %v, want %v", err, tc.wantErr)
			}
			_ = s.Close()
			if !src.closed {
				t.Error("Close did not reach the source")
			}
		})
	}
}

// The chain as the router builds it, metering what the engine sent while
// the client gets the rewritten stream.
func TestUpstreamChainOrder(t *testing.T) {
	m := newMeter(false)
	e := &engine{ctype: "text/event-stream", header: http.Header{"Connection": {"X-Hop"}, "X-Hop": {"1"}},
		reads: []string{`data: {"model":"served","choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}` + "\n\n"}}
	var rt http.RoundTripper = &meterTransport{next: e, m: m}
	rt = &normaliseTransport{next: rt, mode: reasoning.Inline}
	rt = newModelNameTransport(rt, "served", "asked")
	rt = &hopTransport{next: rt}
	start := time.Now()
	resp, err := rt.RoundTrip(chatRequest(t, chatPath, `{"model":"asked"}`))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(readAll(t, resp.Body), "")
	if !strings.Contains(got, `"model":"asked"`) || !strings.Contains(got, `<think>\nhmm`) || resp.Header.Get("X-Hop") != "" {
		t.Errorf("client got %s with header %v", got, resp.Header)
	}
	if m.firstToken.Before(start) || m.events != 1 {
		t.Errorf("meter: %d events, first token %v", m.events, m.firstToken)
	}
}
