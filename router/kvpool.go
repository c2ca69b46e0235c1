package router

import (
	"bytes"
	"math"
)

// The KV pool a worker's requests share. llama-server started with
// --kv-unified (fleet's default, and what -np auto means) lets every slot
// use the whole -c context, but the slots share one cache of -c tokens:
// three slots of -c 4096 holding 1,400 tokens each do not fit. When the
// pool is full, llama-server first purges idle slots, then fails every
// request in flight on it at once ("Context size has been exceeded.",
// server-context.cpp, update_slots). The router therefore counts what each
// request in flight may hold and sends a worker a request only while the
// sum stays within its pool; otherwise the request waits for it, as for a
// full worker, or goes to another with room.
//
// A request holds its whole prompt in the pool, the part its slot reused
// from the prompt cache too (those cells are the slot's), plus whatever it
// may still generate: its max_tokens, or unboundedOutputReserve without.

// unboundedOutputReserve bounds what a request without max_tokens is
// counted to generate: at least this, or twice the model's usual answer.
// llama-server would generate until the context is full; a reserve of the
// whole context would let one such request hold a worker alone.
const unboundedOutputReserve = 512

// kvOutput is the output a request is counted to hold: max_tokens when it
// gives one, else the larger of twice the usual answer and
// unboundedOutputReserve.
func kvOutput(maxTokens, usual int) int {
	if maxTokens > 0 {
		return maxTokens
	}
	return max(2*usual, unboundedOutputReserve)
}

// overflowMessage is llama-server's error when its KV pool is full (HTTP
// 500, type server_error, before the stream starts; a data: {"error": …}
// event after).
var overflowMessage = []byte("Context size has been exceeded")

// isOverflowAnswer reports whether an engine's error body is llama-server's
// full KV pool: the worker is full, not failing.
func isOverflowAnswer(body []byte) bool { return bytes.Contains(body, overflowMessage) }

// maxOverflowRequeues bounds how often one request refused by full
// workers is queued again before it is answered 503, so a worker whose
// pool the router misjudges cannot keep a request for ever.
const maxOverflowRequeues = 4

// kvPool is the tokens the worker's requests may hold together, 0 for no
// shared bound: its configured pool, lowered to what it held when its
// engine last said it was full (its engine may count more tokens than the
// router learnt, or hold ones the router does not see).
func (w *worker) kvPool(b *backend) int {
	pool := b.cfg.KVPool
	if pool > 0 && w.kvRefusedAt > 0 {
		pool = min(pool, w.kvRefusedAt)
	}
	return pool
}

// kvTokens is what job may hold in the worker's pool, in its engine's
// tokens: the prompt at the worker's learned engine tokens per router
// token, plus the output counted for it.
func (w *worker) kvTokens(job Job) int {
	scale := w.tokenScale
	if scale <= 0 {
		scale = 1
	}
	prompt := math.Ceil(float64(job.PromptTokens) * scale)
	if prompt >= float64(math.MaxInt-job.KVOutput) {
		return math.MaxInt
	}
	return int(prompt) + job.KVOutput
}

// kvRoom reports whether job fits in the worker's pool beside what it
// holds. A worker with nothing in flight always has room: a job larger than
// the whole pool is the context check's to refuse (fits), and the engine's.
func (w *worker) kvRoom(b *backend, job Job) bool {
	pool := w.kvPool(b)
	if pool <= 0 || w.inFlight == 0 {
		return true
	}
	return w.kvHeld+w.kvTokens(job) <= pool
}

// learnTokenScale moves the worker's engine tokens per router token
// towards what a finished request's usage said: engine tokens over the
// router's estimate of its prompt. A tokenizer that counts a byte a token
// (the tests' tiny model) holds four times the router's estimate.
func (w *worker) learnTokenScale(estimate, engine int) {
	if estimate <= 0 || engine <= 0 {
		return
	}
	s := float64(engine) / float64(estimate)
	if w.tokenScale <= 0 {
		w.tokenScale = s
		return
	}
	// The larger of the last and the mean: a pool judged too full waits a
	// little; one judged too empty fails every request on it.
	w.tokenScale = max(s, 0.7*w.tokenScale+0.3*s)
}

// engineTokens is the prompt in the engine's tokens: its usage's
// prompt_tokens, else (a llama-server stream without include_usage sends
// only timings) the tokens it computed and reused; -1 when unknown.
func (c promptCache) engineTokens() int {
	switch {
	case c.promptTokens > 0:
		return c.promptTokens
	case c.computedN >= 0 && c.cached >= 0:
		return c.computedN + c.cached
	}
	return -1
}

// refusedFull records that the worker's engine said its pool was full
// while the router counted held tokens on it (the refused request's
// included): the pool is taken to be below that until the engine restarts.
// The engine fails every request in flight at once, and the answers after
// the first come as the others are released: only the first of them,
// with all of them still counted, says where the pool ended.
func (w *worker) refusedFull(held int) {
	if w.kvRefusing || held <= 1 {
		return
	}
	w.kvRefusing = true
	if w.kvRefusedAt == 0 || held-1 < w.kvRefusedAt {
		w.kvRefusedAt = held - 1
	}
}

// refusedFull records that f's worker refused it, its pool full, while f
// is still counted on it.
func (p *pool) refusedFull(f *flight) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(f.b.cfg.Name)
	w.refusedFull(w.kvHeld)
	p.log.Warn("worker's engine said its KV pool was full; its requests are queued again and it is sent fewer tokens at once",
		"backend", f.b.cfg.Name, "held", w.kvHeld, "pool", w.kvPool(f.b))
}
