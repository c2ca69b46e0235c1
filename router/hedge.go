package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A worker whose node fell silent accepts requests and never answers them.
// The router does not wait for the connection to be declared lost (three
// missed keepalives, 15 s and more): as "The Tail at Scale" hedges, a
// request with no first byte from its worker within a deadline drawn from
// that worker's predicted time to first byte is taken back and sent to
// another worker, and the silent one is suspect: it gets no new requests,
// and the other requests still waiting for its first byte are taken back
// too. Requests already streaming from it keep going, so a blip costs them
// a pause, not the answer. The hub also marks every worker of a node
// suspect while its connection misses keepalives (SetSuspect), and clears
// the suspicion when the node answers again.
//
// A request past its deadline is not proof of silence: an engine prefilling
// a long prompt, or with all its slots taken, sends no first byte for a
// while on a starved machine, and a request taken back from it is computed
// twice and sent where its conversation is not. So before taking a request
// back the hedge asks the worker's engine itself (its /health, over the
// same connection the request took): an engine that answers is starved,
// not silent, and the request waits another deadline there; one that does
// not answer within aliveProbeTimeout is silent. A worker that sent a
// first byte of another request within the deadline has answered already.

const (
	// hedgeFactor times the predicted time to first byte is how long a
	// request waits for it before going elsewhere: far enough past the
	// prediction that a busy worker is not abandoned for being busy.
	hedgeFactor = 3
	// hedgeFloor keeps predictions of a few milliseconds from hedging on
	// scheduling noise.
	hedgeFloor = 750 * time.Millisecond
	// aliveProbeTimeout is how long the engine of a worker past a hedge
	// deadline has to answer /health before it is taken for silent: long
	// enough for a starved machine to schedule the engine's HTTP thread
	// and the node's SSH tunnel, short enough that a silent node costs the
	// requests waiting on it only this much more.
	aliveProbeTimeout = 2 * time.Second
)

// suspicion is why a worker gets no new requests for now.
type suspicion struct {
	reason string
	// until ends a suspicion the router raised itself (a hedge); zero
	// means until SetSuspect clears it.
	until time.Time
}

// hedgeState is the hedge's: the requests waiting for a first byte, with
// their own lock (taken after the pool's where both are). The suspicions
// are the pool's, as selection reads them (member.available).
type hedgeState struct {
	waits firstByteWaits
}

type firstByteWaits struct {
	mu sync.Mutex
	// waiting holds, per worker, the requests sent to it that have no
	// first byte yet.
	waiting map[string]map[*firstByteWait]struct{}
	// hedged holds the client requests (by context, the same for every
	// attempt) already taken back once by a hedge: their next attempt
	// waits as long as it takes, so a prompt slower than predicted
	// everywhere is answered late rather than refused after the retries.
	hedged map[context.Context]struct{}
	// alive is when each worker last showed it is not silent: a first
	// byte of any request, or its engine answering the hedge's /health
	// probe. Such a worker is loaded or starved, and its requests past
	// their deadline wait there.
	alive map[string]time.Time
}

// firstByteWait is one request waiting for its first byte.
type firstByteWait struct {
	f *flight
	// client is the client request's context.
	client context.Context
	// state: 0 waiting, 1 first byte arrived, 2 taken back.
	state  atomic.Int32
	cancel context.CancelCauseFunc
}

// takeBack cancels the request unless its first byte already came.
func (w *firstByteWait) takeBack(cause error) bool {
	if !w.state.CompareAndSwap(0, 2) {
		return false
	}
	w.cancel(cause)
	return true
}

// errNoFirstByte is why a request was taken back from a worker.
type errNoFirstByte struct {
	backend string
	why     string
}

func (e *errNoFirstByte) Error() string {
	return fmt.Sprintf("no first byte from %s (%s); sent to another worker", e.backend, e.why)
}

