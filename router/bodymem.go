package router

import (
	"fmt"
	"io"
	"net/http"
	"sync"
)

// The router holds each request body in memory from its first byte until
// the request ends (a retry sends it again), so concurrent large bodies
// cost their size each: 24 bodies of 15 MiB took the hub from 141 to
// 510 MB (issue 19). bodyBudget bounds the bytes held at once, in all and
// per API key, and a body that would cross a bound is refused before it is
// read (or, without a Content-Length, as soon as it crosses).

const (
	// DefaultBodiesInFlight bounds the request bodies held at once: eight
	// bodies of the largest size, thousands of ordinary chat requests.
	DefaultBodiesInFlight = 128 << 20
	// DefaultKeyBodiesInFlight bounds those of one API key: two bodies
	// of the largest size.
	DefaultKeyBodiesInFlight = 32 << 20
)

// bodyBudget is the bytes of request bodies held, in all and by API key
// name (only keys holding some are in byKey, so it is bounded by the
// requests in flight).
type bodyBudget struct {
	mu    sync.Mutex
	held  int64
	byKey map[string]int64
}

// bodyHold is what one request holds of the budget; release gives it back.
type bodyHold struct {
	r   *Router
	key string
	n   int64
}

// bodyRefusal is a body the budget cannot take, with the answer to give.
type bodyRefusal struct {
	status     int
	typ, code  string
	msg        string
	retryAfter bool
	bound      string // "total", "key" or "size": the metric's label
}

func (e *bodyRefusal) Error() string { return e.msg }

const mib = 1 << 20

// grow takes n more bytes for h's request, or says why it may not.
func (h *bodyHold) grow(n int64) error {
	r := h.r
	total, perKey := r.opts.MaxBodiesInFlight, r.opts.MaxKeyBodiesInFlight
	if h.key == "" {
		// Without keys every client is one anonymous user: the total
		// bound is the only one.
		perKey = 0
	}
	want := h.n + n
	switch {
	case total > 0 && want > total:
		return r.refuseBody(&bodyRefusal{status: http.StatusRequestEntityTooLarge, typ: errTypeInvalidRequest, code: codeBodyTooLarge, bound: "size",
			msg: fmt.Sprintf("the request body (%d bytes so far) is over the %d MiB the router holds of all request bodies at once (serve --bodies-in-flight-mib); send a smaller request", want, total/mib)})
	case perKey > 0 && want > perKey:
		return r.refuseBody(&bodyRefusal{status: http.StatusRequestEntityTooLarge, typ: errTypeInvalidRequest, code: codeBodyTooLarge, bound: "size",
			msg: fmt.Sprintf("the request body (%d bytes so far) is over the %d MiB the router holds of one API key's request bodies at once (serve --key-bodies-in-flight-mib); send a smaller request", want, perKey/mib)})
	}
	switch bound, others := r.bodies.take(h.key, h.n, n, total, perKey); bound {
	case "key":
		return r.refuseBody(&bodyRefusal{status: http.StatusTooManyRequests, typ: errTypeRateLimit, code: codeBodiesInFlight, retryAfter: true, bound: "key",
			msg: fmt.Sprintf("this API key's other requests in flight hold %.1f MiB of request bodies, and this one's %.1f MiB would pass the %d MiB one key may hold at once (serve --key-bodies-in-flight-mib); wait for some to finish, or send fewer large requests at once",
				float64(others)/mib, float64(want)/mib, perKey/mib)})
	case "total":
		return r.refuseBody(&bodyRefusal{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeBodiesInFlight, retryAfter: true, bound: "total",
			msg: fmt.Sprintf("the router holds %.1f MiB of request bodies in flight and this one's %.1f MiB would pass its %d MiB limit (serve --bodies-in-flight-mib); retry in a moment",
				float64(others)/mib, float64(want)/mib, total/mib)})
	}
	h.n = want
	return nil
}

// take adds n bytes to what key's request holds already (had), unless that
// passes the key's bound (perKey) or the total: then bound says which
// ("key", "total") and others is what the other requests hold of it.
func (b *bodyBudget) take(key string, had, n, total, perKey int64) (bound string, others int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if perKey > 0 && b.byKey[key]+n > perKey {
		return "key", b.byKey[key] - had
	}
	if total > 0 && b.held+n > total {
		return "total", b.held - had
	}
	b.held += n
	if key != "" {
		if b.byKey == nil {
			b.byKey = map[string]int64{}
		}
		b.byKey[key] += n
	}
	return "", 0
}

// give returns n bytes key's request held.
func (b *bodyBudget) give(key string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	if key != "" {
		if b.byKey[key] -= n; b.byKey[key] <= 0 {
			delete(b.byKey, key)
		}
	}
}

func (r *Router) refuseBody(e *bodyRefusal) error {
	r.metrics.bodiesRefused.WithLabelValues(e.bound).Inc()
	return e
}

// release gives back what h holds; it is safe to call on a hold of nothing.
func (h *bodyHold) release() {
	if h.n == 0 {
		return
	}
	h.r.bodies.give(h.key, h.n)
	h.n = 0
}

// holdingReader takes each chunk it reads from the budget: a body with no
// Content-Length is refused as soon as it crosses a bound, not once whole.
type holdingReader struct {
	rd   io.Reader
	hold *bodyHold
}

func (h *holdingReader) Read(p []byte) (int, error) {
	n, err := h.rd.Read(p)
	if n > 0 {
		if gerr := h.hold.grow(int64(n)); gerr != nil {
			return 0, gerr
		}
	}
	return n, err
}
