package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"fleet"
	"fleet/router"
	"fleet/store"
)

// testFleet is a Fleet held in a map, as the hub's mirror holds one.
type testFleet struct {
	mu      sync.Mutex
	workers map[string]fleet.Worker
	models  []fleet.Model
	bench   map[string]BenchSummary
}

func (f *testFleet) put(w fleet.Worker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.workers[w.Name()] = w
}

func (f *testFleet) Worker(name string) (fleet.Worker, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[name]
	return w, ok
}

func (f *testFleet) Workers(model string) []fleet.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fleet.Worker
	for _, w := range f.workers {
		if w.Model == model {
			out = append(out, w)
		}
	}
	return out
}

// Resolve takes a worker's name or a node's.
func (f *testFleet) Resolve(targets []string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, t := range targets {
		n := len(out)
		for name, w := range f.workers {
			if name == t || w.Node == t {
				out = append(out, name)
			}
		}
		if len(out) == n {
			return nil, fmt.Errorf("no worker or node named %q", t)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (f *testFleet) Model(id string) (fleet.Model, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.models {
		if m.ID == id {
			return m, true
		}
	}
	return fleet.Model{}, false
}

func (f *testFleet) ModelID(name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.models {
		if m.Serves(name) {
			return m.ID, true
		}
	}
	return "", false
}

func (f *testFleet) ServedName(w fleet.Worker) string { return w.Model }

func (f *testFleet) SetBench(worker string, b BenchSummary) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bench[fmt.Sprint(worker, b.Agent)] = b
}

// allowAll lets every user do every action, and audits nothing.
type allowAll struct{}

func (allowAll) Authorize(_ fleet.User, action fleet.ActionName, _ string) (fleet.Action, error) {
	a, ok := fleet.LookupAction(action)
	if !ok {
		return a, fmt.Errorf("%q is not in the action table", action)
	}
	return a, nil
}

func (allowAll) Run(_ fleet.User, _ fleet.Action, _ string, run func() (string, error)) error {
	_, err := run()
	return err
}

func (g allowAll) Do(u fleet.User, action fleet.ActionName, target string, run func() (string, error)) error {
	a, err := g.Authorize(u, action, target)
	if err != nil {
		return err
	}
	return g.Run(u, a, target, run)
}

func (allowAll) Refuse(fleet.User, fleet.ActionName, string, string) {}
func (allowAll) Failed(fleet.User, fleet.Action, string, error)      {}

// noNodes reaches no node: a worker's engine never answers.
type noNodes struct{}

func (noNodes) Dialer(node string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("node " + node + " is not connected in this test")
	}
}
func (noNodes) Judge(context.Context, string, error) error { return nil }
func (noNodes) StartWorker(context.Context, string) error  { return nil }

// loopbackNodes reach workers' engines on this machine, and record the
// verdicts the Judge gives.
type loopbackNodes struct {
	mu       sync.Mutex
	verdicts map[string]error
}

func (*loopbackNodes) Dialer(string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext
}

func (n *loopbackNodes) Judge(_ context.Context, worker string, verdict error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.verdicts == nil {
		n.verdicts = map[string]error{}
	}
	n.verdicts[worker] = verdict
	return nil
}

func (n *loopbackNodes) judged() map[string]error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.verdicts)
}

func (*loopbackNodes) StartWorker(context.Context, string) error { return nil }

// failingReferences is a store whose SetReference fails while fail holds
// (a database gone read-only or full); everything else reaches the real
// store beneath.
type failingReferences struct {
	Store
	fail atomic.Bool
}

var errStoreDown = errors.New("attempt to write a readonly database")

func (s *failingReferences) SetReference(ctx context.Context, model string, r store.Reference) error {
	if s.fail.Load() {
		return fmt.Errorf("set reference shape of model %s: %w", model, errStoreDown)
	}
	return s.Store.SetReference(ctx, model, r)
}

// testJudge is a Judge and Runs over their own SQLite store and router.
type testJudge struct {
	j     *Judge
	runs  *Runs
	store *store.Store
	// detached counts the work the Judge started to outlive its call
	// (re-judging a model's workers).
	detached atomic.Int32
}

// newTestJudge is a Judge and Runs over fl, with a SQLite store and a
// router of their own, and every user allowed every run.
func newTestJudge(t *testing.T, fl *testFleet) (*Judge, *Runs) {
	t.Helper()
	tj := newTestJudgeWith(t, fl, noNodes{}, nil)
	return tj.j, tj.runs
}

// newTestJudgeWith is newTestJudge whose workers are reached through nodes
// and whose store is the SQLite one as wrap wraps it (nil: as it is).
func newTestJudgeWith(t *testing.T, fl *testFleet, nodes Nodes, wrap func(Store) Store) *testJudge {
	t.Helper()
	ctx := t.Context()
	if fl.workers == nil {
		fl.workers = map[string]fleet.Worker{}
	}
	fl.bench = map[string]BenchSummary{}
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := router.New(router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tj := &testJudge{store: st}
	var judged Store = st
	if wrap != nil {
		judged = wrap(st)
	}
	var detached sync.WaitGroup
	t.Cleanup(detached.Wait)
	tj.j, tj.runs, err = New(ctx, Config{
		Fleet: fl, Guard: allowAll{}, Nodes: nodes, Store: judged, Router: rt,
		Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		Event:      func(fleet.Event) {},
		RouterAddr: func() string { return "127.0.0.1:1" },
		Detach: func(ctx context.Context, f func(context.Context)) {
			tj.detached.Add(1)
			detached.Go(func() { f(context.WithoutCancel(ctx)) })
		},
		OnLeader: func(_ context.Context, _ fleet.User, _ fleet.ActionName, _ string, _ any, local func() (string, error)) (string, error) {
			return local()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tj
}