// SetSuspect marks a worker suspect (reason says why) or clears it (reason
// ""). A suspect worker gets no new request while another worker of its
// model can take it, and its requests still waiting for a first byte are
// sent to another worker at once; requests already answering go on.
func (r *Router) SetSuspect(name, reason string) {
	if reason == "" {
		if r.pool.clearSuspect(name) {
			r.log.Info("worker takes new requests again", "backend", name)
			r.dispatchQueued()
		}
		return
	}
	victims := r.pool.suspect(name, suspicion{reason: reason}, &r.hedge.waits, false)
	r.log.Warn("worker suspect: no new requests", "backend", name, "reason", reason, "taken_back", victims)
}

// clearSuspect ends the named worker's suspicion; false when it had none.
func (p *pool) clearSuspect(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, was := p.suspects[name]
	delete(p.suspects, name)
	return was
}

// suspect makes the named worker suspect for s (a suspicion the hub set
// is not replaced by one of the router's own), and takes back its requests
// waiting for a first byte (ws) that another worker can take; with
// spareHedged, not those taken back once already. It returns how many.
func (p *pool) suspect(name string, s suspicion, ws *firstByteWaits, spareHedged bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raiseSuspicionLocked(name, s, ws, spareHedged)
}

func (p *pool) raiseSuspicionLocked(name string, s suspicion, ws *firstByteWaits, spareHedged bool) int {
	if p.suspects == nil {
		p.suspects = map[string]suspicion{}
	}
	if old, ok := p.suspects[name]; !ok || s.until.IsZero() || !old.until.IsZero() {
		p.suspects[name] = s
	}
	return ws.takeBack(name, &errNoFirstByte{backend: name, why: s.reason}, spareHedged,
		func(f *flight) bool { return p.alternativeLocked(f, time.Now()) })
}

// takeBack cancels the requests waiting for a first byte from name for
// which elsewhere says another worker can take them; with spareHedged,
// not those taken back once already.
func (ws *firstByteWaits) takeBack(name string, cause error, spareHedged bool, elsewhere func(*flight) bool) int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	n := 0
	for w := range ws.waiting[name] {
		if _, again := ws.hedged[w.client]; spareHedged && again {
			continue
		}
		if elsewhere(w.f) && w.takeBack(cause) {
			ws.markHedgedLocked(w.client)
			n++
		}
	}
	return n
}

// suspectLocked reports whether the named worker is suspect now.
func (p *pool) suspectLocked(name string, now time.Time) bool {
	s, ok := p.suspects[name]
	return ok && (s.until.IsZero() || now.Before(s.until))
}

// alternative reports whether a worker other than f's could take f's
// request now.
func (p *pool) alternative(f *flight, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alternativeLocked(f, now)
}

func (p *pool) alternativeLocked(f *flight, now time.Time) bool {
	for _, b := range p.byModel[f.model] {
		if b == f.b || b.cfg.Name == f.b.cfg.Name {
			continue
		}
		if ok, _ := p.memberLocked(b, now).available(now, f.job); ok {
			return true
		}
	}
	return false
}

// maxHedgeDeadline caps a deadline that the longest answer a request may
// ask for would put beyond any use (and beyond a Duration).
const maxHedgeDeadline = 24 * time.Hour

// hedgeDeadlineLocked is how long f's request (c) may go without a first
// byte: a multiple of the worker's predicted time to first token, or, for
// an answer that is not streamed (its first byte comes with its last), to
// the longest answer it may give: n choices of max_tokens each, or without
// max_tokens of what the worker's context leaves after the prompt. The
// router cannot tell such an answer from silence before it ends, so it
// waits for it; a node that fell silent is still caught by the hub's
// keepalives (SetSuspect), which take back requests not streamed too.
func (p *pool) hedgeDeadline(f *flight, c *call) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(f.b.cfg.Name)
	conc := max(f.startConcurrency, 1)
	pred := ms(w.speed.CautiousTTFT(conc, f.job.PromptTokens))
	if !c.info.Stream {
		pred += wholeAnswerTokens(f, c) * ms(w.speed.ITL(conc))
	}
	return max(hedgeFloor, fromMs(min(hedgeFactor*pred, ms(maxHedgeDeadline))))
}

