package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"fleet"
	"fleet/router/reasoning"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (r *Router) serveModels(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, errTypeInvalidRequest, codeMethodNotAllows, "", "use GET /v1/models", 0)
		return
	}
	if _, ok := r.authorize(w, req); !ok {
		return
	}
	type card struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	r.mu.Lock()
	data := make([]card, 0, len(r.models))
	seen := map[string]bool{}
	addCard := func(id string) {
		if !seen[id] {
			seen[id] = true
			data = append(data, card{ID: id, Object: "model", OwnedBy: "fleet"})
		}
	}
	for _, m := range r.models {
		addCard(m.ID)
		for _, a := range m.Aliases {
			addCard(a)
		}
	}
	for _, b := range r.backends {
		addCard(b.cfg.Model)
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{"list", data})
}

// resolve maps a requested name to a model ID. Models known only from a
// backend (no SetModels yet) resolve to themselves.
func (r *Router) resolveLocked(name string) (string, bool) {
	if id, ok := r.names[name]; ok {
		return id, true
	}
	for _, b := range r.backends {
		if b.cfg.Model == name {
			return name, true
		}
	}
	return "", false
}

// authorize checks the API key when the router has a KeyVerifier.
func (r *Router) authorize(w http.ResponseWriter, req *http.Request) (string, bool) {
	if r.opts.Keys == nil {
		return "", true
	}
	auth := req.Header.Get("Authorization")
	key, ok := cutPrefixFold(auth, "Bearer ")
	if !ok || key == "" {
		writeError(w, http.StatusUnauthorized, errTypeAuthentication, codeInvalidAPIKey, "",
			"no API key: send \"Authorization: Bearer KEY\" (an admin creates one with `fleet key create NAME`)", 0)
		return "", false
	}
	name, valid, err := r.opts.Keys.VerifyAPIKey(req.Context(), key)
	if err != nil {
		r.log.Error("api key check failed", "err", err)
		writeError(w, http.StatusInternalServerError, errTypeServer, "", "", "the router could not check the API key; retry, and tell the operator if it persists", 0)
		return "", false
	}
	if !valid {
		writeError(w, http.StatusUnauthorized, errTypeAuthentication, codeInvalidAPIKey, "",
			"the API key is not valid (revoked or mistyped); ask an admin for a key (`fleet key create NAME`)", 0)
		return "", false
	}
	return name, true
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !equalFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

func equalFold(a, b string) bool { return bytes.EqualFold([]byte(a), []byte(b)) }

func (r *Router) serveInference(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	if req.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, errTypeInvalidRequest, codeMethodNotAllows, "",
			fmt.Sprintf("%s takes POST with a JSON body", req.URL.Path), 0)
		return
	}
	if _, ok := r.authorize(w, req); !ok {
		return
	}
	body, err := r.readBody(w, req)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			r.countStatus("", "", http.StatusRequestEntityTooLarge)
			writeError(w, http.StatusRequestEntityTooLarge, errTypeInvalidRequest, codeBodyTooLarge, "",
				fmt.Sprintf("request body is over the router's limit of %d bytes; send a smaller request", r.opts.MaxBodyBytes), 0)
			return
		}
		if errors.Is(err, errBodyTimeout) {
			r.countStatus("", "", http.StatusRequestTimeout)
			writeError(w, http.StatusRequestTimeout, errTypeInvalidRequest, codeBodyTimeout, "",
				fmt.Sprintf("the request body did not arrive within %s; send it at once after the headers", r.opts.BodyTimeout), 0)
			return
		}
		r.log.Debug("reading request body failed", "err", err)
		r.countStatus("", "", 499)
		return
	}
	info, err := parseRequest(body)
	if err != nil {
		var rerr *requestError
		errors.As(err, &rerr)
		r.countStatus("", "", http.StatusBadRequest)
		writeError(w, http.StatusBadRequest, errTypeInvalidRequest, rerr.code, rerr.param, rerr.msg, 0)
		return
	}
	r.mu.Lock()
	model, known := r.resolveLocked(info.Model)
	// Context fit is judged on what the client may ask for (max_tokens is
	// a promise the worker must hold), the schedule on what it usually gets.
	job := Job{PromptTokens: info.PromptTokens, NeedContext: info.PromptTokens + info.MaxTokens, Prefix: info.Prefix}
	if known {
		job.OutputTokens = r.expectedOutputLocked(model, info.MaxTokens)
	}
	mode := r.normalisationLocked(model, req.URL.Path)
	r.mu.Unlock()
	if !known {
		r.countStatus(unknownModel, "", http.StatusNotFound)
		writeError(w, http.StatusNotFound, errTypeInvalidRequest, codeModelNotFound, "model",
			fmt.Sprintf("the model %q does not exist here; GET /v1/models lists the models this fleet serves", info.Model), 0)
		return
	}
	var excluded []string
	var lastErr error
	retries := 0
	for attempt := 0; ; attempt++ {
		f, err := r.acquire(req.Context(), model, job, excluded)
		if err != nil {
			r.answerSchedError(w, req, model, err, lastErr)
			return
		}
		res := r.forward(w, req, f, body, info, mode, arrived)
		if !res.retry {
			return
		}
		lastErr = res.err
		excluded = append(excluded, f.b.cfg.Name)
		if !r.mayRetry(res, &retries) {
			r.countStatus(model, f.b.cfg.Name, http.StatusBadGateway)
			writeError(w, http.StatusBadGateway, errTypeServer, codeUpstreamFailed, "",
				fmt.Sprintf("%d worker(s) of model %q failed before answering (last: %v); retry later", attempt+1, model, lastErr), r.opts.RetryAfter)
			return
		}
		r.metrics.retries.WithLabelValues(model).Inc()
		r.log.Info("retrying request on another worker", "model", model, "failed", f.b.cfg.Name, "attempt", attempt+1, "err", res.err)
	}
}

