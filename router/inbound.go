package router

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"fleet/router/keylimit"
	"fleet/router/reasoning"
)

// A request's path through the router, in the order it takes it; each
// stage below is one method, and each ends the request, when it must, by
// returning an *answerError, which serveInference answers, counts and
// writes in one place (answer):
//
//  1. admit: the method, and the API key (authorize);
//  2. read: the body, within the body bounds (bodymem.go, request.go), and
//     what routing needs of it (parseRequest, choiceCount), in one
//     decoding of the JSON;
//  3. route: the model's ID and the request's Job; the key's limits, judged
//     now that the model is known so that a refusal is counted under it
//     (keylimits.go); the workers whose engine does not serve the path
//     (endpoints.go);
//  4. attempts: acquire a worker (sched.go), forward through the chain of
//     round trippers (proxy.go, transport.go) and, when the attempt failed
//     before anything reached the client, decide by retry.go's rules
//     whether another worker is tried.

// call is one client request on its way through the router: what it asked
// for, by whom, when it arrived, and what routing made of it. The stages
// fill it in order.
type call struct {
	info requestInfo
	mode reasoning.Mode
	// key names the client's API key, "" when the router takes none.
	key     string
	arrived time.Time
	path    string
	// n is the choices asked for (1 where the endpoint has none).
	n int
	// Set by route: the model's ID, what the scheduler knows of the
	// request, the workers it must not go to, and the tokens it holds of
	// its key's day until it ends.
	model    string
	job      Job
	excluded []string
	held     keylimit.Reservation
	body     []byte
}

// answerError is how a stage ends a request: the status, the metric labels
// it is counted under, and the error written in the request's API shape.
// Status 499 (the client went away) is counted and not written.
type answerError struct {
	status         int
	model, backend string
	typ, code      string
	param, msg     string
	retryAfter     time.Duration
	// hangUp closes the connection after the answer: what the client
	// still sends of its body is not read.
	hangUp bool
	// uncounted: the request asked nothing of a model (a wrong method).
	uncounted bool
}

func (e *answerError) Error() string { return e.msg }

// statusClientGone is nginx's status for a client that went away before
// its answer, which the router counts requests under.
const statusClientGone = 499

func clientGone(model, backend string) *answerError {
	return &answerError{status: statusClientGone, model: model, backend: backend}
}

// serveInference takes a request through the stages, and answers the
// error of the one that ended it.
func (r *Router) serveInference(w http.ResponseWriter, req *http.Request) {
	c := &call{arrived: time.Now(), path: req.URL.Path}
	if api := apiOf(c.path); api != apiOpenAI {
		// Every error this request gets is in its API's shape.
		w = &apiWriter{ResponseWriter: w, api: api}
	}
	hold := &bodyHold{r: r}
	defer hold.release()
	defer func() { r.limits.Settle(c.held) }()

	err := r.admit(w, req, c)
	if err == nil {
		err = r.read(w, req, c, hold)
	}
	if err == nil {
		err = r.route(w, c)
	}
	if err == nil {
		err = r.attempts(w, req, c)
	}
	if err != nil {
		r.answer(w, err)
	}
}

// answer counts a request's error and writes it: the one place a request
// the router ends gets its answer.
func (r *Router) answer(w http.ResponseWriter, e *answerError) {
	if !e.uncounted {
		r.countStatus(e.model, e.backend, e.status)
	}
	if e.status == statusClientGone {
		return
	}
	if e.hangUp {
		w.Header().Set("Connection", "close")
	}
	writeError(w, e.status, e.typ, e.code, e.param, e.msg, e.retryAfter)
}

func (r *Router) countStatus(model, backend string, status int) {
	r.metrics.requests.WithLabelValues(model, backend, strconv.Itoa(status)).Inc()
}

// admit is stage 1: only POST, and only with a valid API key when the
// router takes keys.
func (r *Router) admit(w http.ResponseWriter, req *http.Request, c *call) *answerError {
	if req.Method != http.MethodPost {
		return &answerError{status: http.StatusMethodNotAllowed, uncounted: true, typ: errTypeInvalidRequest, code: codeMethodNotAllows,
			msg: fmt.Sprintf("%s takes POST with a JSON body", req.URL.Path)}
	}
	key, err := r.authorize(w, req)
	c.key = key
	return err
}

// HeaderKeyNotChecked is set on an answer to a request that sent an API
// key to a router that takes none: the key was neither checked nor
// counted, and no key limit applied.
const HeaderKeyNotChecked = "Fleet-Api-Key-Not-Checked"

