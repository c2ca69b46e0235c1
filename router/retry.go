package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
)

// The retry rules, in one place. A request may go to another worker only
// while nothing of an answer has reached its client:
//   - a worker that could not be reached (its connection failed to open)
//     never saw the request: another worker is always tried, and the
//     attempt is not counted against MaxRetries (each such worker is left
//     out of the request's next choice, so this ends);
//   - a worker that took the request and failed before answering (no
//     response, a 5xx, an unreadable answer, no first byte in time) may
//     have spent work on it: another is tried at most MaxRetries times;
//   - a worker whose engine said its KV pool was full is not failing: the
//     request queues again, for it or another, at most
//     maxOverflowRequeues times, neither counted against MaxRetries nor
//     leaving the worker out;
//   - once the status line went to the client, never: a broken stream ends
//     with an error event, a broken body with a cut connection (forward).

// forwardResult is how an attempt ended, for serveInference.
type forwardResult struct {
	// retry: it failed before anything reached the client.
	retry bool
	// dial: it failed because the worker could not be reached.
	dial bool
	// notServed: the worker's engine does not serve the path.
	notServed bool
	// full: the worker's KV pool was full; the request queues again.
	full bool
	err  error
	// answer ends the request with this answer instead (the client went
	// away before the worker answered).
	answer *answerError
}

// mayRetry applies the rules to a failed attempt; retries counts the
// attempts charged to MaxRetries so far.
func (r *Router) mayRetry(res forwardResult, retries *int) bool {
	if !res.retry {
		return false
	}
	if res.dial {
		return true
	}
	if *retries >= r.opts.MaxRetries {
		return false
	}
	*retries++
	return true
}

// dialError marks a failure to open a connection to a worker: the request
// never left the router.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func isDialError(err error) bool {
	var d *dialError
	return errors.As(err, &d)
}

// classify judges an attempt's round trip before anything of its answer
// reached the client: the client gone, the worker unreachable or failing
// (a 5xx), or its engine not serving the path are ended here (failed), the
// flight released and the worker's failure recorded; any other answer is
// the client's (resp, with its body intact).
func (r *Router) classify(f *flight, req *http.Request, resp *http.Response, err error) (res forwardResult, failed bool) {
	b := f.b
	if err != nil {
		r.release(f, nil)
		if req.Context().Err() != nil {
			return forwardResult{answer: clientGone(f.model, b.cfg.Name)}, true
		}
		refused := errors.Is(err, syscall.ECONNREFUSED)
		// A request taken back for want of a first byte left its worker
		// suspect (hedge.go), a hint requests may still wait on;
		// counted as a failure it would cool a worker that is only
		// loaded, and leave the requests taken back from the other
		// worker nowhere to go.
		if _, takenBack := errors.AsType[*errNoFirstByte](err); !takenBack {
			r.recordFailure(b, refused, err)
		}
		return forwardResult{retry: true, dial: isDialError(err), err: fmt.Errorf("%s: %w", b.cfg.Name, err)}, true
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusNotImplemented {
		// An engine that does not serve the path is not failing: it is
		// remembered, and another worker may serve it (endpoints.go).
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if notServedAnswer(resp.StatusCode, snippet) {
			r.release(f, nil)
			r.pool.learnNotServed(b, req.URL.Path)
			resp.Body.Close()
			return forwardResult{retry: true, notServed: true, err: fmt.Errorf("%s does not serve %s: %s", b.cfg.Name, req.URL.Path, bytes.TrimSpace(snippet))}, true
		}
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(snippet), resp.Body), resp.Body}
	}
	if resp.StatusCode >= 500 {
		// Nothing reached the client yet, so another worker may answer.
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if isOverflowAnswer(snippet) {
			// Full, not failing: the request queues again (kvpool.go).
			r.pool.refusedFull(f)
			r.release(f, nil)
			resp.Body.Close()
			return forwardResult{retry: true, full: true, err: fmt.Errorf("%s refused it, its KV pool full: %s", b.cfg.Name, bytes.TrimSpace(snippet))}, true
		}
		r.release(f, nil)
		r.recordFailure(b, false, fmt.Errorf("status %s", resp.Status))
		resp.Body.Close()
		return forwardResult{retry: true, err: fmt.Errorf("%s answered %s: %s", b.cfg.Name, resp.Status, bytes.TrimSpace(snippet))}, true
	}
	return forwardResult{}, false
}
