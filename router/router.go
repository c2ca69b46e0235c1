// Package router is fleet's embedded OpenAI-compatible proxy: it keeps the
// set of ready backends, picks one per request, forwards the body untouched
// but for the model name (each engine gets the name it serves), streams the
// answer back chunk by chunk and measures every request. Answers pass through
// byte for byte, except that they carry the model name the client asked for,
// and that chat completions of a model that opts into reasoning
// normalisation come from every worker in one shape.
package router

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"fleet"
	"fleet/router/keylimit"
	"fleet/router/reasoning"

	"github.com/prometheus/client_golang/prometheus"
)

// Backend is one ready worker as the router sees it.
type Backend struct {
	Name  string // worker name "NODE/MODEL"
	Model string // model ID it serves
	// ServedName is the name the engine answers to (vLLM
	// --served-model-name, llama-server -a, an Ollama tag); "" means Model.
	// Request bodies are rewritten to it.
	ServedName string
	Engine     fleet.EngineKind
	Addr       string // "127.0.0.1:18001" as seen from the node
	// Dial reaches Addr; nil means a plain net.Dialer, else e.g. an SSH
	// direct-tcpip tunnel through the node's connection.
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	Context int // tokens the worker can hold
	Slots   int // concurrent requests it serves
	// KVPool is the tokens all its requests in flight share, 0 when each
	// slot holds its own Context: llama-server's -c under --kv-unified
	// (kvpool.go).
	KVPool int
}

// Options configure a Router. Zero values pick the defaults documented on
// each field.
type Options struct {
	Logger *slog.Logger
	// MaxBodyBytes caps a request body (default 16 MiB); larger gets 413.
	MaxBodyBytes int64
	// MaxBodiesInFlight bounds the bytes of request bodies the router holds
	// at once (default DefaultBodiesInFlight; negative: no bound): a body
	// that would pass it gets 503, one larger than it 413.
	// MaxKeyBodiesInFlight bounds one API key's (default
	// DefaultKeyBodiesInFlight; negative: no bound): 429 beyond it, 413
	// for a body larger than it. A body is held from its first byte until
	// its request ends.
	MaxBodiesInFlight    int64
	MaxKeyBodiesInFlight int64
	// BodyTimeout is how long a client has to send the whole request body
	// once its handler runs (default 20 s); slower gets 408 and the
	// connection closes, so trickled bodies cannot hold connections.
	BodyTimeout time.Duration
	// WriteTimeout is how long a write of an answer to its client may
	// block, up to a sixteenth more (default DefaultWriteTimeout;
	// negative: no limit). A client
	// that reads nothing for that long, once the connection's buffers are
	// full, is cut and its engine request cancelled, so a client that
	// never reads cannot hold an engine slot for ever; it is counted in
	// fleet_router_client_write_timeouts_total.
	WriteTimeout time.Duration
	// Registerer receives the router's metrics. Nil means a private registry.
	// When it is also a prometheus.Gatherer, /metrics serves it.
	Registerer prometheus.Registerer
	// OnSample gets one Sample{Kind:"request"} per forwarded request.
	OnSample func(fleet.Sample)
	// QueueTimeout is how long a request may wait for a free slot, or for
	// a worker that is coming (see SetOutlook), before a 429 or 503
	// (default 30 s).
	QueueTimeout time.Duration
	// QueueSize bounds the waiting requests per model (default 256).
	QueueSize int
	// RetryAfter is the hint sent with 503 and 429 (default 2 s).
	RetryAfter time.Duration
	// ExtraConns is how many connections beyond Slots the router may open to
	// one backend (default 2): llama-server's HTTP pool is slots+4 threads,
	// and a keep-alive connection beyond it stalls.
	ExtraConns int
	// MaxRetries bounds re-sends to another worker after one took the
	// request and failed before answering (default 2; -1 disables them). A
	// worker that could not be reached at all is always left for another,
	// uncounted (retry.go).
	MaxRetries int
	// Policy names the scheduling policy: "fleet" (default),
	// "fleet-no-prefix", "p2c-least-loaded", "round-robin", "random",
	// "session-sticky", "cache-aware", "least-loaded" (PolicyNames).
	Policy string
	// FailureThreshold failures within FailureWindow cool a backend down
	// (defaults 3 and 30 s). A refused connection cools it down at once.
	FailureThreshold int
	FailureWindow    time.Duration
	// Cooldown is how long a failing backend rests before a health check
	// may bring it back, and the time between checks (default 5 s).
	Cooldown time.Duration
	// Keys, when set, requires an API key, as "Authorization: Bearer KEY"
	// or Anthropic's "x-api-key: KEY", on every endpoint but /healthz
	// (/metrics: see MetricsOpenLoopback); neither header reaches an engine.
	Keys KeyVerifier
	// Seed makes the random policies reproducible (0 = time-based).
	Seed uint64
	// OnNoFirstByte is told when a request got no first byte from a worker
	// within its hedge deadline (see hedge.go), so the hub can check the
	// worker's node. May be nil.
	OnNoFirstByte func(backend string)
	// EngineLoadMaxAge is how long an ObserveEngineLoad figure counts
	// (default 15 s: three of the hub's 5 s scrape intervals, so one missed
	// scrape does not drop it); older ones are ignored.
	EngineLoadMaxAge time.Duration
	// OnUsage gets each answered request's tokens (usage.go); it must not
	// block. May be nil.
	OnUsage func(Usage)
	// MetricsOpenLoopback leaves /metrics open to loopback clients when
	// Keys is set (a local Prometheus); others need a key as on /v1.
	MetricsOpenLoopback bool
	// Health answers /healthz: its status code and JSON body (nil: 200,
	// {"status":"ok"}). A hub of several says its role there, and 503
	// when it cannot route.
	Health func() (code int, body []byte)
}

