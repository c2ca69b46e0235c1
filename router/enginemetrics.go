package router

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"fleet"
)

// engineMetrics keeps each worker's engine metrics as last scraped (the hub
// reads them through the node's transport every few seconds, so a
// Prometheus scrape of /metrics never waits on a node), to serve them
// relabelled with node, worker and engine. Only engine families are kept
// (vLLM's vllm:*, llama-server's llamacpp:*), at most maxEngineSeries
// series a worker, so an engine cannot grow the hub's exposition.
type engineMetrics struct {
	mu       sync.Mutex
	byWorker map[string]engineSnapshot
}

type engineSnapshot struct {
	at   time.Time
	fams []*dto.MetricFamily
}

// maxEngineSeries bounds one worker's kept series; vLLM exports about 60
// families, most of them one series per engine index.
const maxEngineSeries = 1000

// engineMetricPrefixes are the engines' own metric namespaces.
var engineMetricPrefixes = []string{"vllm:", "llamacpp:"}

// relabelled are the labels the hub adds; an engine's own label of the
// same name (vLLM's engine="0", its data-parallel index) is kept as
// exported_NAME, as Prometheus does on a clash.
var relabelled = []string{"node", "worker", "engine"}

// ObserveEngineMetrics keeps a worker's engine metrics, the Prometheus text
// its engine served at at, to serve on /metrics labelled node, worker
// (NODE/MODEL) and engine. A reading older than EngineLoadMaxAge is no
// longer served, so a stopped worker's metrics leave with it. Text that is
// not Prometheus exposition is an error and drops the worker's kept ones.
func (r *Router) ObserveEngineMetrics(node, worker string, engine fleet.EngineKind, text []byte, at time.Time) error {
	p := expfmt.NewTextParser(model.LegacyValidation)
	parsed, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		r.engines.forget(worker)
		return fmt.Errorf("engine metrics of %s are not Prometheus text: %w", worker, err)
	}
	names := make([]string, 0, len(parsed))
	for name := range parsed {
		if slices.ContainsFunc(engineMetricPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	add := []*dto.LabelPair{
		{Name: proto.String("node"), Value: proto.String(node)},
		{Name: proto.String("worker"), Value: proto.String(worker)},
		{Name: proto.String("engine"), Value: proto.String(string(engine))},
	}
	series := 0
	fams := make([]*dto.MetricFamily, 0, len(names))
	for _, name := range names {
		f := parsed[name]
		out := &dto.MetricFamily{Name: f.Name, Help: f.Help, Type: f.Type, Unit: f.Unit}
		for _, m := range f.Metric {
			series += max(1, len(m.GetHistogram().GetBucket())+2, len(m.GetSummary().GetQuantile())+2)
			if series > maxEngineSeries {
				break
			}
			labels := make([]*dto.LabelPair, 0, len(m.Label)+len(add))
			for _, l := range m.Label {
				if slices.Contains(relabelled, l.GetName()) {
					l = &dto.LabelPair{Name: proto.String("exported_" + l.GetName()), Value: l.Value}
				}
				labels = append(labels, l)
			}
			labels = append(labels, add...)
			slices.SortFunc(labels, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
			m.Label = labels
			m.TimestampMs = nil
			out.Metric = append(out.Metric, m)
		}
		if len(out.Metric) > 0 {
			fams = append(fams, out)
		}
		if series > maxEngineSeries {
			r.log.Warn("engine exports more series than the hub keeps; the rest are left out", "worker", worker, "kept", maxEngineSeries)
			break
		}
	}
	r.engines.keep(worker, engineSnapshot{at: at, fams: fams}, r.opts.EngineLoadMaxAge)
	return nil
}

// keep makes s the worker's snapshot, and drops those older than maxAge.
// The relabelling is done before, outside the lock: a Prometheus scrape
// waits for the lock, not for the parsing of every worker's text.
func (e *engineMetrics) keep(worker string, s engineSnapshot, maxAge time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byWorker == nil {
		e.byWorker = map[string]engineSnapshot{}
	}
	e.byWorker[worker] = s
	e.dropStaleLocked(time.Now(), maxAge)
}

// dropStaleLocked forgets the workers whose reading is older than maxAge
// (stopped or moved), at every reading as well as every scrape, so that a
// hub nobody scrapes does not keep every worker it ever had.
func (e *engineMetrics) dropStaleLocked(now time.Time, maxAge time.Duration) {
	for w, s := range e.byWorker {
		if now.Sub(s.at) > maxAge {
			delete(e.byWorker, w)
		}
	}
}

// forget drops a worker's kept metrics at once (they would leave once
// stale anyway): it left the ready set.
func (e *engineMetrics) forget(worker string) {
	e.mu.Lock()
	delete(e.byWorker, worker)
	e.mu.Unlock()
}

// gather merges the fresh snapshots, one family per metric name. A name
// two engines type differently keeps the first worker's (by name) only.
func (e *engineMetrics) gather(maxAge time.Duration) ([]*dto.MetricFamily, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropStaleLocked(time.Now(), maxAge)
	workers := make([]string, 0, len(e.byWorker))
	for w := range e.byWorker {
		workers = append(workers, w)
	}
	slices.Sort(workers)
	merged := map[string]*dto.MetricFamily{}
	var order []string
	for _, w := range workers {
		for _, f := range e.byWorker[w].fams {
			m, ok := merged[f.GetName()]
			if !ok {
				m = &dto.MetricFamily{Name: f.Name, Help: f.Help, Type: f.Type, Unit: f.Unit}
				merged[f.GetName()] = m
				order = append(order, f.GetName())
			}
			if m.GetType() != f.GetType() {
				continue
			}
			// Shared, not copied: snapshots are replaced whole, never
			// changed, and the encoder only reads.
			m.Metric = append(m.Metric, f.Metric...)
		}
	}
	out := make([]*dto.MetricFamily, 0, len(order))
	for _, name := range order {
		out = append(out, merged[name])
	}
	return out, nil
}

// metricsHandler serves the router's, the hub's and the engines' metrics.
// With API keys required, /metrics requires one too (it tells the fleet's
// load and models to whoever reads it), except from loopback when
// Options.MetricsOpenLoopback is set.
func (r *Router) metricsHandler() http.Handler {
	gatherers := prometheus.Gatherers{r.gatherer, prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return r.engines.gather(r.opts.EngineLoadMaxAge)
	})}
	// One broken engine family must not blank the fleet's own metrics.
	h := promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, ErrorLog: slogPrinter{r}})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.opts.Keys != nil && !(r.opts.MetricsOpenLoopback && fleet.IsLoopbackAddr(req.RemoteAddr)) {
			if _, err := r.authorize(w, req); err != nil {
				r.answer(w, err)
				return
			}
		}
		h.ServeHTTP(w, req)
	})
}

// slogPrinter lets promhttp report gathering errors to the router's log.
type slogPrinter struct{ r *Router }

func (p slogPrinter) Println(v ...any) { p.r.log.Warn("serving /metrics", "err", fmt.Sprint(v...)) }
