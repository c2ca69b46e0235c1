package router

import (
	"errors"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the router's Prometheus series. Labels stay bounded: models and
// backends come from the fleet file and the ready set, and a name that is
// neither is counted under unknownModel. API key names are not labels: they
// are sensitive, and /metrics is served without a key.
type metrics struct {
	requests   *prometheus.CounterVec
	inFlight   *prometheus.GaugeVec
	ttft       *prometheus.HistogramVec
	itl        *prometheus.HistogramVec
	e2e        *prometheus.HistogramVec
	retries    *prometheus.CounterVec
	queueDepth *prometheus.GaugeVec
	queueWait  *prometheus.HistogramVec
	tokens     *prometheus.CounterVec
	keyLimited *prometheus.CounterVec
	// writeTimeouts counts answers cut because their client read nothing
	// for Options.WriteTimeout.
	writeTimeouts *prometheus.CounterVec
	// bodiesRefused counts bodies refused by the bodies-in-flight bounds.
	bodiesRefused *prometheus.CounterVec
}

// unknownModel is the one label value every model name the router does not
// serve is counted under, so a client cannot grow the series without bound.
const unknownModel = "(unknown)"

// latencyBuckets span a loopback embedding (1 ms) to a starved 27B answer (2 min).
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_router_requests_total", Help: "Requests answered, by model, backend (empty when none was chosen) and HTTP status.",
		}, []string{"model", "backend", "status"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleet_router_in_flight", Help: "Requests currently forwarded to each backend.",
		}, []string{"backend"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleet_router_ttft_seconds", Help: "Time from the request reaching the router to the first token (the first chunk with content, reasoning or a tool call; for a non-streamed answer, the engine's reported prefill time).", Buckets: latencyBuckets,
		}, []string{"model", "backend"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleet_router_itl_seconds", Help: "Mean time per output token after the first, per request.", Buckets: latencyBuckets,
		}, []string{"model", "backend"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleet_router_e2e_seconds", Help: "Time from the request reaching the router to the last response byte.", Buckets: latencyBuckets,
		}, []string{"model", "backend"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_router_retries_total", Help: "Requests re-sent to another backend after a failure before the first byte.",
		}, []string{"model"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleet_router_queue_depth", Help: "Requests waiting in the router for a backend slot.",
		}, []string{"model"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleet_router_queue_wait_seconds", Help: "Time requests spent waiting in the router's queue.", Buckets: latencyBuckets,
		}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_router_tokens_total", Help: "Tokens of answered requests as the engines reported them, by model, backend and type: prompt, cached (the prompt's part the engine reused: cache hits) and completion.",
		}, []string{"model", "backend", "type"}),
		keyLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_router_key_limited_total", Help: "Requests refused with 429 because their API key's limit was spent, by limit (requests a minute, tokens a day).",
		}, []string{"limit"}),
		writeTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_router_client_write_timeouts_total", Help: "Answers cut, and their engine request cancelled, because the client read nothing for the write timeout (serve --write-timeout); they also count as status 499.",
		}, []string{"model"}),
		bodiesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_router_bodies_refused_total", Help: "Request bodies refused by the bounds on bodies held in flight, by bound: total (503), key (429) or size (413, larger than a bound).",
		}, []string{"bound"}),
	}
	m.requests = register(reg, m.requests)
	m.inFlight = register(reg, m.inFlight)
	m.ttft = register(reg, m.ttft)
	m.itl = register(reg, m.itl)
	m.e2e = register(reg, m.e2e)
	m.retries = register(reg, m.retries)
	m.queueDepth = register(reg, m.queueDepth)
	m.queueWait = register(reg, m.queueWait)
	m.tokens = register(reg, m.tokens)
	m.keyLimited = register(reg, m.keyLimited)
	m.writeTimeouts = register(reg, m.writeTimeouts)
	m.bodiesRefused = register(reg, m.bodiesRefused)
	for _, bound := range []string{"total", "key", "size"} {
		m.bodiesRefused.WithLabelValues(bound)
	}
	for _, limit := range []string{"requests", "tokens"} {
		m.keyLimited.WithLabelValues(limit)
	}
	return m
}

// tokenCounters are a backend's fleet_router_tokens_total series.
type tokenCounters struct{ prompt, cached, completion prometheus.Counter }

func (m *metrics) tokenCounters(b Backend) tokenCounters {
	return tokenCounters{
		prompt:     m.tokens.WithLabelValues(b.Model, b.Name, "prompt"),
		cached:     m.tokens.WithLabelValues(b.Model, b.Name, "cached"),
		completion: m.tokens.WithLabelValues(b.Model, b.Name, "completion"),
	}
}

// backendVecs are the series labelled by backend.
func (m *metrics) backendVecs() []*prometheus.MetricVec {
	return []*prometheus.MetricVec{m.requests.MetricVec, m.inFlight.MetricVec, m.ttft.MetricVec, m.itl.MetricVec, m.e2e.MetricVec, m.tokens.MetricVec}
}

// forgetBackend removes a backend's series: a worker gone from the fleet
// does not stay on /metrics for ever, nor does a renamed one.
func (m *metrics) forgetBackend(name string) {
	for _, v := range m.backendVecs() {
		v.DeletePartialMatch(prometheus.Labels{"backend": name})
	}
}

// backendNames lists the backends that have series, but "" (a request no
// backend was chosen for).
func (m *metrics) backendNames() []string {
	seen := map[string]bool{}
	for _, v := range m.backendVecs() {
		ch := make(chan prometheus.Metric)
		go func() {
			v.Collect(ch)
			close(ch)
		}()
		for s := range ch {
			var d dto.Metric
			if s.Write(&d) != nil {
				continue
			}
			for _, l := range d.GetLabel() {
				if l.GetName() == "backend" && l.GetValue() != "" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// initModel makes a model's queue and retry series exist at zero before
// its first queued or retried request, so dashboards and alerts see 0, not
// "no data". Models come from the fleet file: bounded.
func (m *metrics) initModel(id string) {
	m.queueDepth.WithLabelValues(id)
	m.queueWait.WithLabelValues(id)
	m.retries.WithLabelValues(id)
	m.writeTimeouts.WithLabelValues(id)
}

// register adopts an identical collector already in reg, so two routers (a
// hub restart in-process, tests) can share one registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