// KeyVerifier checks an API key; name identifies the key to the caller (it is
// never a metric label: key names are not for anonymous /metrics readers).
type KeyVerifier interface {
	VerifyAPIKey(ctx context.Context, key string) (name string, ok bool, err error)
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 16 << 20
	}
	if o.MaxBodiesInFlight == 0 {
		o.MaxBodiesInFlight = DefaultBodiesInFlight
	}
	if o.MaxKeyBodiesInFlight == 0 {
		o.MaxKeyBodiesInFlight = DefaultKeyBodiesInFlight
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.QueueTimeout <= 0 {
		o.QueueTimeout = 30 * time.Second
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 256
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = 2 * time.Second
	}
	if o.ExtraConns <= 0 {
		o.ExtraConns = 2
	}
	switch {
	case o.MaxRetries < 0:
		o.MaxRetries = 0
	case o.MaxRetries == 0:
		o.MaxRetries = 2
	}
	if o.FailureThreshold <= 0 {
		o.FailureThreshold = 3
	}
	if o.FailureWindow <= 0 {
		o.FailureWindow = 30 * time.Second
	}
	if o.Cooldown <= 0 {
		o.Cooldown = 5 * time.Second
	}
	if o.EngineLoadMaxAge <= 0 {
		o.EngineLoadMaxAge = 15 * time.Second
	}
	return o
}

// BackendStats are a backend's live figures for the console.
type BackendStats struct {
	Name  string
	Model string
	// InFlight is the router's own requests on the backend.
	InFlight int
	// Slots is the usable slots: the configured count, capped by the
	// engine's own while its load observation is fresh.
	Slots int
	// EngineRunning and EngineWaiting are what the engine last reported
	// (ObserveEngineLoad), 0 when it never did or the figure is stale.
	EngineRunning int
	EngineWaiting int
	Draining      bool
	// Cooling is true while the backend rests after failures: from the
	// failure that cooled it until a health check passes.
	Cooling bool
	// TokPerSec is the per-request decode speed a new request would get at
	// the backend's current load; ITLms likewise.
	TokPerSec float64
	ITLms     float64
	// SpeedMeasured is false while TokPerSec, ITLms and PredictedTTFTms
	// are only the speed model's prior (no request measured and no bench
	// or engine figure seeded since the router started): the scheduler
	// needs a guess, a person reading them needs to know it is one.
	SpeedMeasured bool
	// TTFTms is the measured median time to first token of the backend's
	// recent requests, from the moment the router sent each (0 before
	// any); PredictedTTFTms is what the speed model expects for a short
	// prompt at the current load.
	TTFTms          float64
	PredictedTTFTms float64
	// Recent per-request measurements, oldest first.
	TTFTHistory []float64
	ITLHistory  []float64
	// CacheHit is cached over prompt tokens as the engine reported them
	// (cached_tokens, cache_n); CacheHitKnown is false until it did.
	CacheHit      float64
	CacheHitKnown bool
}

// backend is a Backend plus the router's connection pool for it. The mutable
// fields are guarded by the pool's lock (pool.go).
type backend struct {
	cfg       Backend
	base      url.URL
	transport *engineTransport
	// dial is the current way to reach Addr; the transport reads it on
	// every new connection.
	dial      atomic.Pointer[dialFunc]
	observers backendObservers

	// requests forwarded to it and not yet finished, with their predicted
	// end, so the scheduler knows when the next slot frees.
	active map[*flight]struct{}
	// checking is set while a health checker watches it (health.go).
	checking bool
	// gone is set once it left the ready set (forgetIfGone).
	gone atomic.Bool
	// notServed holds the paths it answered "not found" (endpoints.go).
	notServed map[string]bool
}

