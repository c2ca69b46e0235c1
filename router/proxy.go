package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"fleet"
	"fleet/router/reasoning"
)

// streamReadBytes is the most one read of a worker's answer brings, in the
// copy loop and below it in the worker's transport.
const streamReadBytes = 32 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, streamReadBytes); return &b }}

func (r *Router) serveModels(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, errTypeInvalidRequest, codeMethodNotAllows, "", "use GET /v1/models", 0)
		return
	}
	if _, err := r.authorize(w, req); err != nil {
		r.answer(w, err)
		return
	}
	type card struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	models := r.catalog.list()
	data := make([]card, 0, len(models))
	seen := map[string]bool{}
	addCard := func(id string) {
		if !seen[id] {
			seen[id] = true
			data = append(data, card{ID: id, Object: "model", OwnedBy: "fleet"})
		}
	}
	for _, m := range models {
		addCard(m.ID)
		for _, a := range m.Aliases {
			addCard(a)
		}
	}
	for _, m := range r.pool.models() {
		addCard(m)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{"list", data})
}

// refusedPeekBytes bounds what is read of a refused request's body to find
// the model it names: a client without a key gets no more of the router's
// memory or time than that.
const refusedPeekBytes = 64 << 10

// refusedModel is the metric label of a request refused before its body was
// read: the model it names, when the fleet serves it and the name is in the
// body's first refusedPeekBytes (read within the body deadline), else
// unknownModel, so refusals cannot grow the series.
func (r *Router) refusedModel(w http.ResponseWriter, req *http.Request) string {
	if req.Method != http.MethodPost || req.Body == nil {
		return unknownModel
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(r.opts.BodyTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	name := namedModel(io.LimitReader(req.Body, refusedPeekBytes))
	if id, ok := r.modelID(name); ok && name != "" {
		return id
	}
	return unknownModel
}

// namedModel is the top-level "model" string of the JSON object body
// starts with, "" when it names none before it ends. It skips the other
// fields without keeping them.
func namedModel(body io.Reader) string {
	dec := json.NewDecoder(body)
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return ""
		}
		if k == "model" {
			var m string
			if dec.Decode(&m) != nil {
				return ""
			}
			return m
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !equalFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

func equalFold(a, b string) bool { return bytes.EqualFold([]byte(a), []byte(b)) }

// upstream is the chain of round trippers (transport.go) that one attempt
// of c goes through to f's worker; m meters the answer as the engine sent
// it, before any rewrite. The pieces of one attempt are allocated at once.
func (r *Router) upstream(f *flight, c *call, m *meter) http.RoundTripper {
	p := &struct {
		hop    hopTransport
		repair anthropicRepairTransport
		name   modelNameTransport
		norm   normaliseTransport
		meter  meterTransport
		hedged hedgedTransport
	}{}
	p.hedged = hedgedTransport{r: r, f: f, c: c}
	p.meter = meterTransport{next: &p.hedged, m: m}
	var rt http.RoundTripper = &p.meter
	if c.mode != reasoning.Off {
		p.norm = normaliseTransport{next: rt, mode: c.mode, log: r.log, backend: f.b.cfg.Name}
		rt = &p.norm
	}
	// The engine gets the name it serves; the client gets back the name it
	// asked for (see modelname.go).
	if served := f.b.cfg.servedName(); served != c.info.Model {
		p.name = modelNameTransport{next: rt, served: quoteJSON(served), asked: quoteJSON(c.info.Model)}
		rt = &p.name
	}
	// Anthropic streams get the structure the official SDKs require
	// (anthropicrepair.go).
	p.repair = anthropicRepairTransport{next: rt, model: c.info.Model}
	p.hop = hopTransport{next: &p.repair}
	return &p.hop
}

// hedgedTransport is the end of the chain: f's worker's connection, with
// the first-byte hedge (hedge.go).
type hedgedTransport struct {
	r *Router
	f *flight
	c *call
}

func (t *hedgedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.r.roundTripHedged(t.f, req, t.c)
}

// forward sends the body to f's backend through the upstream chain and
// copies the answer to the client: the one copy loop.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, f *flight, body []byte, c *call) forwardResult {
	b := f.b
	defer r.pool.forgetIfGone(b)
	ctx := req.Context()
	out := r.outbound(req, b, body)
	m := newMeter(false) // meterTransport learns whether it is a stream
	sent := time.Now()
	resp, err := r.upstream(f, c, m).RoundTrip(out)
	if res, failed := r.classify(f, req, resp, err); failed {
		return res
	}
	defer resp.Body.Close()

	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	sse := isEventStream(resp.Header.Get("Content-Type"))
	if sse {
		// Lengths of streams are not ours to promise, and proxies in
		// front of us must not buffer.
		h.Del("Content-Length")
		h.Set("X-Accel-Buffering", "no")
	}
	w.WriteHeader(resp.StatusCode)
	// The headers leave with the first bytes of the body, in the first
	// read's flush, not in a write of their own: the hedge has waited for
	// the worker's first byte already, so that read does not wait.
	rc := http.NewResponseController(w)
	streamErr, clientErr, deadlines := r.copyAnswer(ctx, w, rc, resp, sse)
	end := time.Now()

	status := r.endStatus(f, c, w, m, resp, sse, streamErr, clientErr)
	if deadlines && clientErr == nil {
		// The server's last write (the end of a chunked body) gets a
		// deadline too; net/http lifts it once the response is done, so
		// the next request on the connection starts with none.
		_ = rc.SetWriteDeadline(time.Now().Add(r.opts.WriteTimeout))
	}
	// A success cut short (the client left, or the worker failed) still
	// spent the tokens the engine made before it ended.
	cut := status != resp.StatusCode && resp.StatusCode < 400 && !m.firstRead.IsZero()
	r.finish(f, c, m, sent, end, status, cut)
	if streamErr != nil && !sse {
		// A JSON body cut short cannot be mended: cut the connection so
		// the client sees the failure instead of a truncated body.
		panic(http.ErrAbortHandler)
	}
	return forwardResult{}
}

// outbound is the request to b's engine: the client's, with the body read
// whole and the headers that are not the engine's business left out.
func (r *Router) outbound(req *http.Request, b *backend, body []byte) *http.Request {
	u := b.base
	u.Path = req.URL.Path
	u.RawQuery = req.URL.RawQuery
	// Built on the stack and copied once by WithContext, not allocated
	// twice.
	base := http.Request{
		Method:     http.MethodPost,
		URL:        &u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, len(req.Header)),
		// net/http sends a bytes.Reader (NopCloser'd) with the headers in
		// one write; a body type it does not know costs a second write.
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          b.cfg.Addr,
	}
	out := base.WithContext(req.Context())
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	for k, v := range req.Header {
		out.Header[k] = v
	}
	if r.opts.Keys != nil {
		// The router's key is not the engine's business.
		out.Header.Del("Authorization")
		out.Header.Del("X-Api-Key")
	}
	// The meter reads the engine's bytes as they come: an engine asked for
	// gzip could answer in it, and escape usage counting and key limits.
	out.Header.Del("Accept-Encoding")
	return out
}

// copyAnswer copies the engine's answer to the client, read by read; it
// returns the engine's error (streamErr) or the client's (clientErr) that
// ended it early, and whether write deadlines are in force.
func (r *Router) copyAnswer(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, resp *http.Response, sse bool) (streamErr, clientErr error, deadlines bool) {
	// A write may block for WriteTimeout, and a sixteenth more at most: a
	// client that reads nothing fills the connection's buffers, and would
	// else hold the engine's slot for as long as the engine has tokens to
	// give. The deadline is moved on before a write once that sixteenth
	// has passed since it was set (not before every write: setting it is
	// a lock and a timer in the runtime, at every read of a stream), so
	// only a client that stops reading is cut, however long the answer; a
	// writer without deadlines (a recorder) has none.
	stall := r.opts.WriteTimeout
	deadlines = stall > 0
	slack := stall / 16
	var renew time.Time

	// Each read of the chain is one read of the upstream: what it brought
	// leaves in one flush, so events that arrived together leave together
	// and none waits for a later one.
	bufp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bufp)
	buf := *bufp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if now := time.Now(); deadlines && !now.Before(renew) {
				renew = now.Add(slack)
				deadlines = rc.SetWriteDeadline(renew.Add(stall)) == nil
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				clientErr = werr
				break
			}
			// Flush's error is the write's: a client that stopped reading
			// is seen here, not only at the next write.
			if sse {
				if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
					clientErr = ferr
					break
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				clientErr = ctx.Err()
			} else {
				streamErr = rerr
			}
			break
		}
	}
	return streamErr, clientErr, deadlines
}

