package router

import "errors"

// The retry rules, in one place. A request may go to another worker only
// while nothing of an answer has reached its client:
//   - a worker that could not be reached (its connection failed to open)
//     never saw the request: another worker is always tried, and the
//     attempt is not counted against MaxRetries (each such worker is left
//     out of the request's next choice, so this ends);
//   - a worker that took the request and failed before answering (no
//     response, a 5xx, an unreadable answer, no first byte in time) may
//     have spent work on it: another is tried at most MaxRetries times;
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
	err       error
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