// KeysNotCheckedNote says why a hub's router takes no keys and what makes
// it take them.
const KeysNotCheckedNote = "this hub's router listens on loopback and was started without --require-keys, " +
	"so it checks no API key and applies no key limit; start it with --require-keys to check keys"

// authorize checks the API key when the router has a KeyVerifier. A refusal
// is counted under the model the request names (refusedModel).
func (r *Router) authorize(w http.ResponseWriter, req *http.Request) (string, *answerError) {
	if r.opts.Keys == nil {
		// A client that sent a key must not take the answer for proof
		// that the key is good, or that its limits hold.
		if req.Header.Get("Authorization") != "" || req.Header.Get("X-Api-Key") != "" {
			w.Header().Set(HeaderKeyNotChecked, KeysNotCheckedNote)
		}
		return "", nil
	}
	auth := req.Header.Get("Authorization")
	key, ok := cutPrefixFold(auth, "Bearer ")
	if !ok || key == "" {
		// Anthropic's clients send the key as x-api-key.
		key = req.Header.Get("X-Api-Key")
	}
	if key == "" {
		return "", &answerError{status: http.StatusUnauthorized, model: r.refusedModel(w, req), typ: errTypeAuthentication, code: codeInvalidAPIKey,
			msg: "no API key: send \"Authorization: Bearer KEY\" or \"x-api-key: KEY\" (an admin creates one with `fleet key create NAME`)"}
	}
	name, valid, err := r.opts.Keys.VerifyAPIKey(req.Context(), key)
	if err != nil {
		r.log.Error("api key check failed", "err", err)
		return "", &answerError{status: http.StatusInternalServerError, model: r.refusedModel(w, req), typ: errTypeServer,
			msg: "the router could not check the API key; retry, and tell the operator if it persists"}
	}
	if !valid {
		return "", &answerError{status: http.StatusUnauthorized, model: r.refusedModel(w, req), typ: errTypeAuthentication, code: codeInvalidAPIKey,
			msg: "the API key is not valid (revoked or mistyped); ask an admin for a key (`fleet key create NAME`)"}
	}
	return name, nil
}

// read is stage 2: the body, held against the body bounds until the
// request ends, and what the router reads of it.
func (r *Router) read(w http.ResponseWriter, req *http.Request, c *call, hold *bodyHold) *answerError {
	hold.key = c.key
	body, err := r.readBody(w, req, hold)
	if err != nil {
		return r.bodyAnswer(err)
	}
	c.body = body
	info, err := parseRequest(body)
	n := 0
	if err == nil {
		n, err = choiceCount(c.path, info.N, info.MaxTokens)
	}
	if err != nil {
		var rerr *requestError
		errors.As(err, &rerr)
		return &answerError{status: http.StatusBadRequest, typ: errTypeInvalidRequest, code: rerr.code, param: rerr.param, msg: rerr.msg}
	}
	c.info, c.n = info, n
	return nil
}

// bodyAnswer is the answer to a body that could not be read whole.
func (r *Router) bodyAnswer(err error) *answerError {
	var refused *bodyRefusal
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &refused):
		e := &answerError{status: refused.status, typ: refused.typ, code: refused.code, msg: refused.msg, hangUp: true}
		if refused.retryAfter {
			e.retryAfter = r.opts.RetryAfter
		}
		return e
	case errors.As(err, &tooBig):
		return &answerError{status: http.StatusRequestEntityTooLarge, typ: errTypeInvalidRequest, code: codeBodyTooLarge,
			msg: fmt.Sprintf("request body is over the router's limit of %d bytes; send a smaller request", r.opts.MaxBodyBytes)}
	case errors.Is(err, errBodyTimeout):
		return &answerError{status: http.StatusRequestTimeout, typ: errTypeInvalidRequest, code: codeBodyTimeout,
			msg: fmt.Sprintf("the request body did not arrive within %s; send it at once after the headers", r.opts.BodyTimeout)}
	}
	r.log.Debug("reading request body failed", "err", err)
	return clientGone("", "")
}

// route is stage 3: the model, the key's limits, and the workers left out
// from the start.
func (r *Router) route(w http.ResponseWriter, c *call) *answerError {
	reserve, known := r.resolve(c)
	if !known {
		return &answerError{status: http.StatusNotFound, model: unknownModel, typ: errTypeInvalidRequest, code: codeModelNotFound, param: "model",
			msg: fmt.Sprintf("the model %q does not exist here; GET /v1/models lists the models this fleet serves", c.info.Model)}
	}
	// The tokens reserved are held until the request ends, however it
	// ends (serveInference settles them).
	var err *answerError
	if c.held, err = r.admitKey(w, c.key, c.path, c.model, reserve); err != nil {
		return err
	}
	// Workers whose engine does not serve the path (or n choices) are left
	// out from the start (endpoints.go).
	excluded, serr := r.pool.endpointExclusions(c.model, c.path, c.n)
	if serr != nil {
		return r.schedAnswer(c.model, serr, nil)
	}
	c.excluded = excluded
	return nil
}

