package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"fleet/router/reasoning"
)

// The upstream path of a request is a chain of http.RoundTrippers, each
// doing one job on the request on its way out and on the response on its
// way back, ahead of forward's one copy loop (see upstream in proxy.go):
//
//	hopTransport       hop-by-hop headers, both ways
//	anthropicRepairTransport  Anthropic streams the official SDKs accept
//	modelNameTransport the engine's served name out, the client's name back
//	normaliseTransport reasoning in the model's one shape
//	meterTransport     tokens, times and usage as the answer goes by
//	(hedged)           the first-byte hedge, then the worker's connection
//	                   pool (engineconn.go)
//
// A piece that rewrites a stream wraps the body in a rewrittenStream, which
// reads the upstream once per Read: an event leaves in the flush of the
// read that brought it. NormalisingTransport is the normalise piece alone,
// for checks that talk to one worker as a router's client would.

// NormalisingTransport wraps base so that chat completion answers come back
// rewritten to mode, exactly as the router rewrites them for clients. Checks
// that talk to one worker directly (the shape diff) use it to see the shape
// a client of the router gets.
func NormalisingTransport(base http.RoundTripper, mode reasoning.Mode) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if mode == reasoning.Off {
		return base
	}
	return &normaliseTransport{next: base, mode: mode}
}

// hopTransport strips the hop-by-hop headers (hop.go) from the request and
// the response.
type hopTransport struct{ next http.RoundTripper }

func (t *hopTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if hasHopHeaders(req.Header) {
		req = withHeader(req, req.Header.Clone())
		removeHopHeaders(req.Header)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	removeHopHeaders(resp.Header)
	return resp, nil
}

// modelNameTransport sends the engine the name it serves and gives the
// client back the name it asked for, in the body or every streamed chunk
// (modelname.go).
type modelNameTransport struct {
	next http.RoundTripper
	// served is the quoted name the engine answers to, asked the one the
	// client gets back.
	served, asked []byte
}

func newModelNameTransport(next http.RoundTripper, served, asked string) *modelNameTransport {
	return &modelNameTransport{next: next, served: quoteJSON(served), asked: quoteJSON(asked)}
}

func (t *modelNameTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := requestBody(req)
	if err != nil {
		return nil, err
	}
	req = withBody(req, withModel(body, t.served))
	// The answer is read to be rewritten, so it must come plain.
	req.Header.Del("Accept-Encoding")
	resp, err := t.next.RoundTrip(req)
	if err != nil || !rewritable(resp) {
		return resp, err
	}
	if isEventStream(resp.Header.Get("Content-Type")) {
		streamThrough(resp, &sseModelRewriter{quoted: t.asked})
		return resp, nil
	}
	raw, rest, err := readWhole(resp)
	if err != nil {
		return nil, err
	}
	if rest != nil {
		// Too large to hold: it passes as the engine sent it.
		resp.Body = rest
		return resp, nil
	}
	setBody(resp, withAnswerModel(raw, t.asked))
	return resp, nil
}

// normaliseTransport rewrites chat completion answers to mode (normalise.go).
type normaliseTransport struct {
	next http.RoundTripper
	mode reasoning.Mode
	// log, when set, hears of answers passed through unnormalised, from
	// the worker named backend.
	log     *slog.Logger
	backend string
}

func (t *normaliseTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.mode == reasoning.Off || !strings.HasSuffix(req.URL.Path, chatPath) {
		return t.next.RoundTrip(req)
	}
	req = withHeader(req, req.Header.Clone())
	req.Header.Del("Accept-Encoding") // the answer is read, so it must come plain
	resp, err := t.next.RoundTrip(req)
	if err != nil || !rewritable(resp) {
		return resp, err
	}
	if isEventStream(resp.Header.Get("Content-Type")) {
		streamThrough(resp, newSSENormaliser(t.mode))
		return resp, nil
	}
	raw, rest, err := readWhole(resp)
	if err != nil {
		return nil, err
	}
	if rest != nil {
		t.warn("answer passed through without normalisation",
			fmt.Errorf("%w (%d bytes)", errBodyOverLimit, maxRewriteBody))
		resp.Body = rest
		return resp, nil
	}
	out, err := reasoning.RewriteJSON(raw, t.mode)
	if err != nil {
		t.warn("answer passed through without reasoning normalisation", err)
		out = raw
	}
	setBody(resp, out)
	return resp, nil
}

func (t *normaliseTransport) warn(msg string, err error) {
	if t.log != nil {
		t.log.Warn(msg, "backend", t.backend, "err", err)
	}
}

// meterTransport feeds every read of the answer to a meter: no copy, and
// the time of each read as the router saw it.
type meterTransport struct {
	next http.RoundTripper
	m    *meter
	body meteredBody
}

func (t *meterTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	t.m.sse = isEventStream(resp.Header.Get("Content-Type"))
	t.body = meteredBody{ReadCloser: resp.Body, m: t.m}
	resp.Body = &t.body
	return resp, nil
}

type meteredBody struct {
	io.ReadCloser
	m *meter
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.m.feed(p[:n], time.Now())
	}
	return n, err
}