// wholeAnswerTokens is the most tokens c's answer from f's worker may
// hold, in float64: n times max_tokens near 2^63 must not wrap.
func wholeAnswerTokens(f *flight, c *call) float64 {
	each := c.info.MaxTokens
	if each <= 0 {
		// The engine writes until its context is full (llama-server) or
		// defaults max_tokens to what is left of it (vLLM).
		each = f.job.OutputTokens
		if ctx := f.b.cfg.Context; ctx > f.job.PromptTokens {
			each = ctx - f.job.PromptTokens
		}
	}
	return float64(max(c.n, 1)) * float64(each)
}

// roundTripHedged is the forward path's round trip to f's worker: it
// returns once the first byte of the body has arrived (or the body ended),
// or with an error when the request was taken back because that did not
// happen in time.
func (r *Router) roundTripHedged(f *flight, out *http.Request, c *call) (*http.Response, error) {
	name := f.b.cfg.Name
	ctx, cancel := context.WithCancelCause(out.Context())
	wait := &firstByteWait{f: f, client: out.Context(), cancel: cancel}
	deadline := r.pool.hedgeDeadline(f, c)
	again := r.hedge.waits.add(name, wait)
	var timer *time.Timer
	if !again {
		timer = time.AfterFunc(deadline, func() { r.noFirstByte(wait, deadline) })
	}

	resp, err := f.b.transport.RoundTrip(out.WithContext(ctx))
	var first []byte
	var firstErr error
	var buf *[]byte
	if err == nil {
		buf = firstBytes.Get().(*[]byte)
		n, rerr := resp.Body.Read(*buf)
		first, firstErr = (*buf)[:n], rerr
	}
	head := &prefetchedBody{head: first, headErr: firstErr, buf: buf}
	if timer != nil {
		timer.Stop()
	}
	r.hedge.waits.remove(name, wait, err == nil && (len(first) > 0 || firstErr == io.EOF))
	if !wait.state.CompareAndSwap(0, 1) {
		// Taken back: whatever came, it came too late to be used.
		head.free()
		if resp != nil {
			resp.Body.Close()
		}
		return nil, context.Cause(ctx)
	}
	if err != nil {
		return nil, err
	}
	if firstErr != nil && firstErr != io.EOF && len(first) == 0 {
		head.free()
		resp.Body.Close()
		return nil, firstErr
	}
	head.rest = resp.Body
	resp.Body = head
	return resp, nil
}

// noFirstByte takes a request back from a worker that did not send its
// first byte within deadline, makes that worker suspect for a cooldown,
// takes back its other requests that wait for a first byte too, and asks
// the hub to check the worker's node. With no other worker to go to, the
// request keeps waiting. A worker that is alive (it sent a first byte of
// another request within the deadline, or its engine answers /health) is
// loaded or starved, not silent: the request waits another deadline there.
func (r *Router) noFirstByte(wait *firstByteWait, deadline time.Duration) {
	f := wait.f
	name := f.b.cfg.Name
	if wait.state.Load() != 0 {
		return // its first byte came meanwhile
	}
	waitLonger := func(why string) {
		r.log.Debug("request got no first byte in time from a worker that is alive; waiting longer", "backend", name, "deadline", deadline, "alive", why)
		time.AfterFunc(deadline, func() { r.noFirstByte(wait, deadline) })
	}
	if r.hedge.waits.aliveWithin(name, time.Now(), deadline) {
		waitLonger("answered lately")
		return
	}
	elsewhere := r.pool.alternative(f, time.Now())
	why := fmt.Sprintf("no first byte within %s", deadline.Round(time.Millisecond))
	if elsewhere {
		ctx, cancel := context.WithTimeout(context.Background(), aliveProbeTimeout)
		err := r.healthCheck(ctx, f.b)
		cancel()
		if err == nil {
			r.hedge.waits.markAlive(name, time.Now())
			waitLonger("its engine answers /health")
			return
		}
		why = fmt.Sprintf("no first byte within %s, and %v", deadline.Round(time.Millisecond), err)
	}
	now := time.Now()
	// The requests already taken back once were promised to wait here as
	// long as it takes: another request's deadline says nothing new about
	// them, and taking them again leaves them no worker they have not
	// tried (503 on a fleet of live but loaded workers).
	taken, answered := r.pool.suspectSilent(wait, suspicion{reason: why, until: now.Add(r.opts.Cooldown)}, &r.hedge.waits, now)
	if answered {
		return // its first byte came meanwhile
	}
	r.log.Warn("request got no first byte in time", "backend", name, "deadline", deadline, "reason", why, "taken_back", taken)
	if r.opts.OnNoFirstByte != nil {
		go r.opts.OnNoFirstByte(name)
	}
}