// endStatus is the status an answer that reached the client is counted
// under: the engine's, or 499 when the client stopped reading, or 502 when
// the engine failed mid-answer (a stream then gets an error event).
func (r *Router) endStatus(f *flight, c *call, w http.ResponseWriter, m *meter, resp *http.Response, sse bool, streamErr, clientErr error) int {
	b := f.b
	switch {
	case clientErr != nil:
		if errors.Is(clientErr, os.ErrDeadlineExceeded) {
			// Closing the engine's answer (deferred) cancels its request
			// and frees its slot.
			r.metrics.writeTimeouts.WithLabelValues(f.model).Inc()
			r.log.Info("client read nothing of its answer for the write timeout: cut, engine request cancelled",
				"model", f.model, "backend", b.cfg.Name, "write_timeout", r.opts.WriteTimeout, "key", c.key)
		}
		return statusClientGone
	case streamErr != nil:
		r.recordFailure(b, false, streamErr)
		r.log.Warn("backend failed mid-response", "backend", b.cfg.Name, "err", streamErr)
		if sse {
			_, _ = w.Write(sseErrorEventFor(w, m.seq, fmt.Sprintf("worker %s failed mid-stream: %v; the answer is incomplete, retry the request", b.cfg.Name, streamErr)))
			_ = http.NewResponseController(w).Flush()
		}
		return http.StatusBadGateway
	}
	return resp.StatusCode
}

