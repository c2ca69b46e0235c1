package router

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// engineTransport is the HTTP/1.1 client for one worker's engine, over
// connections kept alive between requests. On TCP a request is written and
// its answer read on the caller's goroutine; net/http's Transport handed
// every request to a writer goroutine and every answer's head through a
// reader goroutine, which cost small requests a tenth of their throughput
// through the router (BenchmarkSmallRPS64; docs/measurements.md). The
// protocol is the standard library's (Request.Write, ReadResponse); only
// the pooling is here.
type engineTransport struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	addr string
	// open holds a token per open connection: at most cap(open).
	open chan struct{}
	// freed wakes a request waiting for a connection when one is put back
	// idle.
	freed chan struct{}

	mu sync.Mutex
	// idle holds the connections waiting for a request, newest last.
	idle []*engineConn
	// retired is set once the worker left: connections are closed when
	// their answer ends instead of kept.
	retired bool
}

// engineIdleTimeout is how long a connection may wait idle before it is
// closed instead of reused: engines close theirs sooner or later.
const engineIdleTimeout = 90 * time.Second

type engineConn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
	// closeUnblocks is set for a connection whose Close ends a read or
	// write blocked on it at once (TCP; not a tunnel through SSH).
	closeUnblocks bool
	idleSince     time.Time
}

func newEngineTransport(addr string, maxConns int, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *engineTransport {
	return &engineTransport{dial: dial, addr: addr, open: make(chan struct{}, maxConns), freed: make(chan struct{}, 1)}
}

// RoundTrip sends req and reads the answer's head. A connection that had
// served a request before and ends before any byte of the answer is one the
// engine closed while it was idle (llama-server closes a kept-alive
// connection after a stream without saying so): the request goes again on
// another connection, until one that is new has failed.
func (t *engineTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for {
		c, reused, err := t.conn(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := t.exchange(c, req)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if !reused || !closedUnderUs(err) || req.GetBody == nil && req.Body != nil {
			return nil, err
		}
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, gerr
			}
			req = req.Clone(ctx)
			req.Body = body
		}
	}
}

// closedUnderUs reports whether err is how a connection closed by the
// engine before the request reached it ends: EOF before an answer, or a
// reset.
func closedUnderUs(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// exchange writes req on c and reads the answer's head; the answer's body
// gives c back when it is read to its end, or closes it when it is closed
// before. On an error c is closed.
func (t *engineTransport) exchange(c *engineConn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	// The request's context ends the exchange where it stands: the
	// connection is closed under the read or write that waits.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	var resp *http.Response
	var err error
	if c.closeUnblocks {
		resp, err = sendAndReadHead(c, req)
	} else {
		// A tunnel through SSH ends a read blocked on it only when the
		// node answers the close, which a silent node never does: the
		// head is read on a goroutine the request can leave behind, so
		// that a request the hedge took back goes to another worker now.
		// (A body's reads stay on the caller's goroutine, as they were
		// with net/http's Transport.)
		type head struct {
			resp *http.Response
			err  error
		}
		got := make(chan head, 1)
		go func() {
			resp, err := sendAndReadHead(c, req)
			got <- head{resp, err}
		}()
		select {
		case h := <-got:
			resp, err = h.resp, h.err
		case <-ctx.Done():
			// Counted closed now, as the close is asked now: the next
			// request to this worker must not wait for a silent node.
			stop()
			t.discard(c)
			return nil, context.Cause(ctx)
		}
	}
	if err != nil {
		stop()
		t.discard(c)
		return nil, err
	}
	resp.Body = &engineBody{body: resp.Body, c: c, t: t, stop: stop, keep: !resp.Close && !req.Close}
	return resp, nil
}

// sendAndReadHead writes req on c and reads the head of its answer.
func sendAndReadHead(c *engineConn, req *http.Request) (*http.Response, error) {
	err := req.Write(c.bw)
	if err == nil {
		err = c.bw.Flush()
	}
	if err == nil {
		// Whether any byte of an answer came decides whether the request
		// may go again (RoundTrip); ReadResponse reports an end before
		// the first as an unexpected EOF, like one in the middle.
		_, err = c.br.Peek(1)
	}
	for err == nil {
		resp, err := http.ReadResponse(c.br, req)
		// An interim answer (100 Continue, 103 Early Hints) comes before
		// the one that counts.
		if err != nil || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, err
		}
	}
	return nil, err
}