type backendObservers struct {
	ttft, itl, e2e prometheus.Observer
	inFlight       prometheus.Gauge
	tokens         tokenCounters
}

// cooling reports whether the backend rests after failures. It does until a
// health check passes (health.go), not only until coolingUntil, which is
// when the next check is due: selection, the hedge and Stats must agree.
func (w *worker) cooling() bool { return !w.coolingUntil.IsZero() }

// worker is what the router remembers about a name across SetBackends
// calls: load, drain flag, failures and measured speed.
type worker struct {
	inFlight     int
	drained      bool
	failures     []time.Time
	coolingUntil time.Time
	speed        *SpeedModel
	ttftHistory  ring
	itlHistory   ring
	lastUsed     time.Time
	// area is ∫load dt up to areaAt, in request-seconds.
	area   float64
	areaAt time.Time
	// engine is the engine's own report of its load.
	engine engineView
	// prefix is which prompt prefixes its engine is thought to hold.
	prefix *PrefixIndex
	// kvHeld is the KV tokens its requests in flight may hold, tokenScale
	// its engine's tokens per router token (0 unknown), kvRefusedAt the
	// held tokens its engine last refused at (0 never) and kvRefusing
	// whether it refused since its last request that ended well
	// (kvpool.go).
	kvHeld      int
	tokenScale  float64
	kvRefusedAt int
	kvRefusing  bool
	// ready is whether the name is in the ready set. Outside it, the state
	// is kept only while requests are in flight, while drained, or when it
	// was seeded before joining (an admission bench runs on probation):
	// see sweepLocked.
	ready  bool
	seeded bool
	// outside is when it left the ready set, or was seeded or drained
	// outside it: beyond maxParked such workers, the oldest go first.
	outside time.Time
}

// maxParked bounds the workers outside the ready set, with nothing in
// flight, whose state is kept because they are drained or were seeded.
const maxParked = 64

// Router is the OpenAI-compatible proxy. It is safe for concurrent use.
type Router struct {
	opts     Options
	log      *slog.Logger
	metrics  *metrics
	gatherer prometheus.Gatherer
	handler  http.Handler

	// The parts, each with its own lock (catalog.go lists them); the
	// Router holds none of its own.
	catalog catalog
	pool    *pool
	sched   *scheduler
	outputs outputEstimates
	hedge   hedgeState
	// limits are the API keys' limits and what each spent (keylimit/).
	limits keylimit.Book
	// engines holds each worker's last engine metrics (enginemetrics.go).
	engines engineMetrics
	// bodies is the request bodies held in flight (bodymem.go).
	bodies bodyBudget
}

// New builds a router with no models and no backends. An unknown
// Options.Policy is an error.
func New(opts Options) (*Router, error) {
	// A mistyped policy is refused, not replaced: the operator asked for
	// a behaviour the router would silently not have.
	policy, err := NewPolicy(opts.Policy)
	if err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	r := &Router{opts: opts, log: opts.Logger}
	reg := opts.Registerer
	if reg == nil {
		private := prometheus.NewRegistry()
		reg, r.gatherer = private, private
	} else if g, ok := reg.(prometheus.Gatherer); ok {
		r.gatherer = g
	} else {
		r.gatherer = prometheus.DefaultGatherer
	}
	r.metrics = newMetrics(reg)
	seed := opts.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	r.pool = newPool(&r.opts, r.log, r.metrics, func(name string) {
		r.engines.forget(name)
		if p, ok := policy.(workerForgetter); ok {
			p.forgetWorker(name)
		}
	})
	r.sched = newScheduler(policy, newRNG(seed), r.pool, r.metrics, &r.opts)
	r.handler = r.routes()
	return r, nil
}

// Handler serves the OpenAI endpoints, /metrics and /healthz.
func (r *Router) Handler() http.Handler { return r.handler }

func (r *Router) routes() http.Handler {
	mux := http.NewServeMux()
	for _, path := range routedPaths() {
		mux.HandleFunc(path, r.serveInference)
	}
	mux.HandleFunc("/v1/models", r.serveModels)
	mux.Handle("/metrics", r.metricsHandler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.opts.Health == nil {
			_, _ = w.Write([]byte(`{"status":"ok"}`))
			return
		}
		code, body := r.opts.Health()
		w.WriteHeader(code)
		_, _ = w.Write(body)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, messagesPath+"/") {
			// Anthropic's clients (message batches) read its shape only.
			w = &apiWriter{ResponseWriter: w, api: apiAnthropic}
		}
		writeError(w, http.StatusNotFound, errTypeInvalidRequest, "unknown_url", "",
			fmt.Sprintf("no endpoint %s %s; the router serves POST %s and GET /v1/models", req.Method, req.URL.Path, strings.Join(routedPaths(), ", ")), 0)
	})
	return mux
}