// finish records how a request that reached a worker ended, whatever the
// status: the one place a request's outcome is recorded, and where a
// per-request hook belongs. At hand: status; c.key (the client's key name),
// f.model and f.b.cfg.Name (model, worker); m.promptCache() (prompt and
// cached tokens as the engine reported them); for a served answer, t's
// output tokens, TTFT and ITL. cut says the engine's success was cut short:
// its tokens so far are counted against the key, though it is not served.
func (r *Router) finish(f *flight, c *call, m *meter, sent, end time.Time, status int, cut bool) {
	r.countStatus(f.model, f.b.cfg.Name, status)
	if status >= 400 {
		r.release(f, nil)
		if cut {
			r.recordUsage(f, c, m, end)
		}
		return
	}
	t := r.timeAnswer(f, c, m, sent, end)
	r.observe(f, t)
	r.release(f, &outcome{ok: true, ttft: t.backendTTFT, itl: t.itl, outputTokens: t.tokens, cache: m.promptCache()})
	if r.opts.OnSample != nil {
		r.opts.OnSample(fleet.Sample{Worker: f.b.cfg.Name, At: end, Kind: "request", TTFT: t.backendTTFT, ITL: t.itl,
			E2E: t.e2e, OutputTokens: t.tokens, TokPerSec: t.tokPerSec})
	}
	r.recordUsage(f, c, m, end)
}

// observe adds a served answer's times to the worker's metrics; release
// adds them to the histories the console shows.
func (r *Router) observe(f *flight, t answerTimes) {
	if t.clientTTFT > 0 {
		f.b.observers.ttft.Observe(t.clientTTFT.Seconds())
	}
	f.b.observers.e2e.Observe(t.e2e.Seconds())
	if t.itl > 0 {
		f.b.observers.itl.Observe(t.itl.Seconds())
	}
}

// answerTimes are a served answer's measurements; a zero duration is not
// known.
type answerTimes struct {
	tokens                  int
	backendTTFT, clientTTFT time.Duration
	itl, e2e                time.Duration
	tokPerSec               float64
}

// timeAnswer measures an answer. TTFT is the time to the first token: in a
// stream, the first chunk that carries content, reasoning or a tool call
// (an early role-only chunk or a comment is not a token); in a non-streamed
// answer, the engine's own prefill time where it reports one (llama-server's
// timings.prompt_ms), else it is left out rather than guessed.
func (r *Router) timeAnswer(f *flight, c *call, m *meter, sent, end time.Time) answerTimes {
	t := answerTimes{tokens: m.outputTokens(), e2e: end.Sub(c.arrived)}
	if m.sse {
		if !m.firstToken.IsZero() {
			t.backendTTFT = max(m.firstToken.Sub(sent), 1)
			if t.tokens > 1 && m.lastData.After(m.firstToken) {
				t.itl = m.lastData.Sub(m.firstToken) / time.Duration(t.tokens-1)
			}
		}
	} else {
		if p, ok := promptTime(m.tail); ok {
			t.backendTTFT = max(min(p, end.Sub(sent)), 1)
		}
		if t.tokens > 1 {
			// A non-streamed answer arrives at once: split its time into
			// the prefill (reported, else the speed model's guess, used for
			// the decode speed only) and the decode after it.
			split := t.backendTTFT
			if split == 0 {
				split = min(r.pool.ttft(f, c.info.PromptTokens), end.Sub(sent))
			}
			t.itl = (end.Sub(sent) - split) / time.Duration(t.tokens-1)
		}
	}
	if t.backendTTFT > 0 {
		t.clientTTFT = sent.Sub(c.arrived) + t.backendTTFT
	}
	decodeFrom := m.firstRead
	if decodeFrom.IsZero() {
		decodeFrom = end
	}
	if !m.firstToken.IsZero() {
		decodeFrom = m.firstToken
	}
	if d := end.Sub(decodeFrom); t.tokens > 1 && d > 0 {
		t.tokPerSec = float64(t.tokens-1) / d.Seconds()
	}
	return t
}