// conn is an idle connection, or a new one when there is none and fewer
// than the most are open; else it waits for one to be freed.
func (t *engineTransport) conn(ctx context.Context) (c *engineConn, reused bool, err error) {
	for {
		if c := t.takeIdle(); c != nil {
			return c, true, nil
		}
		select {
		case t.open <- struct{}{}:
			nc, err := t.dial(ctx, "tcp", t.addr)
			if err != nil {
				<-t.open
				return nil, false, &dialError{err: err} // see retry.go
			}
			_, tcp := nc.(*net.TCPConn)
			// One read of the socket brings all a fast engine has sent
			// since the last, up to the copy loop's buffer.
			return &engineConn{Conn: nc, br: bufio.NewReaderSize(nc, streamReadBytes), bw: bufio.NewWriterSize(nc, 4<<10), closeUnblocks: tcp}, false, nil
		case <-t.freed:
		case <-ctx.Done():
			return nil, false, context.Cause(ctx)
		}
	}
}

// takeIdle is the newest idle connection that has not waited too long.
func (t *engineTransport) takeIdle() *engineConn {
	var stale []*engineConn
	defer func() {
		for _, c := range stale {
			t.discard(c)
		}
	}()
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.idle) > 0 {
		c := t.idle[len(t.idle)-1]
		t.idle = t.idle[:len(t.idle)-1]
		if time.Since(c.idleSince) >= engineIdleTimeout {
			stale = append(stale, c)
			continue
		}
		if len(t.idle) > 0 {
			// Two put back at once woke one waiter: the next one looks
			// too.
			t.signalFreed()
		}
		return c
	}
	return nil
}

func (t *engineTransport) putIdle(c *engineConn) {
	c.idleSince = time.Now()
	t.mu.Lock()
	retired := t.retired
	if !retired {
		t.idle = append(t.idle, c)
	}
	t.mu.Unlock()
	if retired {
		t.discard(c)
		return
	}
	t.signalFreed()
}

// discard closes c and frees its place under the cap. It takes no lock: a
// tunnel's Close writes to the node, and a request for another connection
// must not wait on that.
func (t *engineTransport) discard(c *engineConn) {
	c.Close()
	<-t.open
}

func (t *engineTransport) signalFreed() {
	select {
	case t.freed <- struct{}{}:
	default:
	}
}

// CloseIdleConnections closes the connections waiting for a request; those
// in use are kept when their answer ends.
func (t *engineTransport) CloseIdleConnections() { t.close(false) }

// retire closes the connections of a worker that left: those waiting now,
// those in use when their answer ends.
func (t *engineTransport) retire() { t.close(true) }

func (t *engineTransport) close(retire bool) {
	t.mu.Lock()
	t.retired = t.retired || retire
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, c := range idle {
		t.discard(c)
	}
}

// engineBody is an answer's body: read to its end, it gives its connection
// back for the next request; closed before, it closes the connection (the
// rest of a stream is not worth reading).
type engineBody struct {
	body io.ReadCloser
	c    *engineConn
	t    *engineTransport
	// stop ends the watch on the request's context.
	stop func() bool
	// keep is whether the connection may serve another request.
	keep bool
	// end is bodyOpen until the body ends: bodyRead at its end, else
	// bodyClosed.
	end atomic.Int32
}

const (
	bodyOpen int32 = iota
	bodyRead
	bodyClosed
)

func (b *engineBody) Read(p []byte) (int, error) {
	switch b.end.Load() {
	case bodyRead:
		return 0, io.EOF
	case bodyClosed:
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.release(bodyRead)
	case err != nil:
		b.release(bodyClosed)
	}
	return n, err
}

func (b *engineBody) Close() error {
	b.release(bodyClosed)
	return nil
}

// release gives the connection back, when the body was read to its end and
// the connection may be kept, or closes it; once. A watch on the request's
// context that fired has closed it already.
func (b *engineBody) release(end int32) {
	if !b.end.CompareAndSwap(bodyOpen, end) {
		return
	}
	keep := end == bodyRead && b.keep
	if b.stop() && keep {
		b.t.putIdle(b.c)
		return
	}
	b.t.discard(b.c)
}
