package router

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// HoldSlot counts one request the hub sends to the named worker around the
// router (a shape request, a bench sweep, an admission check) as that
// worker's load until release is called, so the scheduler does not fill
// the slots those requests occupy: twelve shape requests on a 4-slot worker
// used to leave it looking idle. A worker outside the ready set gets no
// router traffic, so there is nothing to count and release does nothing.
func (r *Router) HoldSlot(worker string) (release func()) {
	f := r.pool.hold(worker, func(model string) Job { return Job{OutputTokens: r.outputs.expected(model, 0)} }, time.Now())
	if f == nil {
		return func() {}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			r.release(f, nil)
			r.pool.forgetIfGone(f.b)
		})
	}
}

// CountingTransport wraps rt so that every request it sends holds a slot
// on the named worker (HoldSlot) until its response body is read to the
// end or closed, or the request fails.
func (r *Router) CountingTransport(rt http.RoundTripper, worker string) http.RoundTripper {
	return &countingTransport{rt: rt, r: r, worker: worker}
}

type countingTransport struct {
	rt     http.RoundTripper
	r      *Router
	worker string
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	release := t.r.HoldSlot(t.worker)
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		release()
		return nil, err
	}
	resp.Body = &releasingBody{ReadCloser: resp.Body, release: release}
	return resp, nil
}

type releasingBody struct {
	io.ReadCloser
	release func()
}

func (b *releasingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

func (b *releasingBody) Close() error {
	b.release()
	return b.ReadCloser.Close()
}
