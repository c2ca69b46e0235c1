// Package admission judges workers and measures them. The Judge decides
// whether a worker may serve: the memory gate before a launch, then the
// response shape against its model's reference and the speed against the
// model's other workers as it leaves probation, and re-judging when a
// reference moves (judge.go). Runs are the shape and bench runs users
// start (runs.go). Both take their measurements through one probe
// (probe.go), which talks to a worker directly through its node's
// transport and teaches the router what it measured.
//
// The package reads the fleet through Fleet (the hub's mirror implements
// it), authorizes and audits users' runs through Guard (the hub's guard),
// keeps reference shapes and bench runs in a Store and teaches the Router
// what it measured; the hub composes one Judge and one Runs (New) over its
// own store and router.
package admission

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"fleet"
	"fleet/router"
	"fleet/store"
)

// Fleet is the fleet as admission reads it: the workers as the node
// manager last reported them and the declared models. Each call reads a
// consistent copy; nothing returned is shared.
type Fleet interface {
	// Worker is the worker of that name (NODE/MODEL).
	Worker(name string) (fleet.Worker, bool)
	// Workers are the workers of the model with that ID.
	Workers(model string) []fleet.Worker
	// Resolve turns names typed by an operator (a node, NODE/MODEL, all)
	// into worker names, sorted, or says which names exist.
	Resolve(targets []string) ([]string, error)
	// Model is the declared model with that ID; ModelID the ID of the
	// model a name (an ID or an alias) names.
	Model(id string) (fleet.Model, bool)
	ModelID(name string) (string, bool)
	// ServedName is the name w's engine answers to (an Ollama tag
	// differs from the model ID).
	ServedName(w fleet.Worker) string
	// SetBench keeps a worker's latest bench sweep of one split, which
	// snapshots show.
	SetBench(worker string, b BenchSummary)
}

// Guard authorizes users' runs by the action table and audits them (the
// hub's guard).
type Guard interface {
	// Authorize refuses, auditing the refusal, an action u may not do.
	Authorize(u fleet.User, action fleet.ActionName, target string) (fleet.Action, error)
	// Run runs an authorized action and records its outcome; Do is
	// Authorize then Run.
	Run(u fleet.User, a fleet.Action, target string, run func() (note string, err error)) error
	Do(u fleet.User, action fleet.ActionName, target string, run func() (note string, err error)) error
	// Refuse audits a refusal after authorization (a limit); Failed an
	// authorized action that failed before it changed anything.
	Refuse(u fleet.User, action fleet.ActionName, target, outcome string)
	Failed(u fleet.User, a fleet.Action, target string, err error)
}

// Nodes is what admission asks of the node manager.
type Nodes interface {
	// Dialer reaches a port on a node (through its SSH tunnel if remote).
	Dialer(node string) func(ctx context.Context, network, addr string) (net.Conn, error)
	// Judge gives a worker on probation, or a ready or rejected one
	// judged again, its verdict (nil admits).
	Judge(ctx context.Context, worker string, verdict error) error
	// StartWorker launches a worker's engine again.
	StartWorker(ctx context.Context, worker string) error
}

// Store keeps what admission judges against and what users' runs
// measured (the hub's *store.Store): the models' reference shapes, where
// the declared fleet places each model's reference worker, and the bench
// sweeps with their samples.
type Store interface {
	// Reference is the stored reference shape of model (store.ErrNotFound
	// if none was recorded yet); SetReference replaces it.
	Reference(ctx context.Context, model string) (store.Reference, error)
	SetReference(ctx context.Context, model string, r store.Reference) error
	// LoadFleet is the declared fleet, which names each model's reference
	// node.
	LoadFleet(ctx context.Context) (fleet.Fleet, error)
	// AddBenchRun keeps a bench sweep (JSON) under a worker's name or a
	// model's router key, and AddSamples a worker's sweep as history.
	AddBenchRun(ctx context.Context, worker string, run []byte) error
	AddSamples(ctx context.Context, samples []fleet.Sample) error
	// BenchRuns are the sweeps kept under one key, newest first;
	// LatestBenchRuns the newest of each worker and split (read at start).
	BenchRuns(ctx context.Context, worker string, limit int) ([]store.BenchRun, error)
	LatestBenchRuns(ctx context.Context) ([]store.BenchRun, error)
}

// Router is what admission asks of the hub's router (*router.Router): the
// speed figures a new worker is judged against, and what it learns from
// admission's own measurements.
type Router interface {
	// Stats are the ready workers' live figures (their tok/s estimate is
	// the bar for one with no admission figure).
	Stats() []router.BackendStats
	// CountingTransport wraps rt so that measuring a worker counts as its
	// load while a request is in flight.
	CountingTransport(rt http.RoundTripper, worker string) http.RoundTripper
	// SeedSpeed teaches the scheduler a worker's speed curve from a
	// measurement before traffic does.
	SeedSpeed(worker string, points ...router.SpeedPoint)
	// WaitIdle returns when the router has no request in flight on the
	// worker, or with ctx's error.
	WaitIdle(ctx context.Context, worker string) error
}

// Config is what the Judge and the Runs are built from.
type Config struct {
	Fleet  Fleet
	Guard  Guard
	Nodes  Nodes
	Store  Store
	Router Router
	Log    *slog.Logger
	// Registerer takes the verdicts' counter (fleet_admissions_total).
	Registerer prometheus.Registerer
	// Event records an event of the fleet.
	Event func(fleet.Event)
	// RouterAddr is where the router listens once the hub runs (a bench of
	// a model goes through it).
	RouterAddr func() string
	// Detach runs f after the call that started it returned (re-judging a
	// model's workers), until the hub closes.
	Detach func(ctx context.Context, f func(ctx context.Context))
	// OnLeader runs an action that changes the fleet (a shape pin) on the
	// leading hub: local itself when this hub leads, else forwarded.
	OnLeader func(ctx context.Context, u fleet.User, action fleet.ActionName, target string, args any, local func() (string, error)) (string, error)
	// Wait bounds how long a worker on probation waits for its model's
	// reference worker and for a peer measured faster whose shape is being
	// checked (0 = DefaultWait).
	Wait time.Duration
}

// New builds the hub's Judge and Runs over one probe (both read and retake
// the models' reference shapes under one lock), and hands the fleet each
// worker's latest stored bench sweeps.
func New(ctx context.Context, cfg Config) (*Judge, *Runs, error) {
	p := &probe{fleet: cfg.Fleet, store: cfg.Store, router: cfg.Router, nodes: cfg.Nodes, log: cfg.Log, event: cfg.Event}
	j := &Judge{probe: p, detach: cfg.Detach, wait: cfg.Wait,
		admissions: newAdmissions(cfg.Registerer),
		speeds:     map[string]speedRecord{},
		duels:      map[string]chan struct{}{}}
	r := &Runs{probe: p, judge: j, guard: cfg.Guard, routerAddr: cfg.RouterAddr, onLeader: cfg.OnLeader}
	if err := r.loadBenchRuns(ctx); err != nil {
		return nil, nil, err
	}
	return j, r, nil
}