// add registers wait on the named worker; again says its client request
// was taken back by a hedge before.
func (ws *firstByteWaits) add(name string, wait *firstByteWait) (again bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.waiting == nil {
		ws.waiting = map[string]map[*firstByteWait]struct{}{}
	}
	if ws.waiting[name] == nil {
		ws.waiting[name] = map[*firstByteWait]struct{}{}
	}
	ws.waiting[name][wait] = struct{}{}
	_, again = ws.hedged[wait.client]
	return again
}

// remove ends wait on the named worker; answered says its first byte
// came (or its answer ended).
func (ws *firstByteWaits) remove(name string, wait *firstByteWait, answered bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.waiting[name], wait)
	if len(ws.waiting[name]) == 0 {
		delete(ws.waiting, name)
	}
	if answered {
		ws.markAliveLocked(name, time.Now())
	}
}

// markAlive records that the named worker showed at at that it is not
// silent.
func (ws *firstByteWaits) markAlive(name string, at time.Time) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.markAliveLocked(name, at)
}

func (ws *firstByteWaits) markAliveLocked(name string, at time.Time) {
	if ws.alive == nil {
		ws.alive = map[string]time.Time{}
	}
	if at.After(ws.alive[name]) {
		ws.alive[name] = at
	}
}

// aliveWithin reports whether the named worker showed it is not silent
// within d before now.
func (ws *firstByteWaits) aliveWithin(name string, now time.Time, d time.Duration) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	at, ok := ws.alive[name]
	return ok && now.Sub(at) < d
}

// markHedgedLocked remembers that the client request of ctx was taken
// back by a hedge, until the request ends.
func (ws *firstByteWaits) markHedgedLocked(ctx context.Context) {
	if _, ok := ws.hedged[ctx]; ok {
		return
	}
	if ws.hedged == nil {
		ws.hedged = map[context.Context]struct{}{}
	}
	ws.hedged[ctx] = struct{}{}
	context.AfterFunc(ctx, func() {
		ws.mu.Lock()
		delete(ws.hedged, ctx)
		ws.mu.Unlock()
	})
}

// firstBytes are the buffers an answer's first bytes are read into; each
// goes back once its bytes were passed on (4 KiB a request, a fifth of
// what the router allocated for a small one).
var firstBytes = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

// prefetchedBody is a response body whose first bytes were read already,
// into buf.
type prefetchedBody struct {
	head    []byte
	headErr error
	buf     *[]byte
	rest    io.ReadCloser
}

func (b *prefetchedBody) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		if len(b.head) == 0 {
			b.free()
			if b.headErr != nil {
				return n, b.headErr
			}
		}
		return n, nil
	}
	b.free()
	if b.headErr != nil {
		return 0, b.headErr
	}
	return b.rest.Read(p)
}

func (b *prefetchedBody) Close() error {
	b.free()
	return b.rest.Close()
}

// free gives the buffer of the first bytes back, once they are passed on
// or no longer wanted.
func (b *prefetchedBody) free() {
	if b.buf != nil {
		b.head = nil
		firstBytes.Put(b.buf)
		b.buf = nil
	}
}

// suspectSilent makes wait's worker suspect for s and takes back its
// other requests waiting for a first byte, unless wait's first byte came
// meanwhile (answered) or no other worker can take its request.
func (p *pool) suspectSilent(wait *firstByteWait, s suspicion, ws *firstByteWaits, now time.Time) (taken int, answered bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if wait.state.Load() != 0 {
		return 0, true
	}
	if !p.alternativeLocked(wait.f, now) {
		return 0, false
	}
	return p.raiseSuspicionLocked(wait.f.b.cfg.Name, s, ws, true), false
}