func (r *Router) answerSchedError(w http.ResponseWriter, req *http.Request, model string, err, lastErr error) {
	var serr *schedError
	if !errors.As(err, &serr) {
		// The client went away while queued: nobody to answer.
		r.countStatus(model, "", 499)
		return
	}
	msg := serr.msg
	if lastErr != nil {
		msg += fmt.Sprintf(" (a worker failed before answering: %v)", lastErr)
	}
	var retry time.Duration
	if serr.retryAfter {
		retry = r.opts.RetryAfter
	}
	r.countStatus(model, "", serr.status)
	writeError(w, serr.status, serr.typ, serr.code, "", msg, retry)
}

func (r *Router) countStatus(model, backend string, status int) {
	r.metrics.requests.WithLabelValues(model, backend, strconv.Itoa(status)).Inc()
}

// forward sends the body to f's backend and streams the answer back,
// normalised to mode when mode is not Off.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, f *flight, body []byte, info requestInfo, mode reasoning.Mode, arrived time.Time) forwardResult {
	b := f.b
	ctx := req.Context()
	// The engine gets the name it serves; the client gets back the name it
	// asked for (see modelname.go).
	served := b.cfg.servedName()
	renaming := served != info.Model
	if renaming {
		body = withModel(body, quoteJSON(served))
	}
	u := b.base
	u.Path = req.URL.Path
	u.RawQuery = req.URL.RawQuery
	out := &http.Request{
		Method:        http.MethodPost,
		URL:           &u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        make(http.Header, len(req.Header)),
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          b.cfg.Addr,
	}
	out = out.WithContext(ctx)
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	for k, v := range req.Header {
		out.Header[k] = v
	}
	removeHopHeaders(out.Header)
	if r.opts.Keys != nil {
		// The router's key is not the engine's business.
		out.Header.Del("Authorization")
	}
	if mode != reasoning.Off || renaming {
		// The router reads the answer to rewrite it, so it must come plain.
		out.Header.Del("Accept-Encoding")
	}

	sent := time.Now()
	resp, err := r.roundTripHedged(f, out, info.Stream)
	if err != nil {
		r.release(f, nil)
		if ctx.Err() != nil {
			r.countStatus(f.model, b.cfg.Name, 499)
			return forwardResult{}
		}
		refused := errors.Is(err, syscall.ECONNREFUSED)
		r.recordFailure(b, refused, err)
		return forwardResult{retry: true, dial: isDialError(err), err: fmt.Errorf("%s: %w", b.cfg.Name, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		// Nothing reached the client yet, so another worker may answer.
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		r.release(f, nil)
		r.recordFailure(b, false, fmt.Errorf("status %s", resp.Status))
		return forwardResult{retry: true, err: fmt.Errorf("%s answered %s: %s", b.cfg.Name, resp.Status, bytes.TrimSpace(snippet))}
	}

	sse := isEventStream(resp.Header.Get("Content-Type"))
	rewrite := (mode != reasoning.Off || renaming) && rewritable(resp)
	m := newMeter(sse)
	var upstream io.Reader = resp.Body
	var firstByte time.Time
	// rewritten, when set, is the whole non-streamed answer to send.
	var rewritten []byte
	if rewrite && !sse {
		raw, err := readForRewrite(resp.Body)
		if err != nil {
			r.release(f, nil)
			if ctx.Err() != nil {
				r.countStatus(f.model, b.cfg.Name, 499)
				return forwardResult{}
			}
			// Nothing reached the client yet, so another worker may answer.
			r.recordFailure(b, false, err)
			return forwardResult{retry: true, err: fmt.Errorf("%s failed while sending its answer: %w", b.cfg.Name, err)}
		}
		firstByte = time.Now()
		out, rerr := raw, error(nil)
		if mode != reasoning.Off {
			out, rerr = rewriteJSONBody(raw, mode)
		} else if len(raw) > maxRewriteBody {
			rerr = fmt.Errorf("%w (%d bytes)", errBodyOverLimit, maxRewriteBody)
		}
		if renaming && rerr == nil {
			out = withModel(out, quoteJSON(info.Model))
		}
		switch {
		case errors.Is(rerr, errBodyOverLimit):
			r.log.Warn("answer passed through without normalisation", "backend", b.cfg.Name, "err", rerr)
			upstream = io.MultiReader(bytes.NewReader(raw), resp.Body)
		case rerr != nil:
			r.log.Warn("answer passed through without reasoning normalisation", "backend", b.cfg.Name, "err", rerr)
			rewritten = raw
		default:
			rewritten = out
		}
		if rewritten != nil {
			// The meter only needs the tail, where usage sits.
			m.feed(raw[max(0, len(raw)-2048):], firstByte)
		}
	}

	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	removeHopHeaders(h)
	if rewritten != nil {
		h.Set("Content-Length", strconv.Itoa(len(rewritten)))
	}
	if sse {
		// Lengths of streams are not ours to promise, and proxies in
		// front of us must not buffer.
		h.Del("Content-Length")
		h.Set("X-Accel-Buffering", "no")
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	if sse && flusher != nil {
		flusher.Flush()
	}

	var streamErr, clientErr error
	if rewritten != nil {
		_, clientErr = w.Write(rewritten)
		// Nothing left to read: the loop below sees EOF at once.
		upstream = http.NoBody
	}
	var norm *sseNormaliser
	if rewrite && sse && mode != reasoning.Off {
		norm = newSSENormaliser(mode)
	}
	var rename *sseModelRewriter
	if rewrite && sse && renaming {
		rename = newSSEModelRewriter(info.Model)
	}
	bufp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bufp)
	buf := *bufp
	for clientErr == nil {
		n, rerr := upstream.Read(buf)
		if n > 0 {
			now := time.Now()
			if firstByte.IsZero() {
				firstByte = now
			}
			m.feed(buf[:n], now)
			chunk := buf[:n]
			if norm != nil {
				chunk = norm.feed(chunk)
			}
			if rename != nil {
				chunk = rename.feed(chunk)
			}
			if _, werr := w.Write(chunk); werr != nil {
				clientErr = werr
				break
			}
			if sse && flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			var tail []byte
			if norm != nil {
				tail = norm.finish()
			}
			if rename != nil {
				tail = append(slices.Clone(rename.feed(tail)), rename.finish()...)
			}
			if len(tail) > 0 {
				if _, werr := w.Write(tail); werr != nil {
					clientErr = werr
				} else if flusher != nil {
					flusher.Flush()
				}
			}
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
	end := time.Now()

	status := resp.StatusCode
	switch {
	case clientErr != nil:
		status = 499
		r.release(f, nil)
	case streamErr != nil:
		r.recordFailure(b, false, streamErr)
		r.release(f, nil)
		r.log.Warn("backend failed mid-response", "backend", b.cfg.Name, "err", streamErr)
		if sse {
			_, _ = w.Write(sseErrorEvent(fmt.Sprintf("worker %s failed mid-stream: %v; the answer is incomplete, retry the request", b.cfg.Name, streamErr)))
			if flusher != nil {
				flusher.Flush()
			}
			status = 502
		} else {
			r.countStatus(f.model, b.cfg.Name, 502)
			// A JSON body cut short cannot be mended: cut the connection
			// so the client sees the failure instead of a truncated body.
			panic(http.ErrAbortHandler)
		}
	default:
		r.finish(f, m, info, arrived, sent, firstByte, end, status)
	}
	r.countStatus(f.model, b.cfg.Name, status)
	return forwardResult{}
}

// finish records a completed request: metrics, live stats, the sample, and
// the speed model. TTFT is the time to the first token: in a stream, the
// first chunk that carries content, reasoning or a tool call (an early
// role-only chunk or a comment is not a token); in a non-streamed answer,
// the engine's own prefill time where it reports one (llama-server's
// timings.prompt_ms), else it is left out rather than guessed.
func (r *Router) finish(f *flight, m *meter, info requestInfo, arrived, sent, firstByte, end time.Time, status int) {
	if firstByte.IsZero() {
		firstByte = end
	}
	tokens := m.outputTokens()
	e2e := end.Sub(arrived)
	var backendTTFT, itl time.Duration // 0: not known
	if m.sse {
		if !m.firstToken.IsZero() {
			backendTTFT = max(m.firstToken.Sub(sent), 1)
			if tokens > 1 && m.lastData.After(m.firstToken) {
				itl = m.lastData.Sub(m.firstToken) / time.Duration(tokens-1)
			}
		}
	} else {
		if p, ok := promptTime(m.tail); ok {
			backendTTFT = max(min(p, end.Sub(sent)), 1)
		}
		if tokens > 1 {
			// A non-streamed answer arrives at once: split its time into
			// the prefill (reported, else the speed model's guess, used for
			// the decode speed only) and the decode after it.
			split := backendTTFT
			if split == 0 {
				r.mu.Lock()
				split = min(r.workerLocked(f.b.cfg.Name).speed.TTFT(f.startConcurrency, info.PromptTokens), end.Sub(sent))
				r.mu.Unlock()
			}
			itl = (end.Sub(sent) - split) / time.Duration(tokens-1)
		}
	}
	var clientTTFT time.Duration
	if backendTTFT > 0 {
		clientTTFT = sent.Sub(arrived) + backendTTFT
	}
	ok := status < 400
	var o *outcome
	if ok {
		o = &outcome{ok: true, ttft: backendTTFT, itl: itl, outputTokens: tokens, cache: m.promptCache()}
		if clientTTFT > 0 {
			f.b.observers.ttft.Observe(clientTTFT.Seconds())
		}
		f.b.observers.e2e.Observe(e2e.Seconds())
		if itl > 0 {
			f.b.observers.itl.Observe(itl.Seconds())
		}
		r.mu.Lock()
		w := r.workerLocked(f.b.cfg.Name)
		// The worker's own TTFT, from the moment it was sent the request:
		// a wait in the router's queue is the fleet's, not the worker's.
		if backendTTFT > 0 {
			w.ttftHistory.add(ms(backendTTFT))
		}
		if itl > 0 {
			w.itlHistory.add(ms(itl))
		}
		r.mu.Unlock()
	}
	r.release(f, o)
	if ok && r.opts.OnSample != nil {
		s := fleet.Sample{Worker: f.b.cfg.Name, At: end, Kind: "request", TTFT: backendTTFT, ITL: itl, E2E: e2e, OutputTokens: tokens}
		decodeFrom := firstByte
		if !m.firstToken.IsZero() {
			decodeFrom = m.firstToken
		}
		if d := end.Sub(decodeFrom); tokens > 1 && d > 0 {
			s.TokPerSec = float64(tokens-1) / d.Seconds()
		}
		r.opts.OnSample(s)
	}
}

func isEventStream(ct string) bool {
	return len(ct) >= 17 && equalFold(ct[:17], "text/event-stream")
}

// meter watches a response go by: SSE data events and their times, and the
// usage's completion_tokens, without holding the body.
type meter struct {
	sse bool
	// line holds the start of an SSE line cut by the end of a read.
	line      []byte
	overflow  bool
	events    int
	firstData time.Time
	lastData  time.Time
	// firstToken is when the first data event carrying a token (content,
	// reasoning, a tool call, completion text) arrived.
	firstToken time.Time
	usage      int
	// cache is what the usage and timings chunks said of the prompt.
	cache promptCache
	// tail keeps the end of a non-streamed body, where usage sits.
	tail []byte
}

const maxMeterLine = 16 << 10

func newMeter(sse bool) *meter { return &meter{sse: sse, usage: -1, cache: unknownPromptCache()} }

var (
	dataPrefix      = []byte("data:")
	donePayload     = []byte("[DONE]")
	completionField = []byte(`"completion_tokens":`)
	timingsField    = []byte(`"timings":`)
)

// feed meters one read. Whole lines are looked at where they lie in p; only
// a line cut by the end of the read is kept, until its newline comes.
func (m *meter) feed(p []byte, now time.Time) {
	if !m.sse {
		const keep = 2048
		m.tail = append(m.tail, p...)
		if len(m.tail) > keep {
			m.tail = append(m.tail[:0], m.tail[len(m.tail)-keep:]...)
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			m.carry(p)
			return
		}
		line := p[:i]
		if len(m.line) > 0 || m.overflow {
			m.carry(line)
			line = m.line
		}
		if len(line) > maxMeterLine {
			// Cut as a carried line is, so that where reads fall does
			// not change what is seen.
			line, m.overflow = line[:maxMeterLine], true
		}
		m.endLine(line, m.overflow, now)
		m.line = m.line[:0]
		m.overflow = false
		p = p[i+1:]
	}
}

// carry keeps the start of a line that continues in the next read: its
// first maxMeterLine bytes (data lines of usage chunks are a few hundred
// bytes; a longer one is a token, and its start says so).
func (m *meter) carry(p []byte) {
	if m.overflow {
		return
	}
	if room := maxMeterLine - len(m.line); len(p) > room {
		p, m.overflow = p[:room], true
	}
	m.line = append(m.line, p...)
}

var emptyChoices = []byte(`"choices":[]`)

// endLine meters one SSE line; cut says only its start is there, enough to
// count a data event but not to read it.
func (m *meter) endLine(line []byte, cut bool, now time.Time) {
	line = bytes.TrimRight(line, "\r")
	payload, ok := bytes.CutPrefix(line, dataPrefix)
	if !ok {
		return
	}
	payload = bytes.TrimSpace(payload)
	if cut {
		m.events++
		if m.firstData.IsZero() {
			m.firstData = now
		}
		m.lastData = now
		return
	}
	if bytes.Equal(payload, donePayload) {
		return
	}
	// Most events are a token and carry neither usage nor timings: the
	// forward searches (vectorised, unlike LastIndex) rule both out first.
	if bytes.Contains(payload, completionField) {
		if n := usageTokens(payload); n >= 0 {
			m.usage = n
			m.cache.scan(payload)
		} else if bytes.Contains(payload, timingsField) {
			m.cache.scan(payload)
		}
	} else if bytes.Contains(payload, timingsField) {
		m.cache.scan(payload)
	}
	// The usage-only chunk carries no token; every other data event
	// carries at least one.
	if bytes.Contains(payload, emptyChoices) {
		return
	}
	m.events++
	if m.firstData.IsZero() {
		m.firstData = now
	}
	if m.firstToken.IsZero() && carriesToken(payload) {
		m.firstToken = now
	}
	m.lastData = now
}

// usageTokens finds "completion_tokens":N in p, or -1.
func usageTokens(p []byte) int { return intField(p, completionField) }

func (m *meter) outputTokens() int {
	if !m.sse {
		return max(usageTokens(m.tail), 0)
	}
	if m.usage >= 0 {
		return m.usage
	}
	return m.events
}