// SetModels replaces the known models. A known model with no ready backend
// answers 503; a name no model has answers 404. A model whose Reasoning is
// "inline" or "field" has its chat completions normalised to that shape on
// every worker. An unknown Reasoning value is an error and changes nothing.
func (r *Router) SetModels(models []fleet.Model) error {
	modes := map[string]reasoning.Mode{}
	for _, m := range models {
		mode, err := reasoning.ParseMode(m.Reasoning)
		if err != nil {
			return fmt.Errorf("model %q: %w (the router kept its previous models)", m.ID, err)
		}
		if mode != reasoning.Off {
			modes[m.ID] = mode
		}
	}
	names := map[string]string{}
	for _, m := range models {
		names[m.ID] = m.ID
		for _, a := range m.Aliases {
			if _, taken := names[a]; !taken {
				names[a] = m.ID
			}
		}
	}
	for _, m := range models {
		r.metrics.initModel(m.ID)
	}
	r.catalog.set(models, names, modes)
	for id, mode := range modes {
		r.log.Info("normalising reasoning in chat completions", "model", id, "shape", string(mode))
	}
	return nil
}

// SetBackends replaces the ready set. Requests in flight on a removed backend
// finish on it; a backend whose address is unchanged keeps its connections.
func (r *Router) SetBackends(bs []Backend) { r.setBackends(bs, nil, false) }

// SetBackendsAndOutlook is SetBackends and SetOutlook at once, so a worker
// that moves from coming to ready (or back) is never seen as neither.
func (r *Router) SetBackendsAndOutlook(bs []Backend, byModel map[string]Outlook) {
	r.setBackends(bs, byModel, true)
}

func (r *Router) setBackends(bs []Backend, byModel map[string]Outlook, outlook bool) {
	left, models := r.sched.replace(bs, byModel, outlook)
	// Removed backends: close their idle connections now; busy ones close
	// when their response body is done.
	for _, b := range left {
		b.transport.retire()
	}
	for _, m := range models {
		r.sched.dispatch(m)
	}
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// sameEngine reports whether two configurations describe one engine in
// every field but how it is dialled, so its backend can be kept as is.
func sameEngine(a, b Backend) bool {
	return a.Name == b.Name && a.Model == b.Model && a.ServedName == b.ServedName && a.Engine == b.Engine && a.Addr == b.Addr &&
		a.Context == b.Context && a.Slots == b.Slots && a.KVPool == b.KVPool
}

func (b *backend) setDial(dial dialFunc) {
	if dial == nil {
		d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
		dial = d.DialContext
	}
	b.dial.Store(&dial)
}

// workerForgetter is a policy that keeps state per worker name.
type workerForgetter interface{ forgetWorker(name string) }

// Drain stops new requests to the named backend; requests in flight finish.
// It holds across SetBackends until Undrain.
func (r *Router) Drain(name string) { r.pool.drain(name) }

// Undrain lets the named backend take requests again.
func (r *Router) Undrain(name string) {
	r.pool.undrain(name)
	r.dispatchQueued()
}

// InFlight is the number of requests being served by the named backend.
func (r *Router) InFlight(name string) int {
	n, _ := r.pool.inFlight(name)
	return n
}

// WaitIdle returns when the named backend has no request in flight, or with
// ctx's error when ctx ends first.
func (r *Router) WaitIdle(ctx context.Context, name string) error {
	for {
		n, ch := r.pool.inFlight(name)
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to finish %d request(s): %w", name, n, ctx.Err())
		case <-ch:
		}
	}
}

// Stats returns live figures for every backend of the ready set.
func (r *Router) Stats() []BackendStats { return r.pool.stats(time.Now()) }

// SeedSpeed teaches the scheduler a worker's speed from a bench or from the
// engine's own metrics before the router has measured traffic on it.
func (r *Router) SeedSpeed(name string, points ...SpeedPoint) { r.pool.seedSpeed(name, points) }

// median of vs, 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ring keeps the most recent measurements for sparklines.
type ring struct {
	buf  [historyLen]float64
	next int
	full bool
}

const historyLen = 60

func (h *ring) add(v float64) {
	h.buf[h.next] = v
	h.next++
	if h.next == historyLen {
		h.next, h.full = 0, true
	}
}

func (h *ring) values() []float64 {
	if !h.full {
		return slices.Clone(h.buf[:h.next])
	}
	out := make([]float64, 0, historyLen)
	out = append(out, h.buf[h.next:]...)
	return append(out, h.buf[:h.next]...)
}