// resolve sets c's model ID, Job and normalisation, and says what the
// request reserves of its key's day; known is false for a model the fleet
// does not serve.
func (r *Router) resolve(c *call) (reserve int64, known bool) {
	info := c.info
	choices := c.n
	if endpointTable[c.path].noCompletion {
		choices = 0
	}
	model, known := r.modelID(info.Model)
	// Context fit is judged on what the client may ask for (max_tokens is
	// a promise the worker must hold), the schedule on what it usually gets.
	c.job = Job{PromptTokens: info.PromptTokens, NeedContext: needContext(info.PromptTokens, info.MaxTokens), Prefix: info.Prefix}
	if !known {
		return 0, false
	}
	c.model = model
	c.job.OutputTokens = r.outputs.expected(model, info.MaxTokens)
	c.job.KVOutput = kvOutput(info.MaxTokens, c.job.OutputTokens)
	c.mode = r.catalog.normalisation(model, c.path)
	return keylimit.ReserveFor(info.PromptTokens, info.MaxTokens, choices, r.largestContext(model)), true
}

// attempts is stage 4: a worker is acquired and sent the request until one
// answers, or retry.go's rules say no other worker may be tried.
func (r *Router) attempts(w http.ResponseWriter, req *http.Request, c *call) *answerError {
	var lastErr error
	retries, requeues := 0, 0
	for attempt := 0; ; attempt++ {
		f, err := r.acquire(req.Context(), c.model, c.job, c.excluded)
		if err != nil {
			return r.schedAnswer(c.model, err, lastErr)
		}
		res := r.forward(w, req, f, c.body, c)
		if res.answer != nil || !res.retry {
			return res.answer
		}
		if res.full && requeues < maxOverflowRequeues {
			requeues++
			r.metrics.retries.WithLabelValues(c.model).Inc()
			r.log.Info("worker's KV pool was full; the request queues again", "model", c.model, "worker", f.b.cfg.Name, "requeues", requeues)
			lastErr = res.err
			continue
		}
		c.excluded = append(c.excluded, f.b.cfg.Name)
		if res.notServed {
			// Learnt, not failed: another worker may serve the path,
			// uncounted; if none does, say so.
			r.log.Info("worker does not serve the endpoint; trying another", "worker", f.b.cfg.Name, "path", c.path)
			if serr := r.excludeNotServing(c); serr != nil {
				return r.schedAnswer(c.model, serr, nil)
			}
			continue
		}
		lastErr = res.err
		if !r.mayRetry(res, &retries) {
			return &answerError{status: http.StatusBadGateway, model: c.model, backend: f.b.cfg.Name, typ: errTypeServer, code: codeUpstreamFailed,
				msg:        fmt.Sprintf("%d worker(s) of model %q failed before answering (last: %v); retry later", attempt+1, c.model, lastErr),
				retryAfter: r.opts.RetryAfter}
		}
		r.metrics.retries.WithLabelValues(c.model).Inc()
		r.log.Info("retrying request on another worker", "model", c.model, "failed", f.b.cfg.Name, "attempt", attempt+1, "err", res.err)
	}
}

// excludeNotServing adds the workers now known not to serve c's path to
// its exclusions, or says why no worker is left that does.
func (r *Router) excludeNotServing(c *call) *schedError {
	more, serr := r.pool.endpointExclusions(c.model, c.path, c.n)
	if serr != nil {
		return serr
	}
	for _, name := range more {
		if !slices.Contains(c.excluded, name) {
			c.excluded = append(c.excluded, name)
		}
	}
	return nil
}

// schedAnswer is the answer to a request the scheduler could give no
// worker; lastErr is the failure of an earlier attempt, if any.
func (r *Router) schedAnswer(model string, err, lastErr error) *answerError {
	var serr *schedError
	if !errors.As(err, &serr) {
		// The client went away while queued: nobody to answer.
		return clientGone(model, "")
	}
	msg := serr.msg
	if lastErr != nil {
		msg += fmt.Sprintf(" (a worker failed before answering: %v)", lastErr)
	}
	var retry time.Duration
	if serr.retryAfter {
		retry = r.opts.RetryAfter
	}
	return &answerError{status: serr.status, model: model, typ: serr.typ, code: serr.code, msg: msg, retryAfter: retry}
}