// streamRewriter changes a stream as it goes by: feed takes one read and
// returns what to send now, finish what is left at the end; each result is
// valid until the next call.
type streamRewriter interface {
	feed(p []byte) []byte
	finish() []byte
}

// streamThrough makes resp's body come through rw.
func streamThrough(resp *http.Response, rw streamRewriter) {
	resp.Body = &rewrittenStream{src: resp.Body, rw: rw}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}

// rewrittenStream reads a body through a streamRewriter. Each Read reads
// the source at most once, into the caller's buffer, so one read of the
// upstream is one read of the chain.
type rewrittenStream struct {
	src io.ReadCloser
	rw  streamRewriter
	// pending is rewritten output not yet returned (the rewriter's buffer).
	pending []byte
	err     error
	done    bool
}

func (s *rewrittenStream) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		switch {
		case s.done:
			return 0, io.EOF
		case s.err == io.EOF:
			s.done = true
			s.pending = s.rw.finish()
			continue
		case s.err != nil:
			return 0, s.err
		}
		n, err := s.src.Read(p)
		s.err = err
		if n > 0 {
			s.pending = s.rw.feed(p[:n])
		}
		if n == 0 && err == nil {
			return 0, nil
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

func (s *rewrittenStream) Close() error { return s.src.Close() }

// readWhole reads a non-streamed answer to rewrite it. When it is over
// maxRewriteBody, rest is the whole body still to send, read part first.
func readWhole(resp *http.Response) (raw []byte, rest io.ReadCloser, err error) {
	raw, err = readForRewrite(resp.Body)
	if err != nil {
		resp.Body.Close()
		return nil, nil, fmt.Errorf("reading the answer to rewrite it: %w", err)
	}
	if len(raw) > maxRewriteBody {
		return raw, readCloser{io.MultiReader(bytes.NewReader(raw), resp.Body), resp.Body}, nil
	}
	resp.Body.Close()
	return raw, nil, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// setBody makes body the whole of resp's body.
func setBody(resp *http.Response, body []byte) {
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
}

// requestBody reads the whole body of req.
func requestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	var buf bytes.Buffer
	if req.ContentLength > 0 {
		buf.Grow(int(req.ContentLength))
	}
	_, err := buf.ReadFrom(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the request to rewrite it: %w", err)
	}
	return buf.Bytes(), nil
}

// withBody is a shallow copy of req sending body instead, with its own
// header (RoundTrippers must not change the request they were given). The
// body stays a NopCloser'd bytes.Reader, which net/http knows is in memory
// and so sends in one write with the headers.
func withBody(req *http.Request, body []byte) *http.Request {
	out := withHeader(req, req.Header.Clone())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return out
}

// withHeader is a shallow copy of req with h as its header.
func withHeader(req *http.Request, h http.Header) *http.Request {
	out := *req
	out.Header = h
	return &out
}

// errBodyOverLimit is why an over-large answer passed through unrewritten.
var errBodyOverLimit = errors.New("answer larger than the router rewrites")
