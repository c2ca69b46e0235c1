package nodes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"fleet"
	"fleet/enginectl"
)

// ManagerOptions configure a Manager. Zero durations take the defaults in
// their comments.
type ManagerOptions struct {
	Logger *slog.Logger
	// DataDir is the hub's data dir: local and sim nodes keep engine files
	// in DataDir/nodes/NAME.
	DataDir string
	// FleetBin is the fleet binary simulated engines run as `FleetBin sim …`.
	FleetBin string
	// RemoteStateDir is where SSH nodes keep engine pid and log files;
	// "" is enginectl's default, ~/.fleet on the node.
	RemoteStateDir string

	ProbeInterval     time.Duration // node probes (default 10s)
	ReconcileInterval time.Duration // liveness and health of each worker (default 2s)
	ReadyTimeout      time.Duration // launch to ready (default 10m: weights download)
	InstallTimeout    time.Duration // engine install (default 30m)
	StopGrace         time.Duration // TERM to KILL (default 30s, vLLM needs it)
	// RestartBackoff is the wait before the n-th consecutive relaunch
	// (default fleet.RestartBackoff: min(10·2^(n−1), 300) s).
	RestartBackoff func(n int) time.Duration
	// HealthFailures is how many health checks in a row may fail before a
	// live engine counts as crashed (default 3).
	HealthFailures int
	// PortMin and PortMax bound the ports engines get on nodes that set no
	// ports of their own (default fleet.DefaultEnginePorts).
	PortMin, PortMax int

	HostKeys    HostKeyStore
	SimPlatform func(profile string) (fleet.Platform, error)
	// SimMimic names the engine a sim profile mimics (profiles.Profile.Mimic);
	// nil lets enginectl read it from the profile's name.
	SimMimic func(profile string) fleet.EngineKind
	// Transport tunes SSH connections (timeouts, keepalives). Its Logger,
	// DataDir, SimPlatform, HostKeys and OnEvent are filled in from here.
	Transport Options
	// EngineOptions are passed to every enginectl call (e.g. a faster poll
	// interval in tests).
	EngineOptions []enginectl.Option

	// OnWorker receives a copy of a worker at every state change.
	OnWorker func(fleet.Worker)
	// OnWorkerRemoved is called once a worker whose placement is gone has
	// been stopped and forgotten.
	OnWorkerRemoved func(fleet.Worker)
	// OnNode receives probe results and up/unreachable changes.
	OnNode func(fleet.Node)
	// OnNodeSuspect hears that a node stopped answering keepalives (reason
	// says so) or answers again (reason ""): its workers should get no new
	// requests meanwhile, though the ones streaming keep going.
	OnNodeSuspect func(node, reason string)
	// ReachInterval is how often an unreachable SSH node is tried with a
	// plain TCP connect, so that it is reconnected within about that long
	// of answering again whatever the reconnect backoff (default 2s).
	ReachInterval time.Duration
	// OnEvent receives launches, adoptions, stale-port stops, install
	// output lines and failures.
	OnEvent func(fleet.Event)
	// Gate is the admission check before a launch (or an install): node is
	// the worker's node probed just now, so its free memory is what the
	// engine would get, less held: the memory (MemoryNeed) of the other
	// launches on the node that passed the gate and whose engines are not
	// up yet, which the probe cannot see. An error rejects the worker with
	// the error's text and no engine starts; the gate is tried again every
	// ProbeInterval, on `start`, and when the worker's command line changes.
	// Calls are serialised (check and hold are one step), so Gate must not
	// wait. nil admits everyone.
	Gate func(ctx context.Context, w fleet.Worker, node fleet.Node, held Held) ([]int, error)
	// Admit is the admission check between probation and ready; an error
	// rejects the worker with the error's text. nil admits everyone.
	Admit func(ctx context.Context, w fleet.Worker) error
	// FleetID is the fleet's identity (the database's); every engine is
	// started carrying it with the serial of its launch (enginectl.Owner).
	FleetID string
	// LastLaunch is the last launch serial the fleet's database gave out
	// when the hub started: an engine of this fleet carrying a higher one
	// (that this manager did not launch) is a newer copy's, neither adopted
	// nor stopped; OnNewerEngine hears of each.
	LastLaunch    int64
	OnNewerEngine func(pid int, launch int64)
	// RecordLaunch stores the worker with the serial of a new launch, made
	// durable before the engine starts (store.RecordLaunch), and returns
	// it as stored. An error stops the launch before anything runs. nil
	// launches without a record.
	RecordLaunch func(ctx context.Context, w fleet.Worker) (fleet.Worker, error)
	// RecordWorker stores a worker and reports it like OnWorker, and says
	// when it could not: for what must be durable before the hub acts on it
	// (a hold before the drain of a stop). nil: OnWorker, which cannot fail.
	RecordWorker func(ctx context.Context, w fleet.Worker) error
	// Fault is called at the points where a crash is worst (launch
	// recorded, engine started, stop begun...) with the point's name; a
	// test's hub kills itself there. nil in production.
	Fault func(point string)
	// RejectedGrace is how long the engine of a worker rejected after its
	// launch (speed, shape) keeps running so it can be looked at (`shape`,
	// `bench`, `logs`); then it is stopped and the worker stays rejected
	// until `start`, `admit --force`, a re-judgement or a new command line.
	// Default 10 minutes.
	RejectedGrace time.Duration

	// Following starts the manager as a follower (SetLeading): nodes are
	// connected and probed, but no worker is supervised until
	// SetLeading(true, known). false: it leads from the start, as a hub on
	// SQLite always does.
	Following bool
	// StillLeading is asked immediately before each act on an engine or a
	// node (launch, and its record; stop and kill, a stale engine's too;
	// install; admission and verdict) and before each report of a worker:
	// the hub answers whether its lease is still valid by its own monotonic
	// clock. false: the act is not done, and the worker's supervisor ends,
	// leaving its engine as it runs, until SetLeading starts a new term.
	// nil: always leading.
	StillLeading func() bool
	// OtherDataDirs lists the data dirs of the fleet's other hubs on this
	// machine, live or dead (several hubs on one database). A local or sim
	// node keeps an engine's pid file under the data dir of the hub that
	// launched it, so a launch a former leader recorded and died before
	// seeing start is looked for there too before another is started
	// (resolveLaunch). nil: none.
	OtherDataDirs func(ctx context.Context) ([]string, error)
}

func (o ManagerOptions) withDefaults() ManagerOptions {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ProbeInterval, 10*time.Second)
	def(&o.ReconcileInterval, 2*time.Second)
	def(&o.ReadyTimeout, 10*time.Minute)
	def(&o.InstallTimeout, 30*time.Minute)
	def(&o.StopGrace, 30*time.Second)
	def(&o.ReachInterval, 2*time.Second)
	def(&o.RejectedGrace, 10*time.Minute)
	if o.HealthFailures <= 0 {
		o.HealthFailures = 3
	}
	if o.PortMin <= 0 || o.PortMax < o.PortMin {
		o.PortMin, o.PortMax = fleet.DefaultEnginePorts.Min, fleet.DefaultEnginePorts.Max
	}
	if o.HostKeys == nil {
		o.HostKeys = &MemoryHostKeys{}
	}
	return o
}

// Manager keeps every placement's worker in its desired state: it probes
// nodes, launches, adopts, health-checks and relaunches engines. One
// goroutine watches each node and one supervises each worker; only that
// goroutine changes its worker, so callbacks for one worker arrive in order.
type Manager struct {
	opts   ManagerOptions
	logger *slog.Logger

	mu       sync.Mutex
	desired  fleet.Fleet
	nodes    map[string]*nodeState
	workers  map[string]*workerState
	restored map[string]fleet.Worker
	// removedNodes are nodes no longer in the fleet that a previous hub
	// still had engines to stop on (RestoreRemoved): they stay connected
	// only until those engines are stopped.
	removedNodes map[string]fleet.Node
	wake         chan struct{}
	runCtx       context.Context
	// lastLaunch is the highest launch serial of the fleet's database,
	// LastLaunch raised by every launch recorded since.
	lastLaunch atomic.Int64
	holds      memoryHolds
	wg         sync.WaitGroup

	// leadMu serialises SetLeading. leading says whether this manager
	// drives engines (under mu); term is its current leadership, started
	// by sync once Run runs, nil while following.
	leadMu  sync.Mutex
	leading bool
	term    *term
	// removedPending are RestoreRemoved calls made while following, handed
	// to the next term after its known workers.
	removedPending []removedEngine
}

// term is one spell of leadership: the supervisors started in it run under
// ctx, which ends (ErrNotLeading) when leadership is given up.
type term struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
}

type removedEngine struct {
	w    fleet.Worker
	node fleet.Node
}

// ErrNotLeading is why a manager that is not (or no longer) the fleet's
// leader did not act: it ends what its supervisors were doing, and answers
// operator requests made to it.
var ErrNotLeading = errors.New("this hub no longer leads the fleet, so it leaves engines as they run; the leading hub drives them (see `fleet status` for which hub leads)")

type nodeState struct {
	node      fleet.Node
	transport Transport
	cancel    context.CancelFunc
	poke      chan struct{}
	// changed is closed and replaced whenever node.State changes, waking
	// every worker waiting for the node.
	changed chan struct{}
	// suspect says why the node's connection is suspect; "" when it is not.
	suspect string
}

type workerState struct {
	name      string
	placement fleet.Placement
	w         fleet.Worker
	proc      enginectl.Process
	cancel    context.CancelCauseFunc
	// ctx ends every goroutine of the worker for good (quit): its term
	// ended, or the hub's StillLeading said no before an act. Its cause is
	// ErrNotLeading then, and nothing of the worker is reported any more.
	ctx     context.Context
	quit    context.CancelCauseFunc
	quitLog sync.Once
	done    chan struct{}
	poke    chan struct{}
	// persist orders the writes of the worker: one change is recorded (and
	// reported) before the next is made, so a write computed earlier never
	// lands after a later one, such as a hold.
	persist sync.Mutex
	// inDoubt is a launch recorded (w.Launch) whose engine's PID is not
	// known: the hub was killed, or the start failed, after the record. Its
	// engine may run; it is looked for on the node before anything else.
	inDoubt bool

	// Operator requests, taken by the supervising goroutine.
	request  string // "stop", "start", "restart", "admit", "verdict"
	waiters  []chan error
	attempt  context.CancelFunc // cancels a launch in progress for a request
	held     bool               // operator-stopped: stay down until started
	retiring bool
	// strangerPorts are ports fleet picked for this worker and found held
	// by a process that is not an engine of ours; allocatePort skips them.
	strangerPorts map[int]bool

	// verdict goes with a "verdict" request: nil admits a rejected worker
	// whose engine runs, an error rejects a ready one.
	verdict error
	// forced skips the admission checks of the next launch (`admit --force`
	// on a worker rejected before its engine started or after it stopped).
	forced bool
	// parked is a rejected worker whose engine was stopped after
	// RejectedGrace: it stays down until asked for or its command changes.
	parked bool
	// rejectedAt is when the worker was last rejected with its engine up.
	rejectedAt time.Time
}

// NewManager returns a Manager; nothing happens until Run.
func NewManager(opts ManagerOptions) *Manager {
	opts = opts.withDefaults()
	m := &Manager{
		opts:     opts,
		logger:   opts.Logger,
		nodes:    map[string]*nodeState{},
		workers:  map[string]*workerState{},
		restored: map[string]fleet.Worker{},
		wake:     make(chan struct{}, 1),

		removedNodes: map[string]fleet.Node{},
		leading:      !opts.Following,
	}
	m.lastLaunch.Store(opts.LastLaunch)
	return m
}

// SetDesired replaces the declared fleet; Run reconciles towards it.
func (m *Manager) SetDesired(f fleet.Fleet) {
	m.mu.Lock()
	m.desired = f
	m.mu.Unlock()
	signal(m.wake)
}

// Restore hands over the workers the store knew when the hub started. A
// worker whose PID is still alive running its stored LaunchArgv is adopted
// (same PID, no second engine); the rest are relaunched.
func (m *Manager) Restore(ws []fleet.Worker) {
	m.mu.Lock()
	for _, w := range ws {
		m.restored[w.Name()] = w
	}
	m.mu.Unlock()
	signal(m.wake)
}

// RestoreRemoved hands over an engine whose placement was removed while it
// may still run (a pending stop a previous hub did not finish), with its node
// as it was declared, so the node can be reached even if the fleet no longer
// has it. Its engine is stopped, once the node is reachable, unless the
// fleet places that worker again, in which case it is adopted like any
// restored worker.
//
// On a following manager it is kept for the next SetLeading(true), which
// hands it over after its known workers: a hub that takes the lead calls it
// before SetLeading(true) so that no supervisor starts without it.
func (m *Manager) RestoreRemoved(w fleet.Worker, node fleet.Node) {
	m.mu.Lock()
	if m.leading {
		m.restoreRemovedLocked(w, node)
	} else {
		m.removedPending = append(m.removedPending, removedEngine{w: w, node: node})
	}
	m.mu.Unlock()
	signal(m.wake)
}

func (m *Manager) restoreRemovedLocked(w fleet.Worker, node fleet.Node) {
	if r, ok := m.restored[w.Name()]; !ok || r.PID == 0 {
		m.restored[w.Name()] = w
	}
	m.removedNodes[node.Name] = node
	raise(&m.lastLaunch, w.Launch)
}

// SetLeading makes this manager the fleet's leader or a follower. Nodes stay
// connected and probed either way (Dialer, Scrape, CheckNode work for the
// router and the console); only a leader supervises workers.
//
// SetLeading(true, known) starts a term of leadership from known, the
// workers as the database has them now (they replace any Restore): every
// recorded engine still running its recorded argv is adopted with its PID,
// a launch recorded without a PID is looked for through its pid file, and
// nothing that runs is restarted, as on a restarted hub. Called on a leading
// manager, it ends the current term first and starts anew from known.
//
// SetLeading(false, nil) ends every supervisor without touching an engine,
// even one mid-launch, mid-install or mid-stop: as a hub killed there, which
// launches and stops are recorded to survive. When it returns, no goroutine
// of the ended term acts on an engine or reports a worker, and Workers is
// empty. It must not be called from a ManagerOptions callback, which it
// waits for.
func (m *Manager) SetLeading(leading bool, known []fleet.Worker) {
	m.leadMu.Lock()
	defer m.leadMu.Unlock()
	m.endTerm()
	m.mu.Lock()
	m.leading = leading
	if leading {
		m.restored = map[string]fleet.Worker{}
		for _, w := range known {
			m.restored[w.Name()] = w
			// Engines the previous leader launched carry serials this
			// manager has not seen: they are the fleet's, not a newer
			// copy's of its database.
			raise(&m.lastLaunch, w.Launch)
		}
		for _, r := range m.removedPending {
			m.restoreRemovedLocked(r.w, r.node)
		}
	}
	m.removedPending = nil
	m.mu.Unlock()
	if leading {
		m.logger.Info("leading the fleet: adopting its engines", "workers", len(known))
	}
	signal(m.wake)
}

// endTerm ends the current term of leadership, if any: its supervisors end
// (ErrNotLeading) and are waited for, and the workers are forgotten.
func (m *Manager) endTerm() {
	m.mu.Lock()
	t := m.term
	m.term = nil
	ended := m.workers
	m.workers = map[string]*workerState{}
	for _, ws := range ended {
		// A request its supervisor had not taken yet is not carried out.
		for _, c := range ws.waiters {
			c <- fmt.Errorf("worker %s: %s not done: %w", ws.name, ws.request, ErrNotLeading)
		}
		ws.request, ws.waiters = "", nil
	}
	m.restored = map[string]fleet.Worker{}
	m.removedNodes = map[string]fleet.Node{}
	m.mu.Unlock()
	if t == nil {
		return
	}
	t.cancel(ErrNotLeading)
	// A report that saw the term alive is made under the worker's persist
	// lock: once each lock was free, none is in flight, and none starts.
	for _, ws := range ended {
		waitReports(ws)
	}
	t.wg.Wait()
	m.logger.Info("no longer leading the fleet: engines are left as they run", "workers", len(ended))
}

// waitReports returns once no report of ws is in flight.
func waitReports(ws *workerState) {
	ws.persist.Lock()
	defer ws.persist.Unlock()
}

// leads says whether the worker's supervisor may do act (a launch, a stop,
// an install...) to its engine or node now: not once its term ended, nor
// when the hub's StillLeading says the lease may have lapsed. Then the act
// is not done and the worker's goroutines end, leaving the engine as it
// runs; the caller returns ErrNotLeading.
func (m *Manager) leads(ws *workerState, act string) bool {
	if ws.ctx != nil && errors.Is(context.Cause(ws.ctx), ErrNotLeading) {
		return false
	}
	if m.opts.StillLeading == nil || m.opts.StillLeading() {
		return true
	}
	m.giveUp(ws, act)
	return false
}

// giveUp ends the worker's goroutines for good because this hub may no
// longer lead, saying so once.
func (m *Manager) giveUp(ws *workerState, act string) {
	ws.quitLog.Do(func() {
		m.mu.Lock()
		pid := ws.w.PID
		m.mu.Unlock()
		engine := "its engine"
		if pid > 0 {
			engine = fmt.Sprintf("engine PID %d", pid)
		}
		m.logger.Info("no longer the leader; leaving "+engine+" as it runs", "worker", ws.name, "pid", pid, "act", act)
	})
	if ws.quit != nil {
		ws.quit(ErrNotLeading)
	}
}

// reporting says whether what the worker's goroutines do may still be
// reported: not once leadership was given up, which would have the hub
// write with an epoch that is no longer its own.
func (m *Manager) reporting(ws *workerState) bool {
	return ws.ctx == nil || !errors.Is(context.Cause(ws.ctx), ErrNotLeading)
}

// Run reconciles until ctx ends. It leaves engines running when it returns:
// stopping the hub must not stop the fleet.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.runCtx != nil {
		m.mu.Unlock()
		return errors.New("node manager is already running")
	}
	m.runCtx = ctx
	m.mu.Unlock()
	for {
		m.sync(ctx)
		select {
		case <-ctx.Done():
			m.wg.Wait()
			m.mu.Lock()
			for _, n := range m.nodes {
				if n.transport != nil {
					n.transport.Close()
				}
			}
			m.mu.Unlock()
			return nil
		case <-m.wake:
		}
	}
}

// Workers returns a copy of every worker, sorted by name.
func (m *Manager) Workers() []fleet.Worker {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]fleet.Worker, 0, len(m.workers))
	for _, ws := range m.workers {
		out = append(out, ws.w)
	}
	slices.SortFunc(out, func(a, b fleet.Worker) int { return cmp.Compare(a.Name(), b.Name()) })
	return out
}

// Nodes returns a copy of every node, sorted by name.
func (m *Manager) Nodes() []fleet.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]fleet.Node, 0, len(m.nodes))
	for _, n := range m.nodes {
		out = append(out, n.node)
	}
	slices.SortFunc(out, func(a, b fleet.Node) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Dialer returns how the router reaches engines of node: through the node's
// transport (an SSH tunnel to the node's loopback), or, for a node with
// `endpoint: direct`, straight to the node's host on the engine's port.
func (m *Manager) Dialer(node string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		m.mu.Lock()
		n, ok := m.nodes[node]
		var t Transport
		var nd fleet.Node
		var suspect string
		if ok {
			t, nd, suspect = n.transport, n.node, n.suspect
		}
		m.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("node %s is not part of the fleet", node)
		}
		// A request that cannot reach its worker now is better sent to
		// another at once than held up behind a silent node.
		if nd.State != fleet.NodeUp {
			return nil, fmt.Errorf("node %s is %s: %s", node, nd.State, cmp.Or(nd.Reason, "not probed yet"))
		}
		if suspect != "" {
			return nil, fmt.Errorf("node %s is not answering (%s)", node, suspect)
		}
		if nd.DialsDirect() {
			_, hostPort, err := ParseSSHAddress(nd.Address)
			if err != nil {
				return nil, err
			}
			host, _, _ := net.SplitHostPort(hostPort)
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("dial %q: %w", addr, err)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort(host, port))
		}
		if t == nil {
			return nil, fmt.Errorf("node %s is not connected: %s", node, cmp.Or(nd.Reason, "not probed yet"))
		}
		return t.DialContext(ctx, network, addr)
	}
}

// StopWorker stops a worker's engine and keeps it stopped until StartWorker.
func (m *Manager) StopWorker(ctx context.Context, name string) error {
	return m.requestWorker(ctx, name, "stop")
}

// StartWorker launches a stopped (or failed, or rejected) worker now,
// skipping any restart backoff, and waits until it is ready or fails.
func (m *Manager) StartWorker(ctx context.Context, name string) error {
	return m.requestWorker(ctx, name, "start")
}

// RestartWorker stops the worker's engine and launches it again, waiting
// until it is ready or fails. The router should drain it first.
func (m *Manager) RestartWorker(ctx context.Context, name string) error {
	return m.requestWorker(ctx, name, "restart")
}

// ForceAdmit makes a rejected worker ready, overriding its admission check
// (an operator's `admit --force`; the hub audits it).
func (m *Manager) ForceAdmit(ctx context.Context, name string) error {
	return m.requestWorker(ctx, name, "admit")
}

// Judge re-judges a worker whose engine runs, without a restart: a nil
// verdict admits a rejected worker, an error rejects a ready (or draining)
// one with the error's text. The hub calls it when a model's reference shape
// changes or a faster worker arrives.
func (m *Manager) Judge(ctx context.Context, name string, verdict error) error {
	return m.request(ctx, name, "verdict", func(ws *workerState) { ws.verdict = verdict })
}

func (m *Manager) requestWorker(ctx context.Context, name, what string) error {
	return m.request(ctx, name, what, nil)
}

func (m *Manager) request(ctx context.Context, name, what string, with func(*workerState)) error {
	m.mu.Lock()
	if !m.leading {
		m.mu.Unlock()
		return fmt.Errorf("worker %s: %s not done: %w", name, what, ErrNotLeading)
	}
	ws, ok := m.workers[name]
	if !ok || ws.retiring {
		m.mu.Unlock()
		return fmt.Errorf("no worker %s: workers are named NODE/MODEL, see `fleet workers`", name)
	}
	if m.runCtx == nil {
		m.mu.Unlock()
		return errors.New("the node manager is not running")
	}
	if what == "verdict" && ws.request != "" {
		// An operator's request is not to be superseded by a re-judgement.
		r := ws.request
		m.mu.Unlock()
		return fmt.Errorf("worker %s: a %s request is pending; not re-judged", name, r)
	}
	done := make(chan error, 1)
	// A newer request replaces an older one; its callers learn so.
	for _, w := range ws.waiters {
		w <- fmt.Errorf("worker %s: superseded by a %s request", name, what)
	}
	ws.request, ws.waiters = what, []chan error{done}
	if with != nil {
		with(ws)
	}
	if ws.attempt != nil && what != "verdict" { // a verdict waits for the launch to end
		ws.attempt()
	}
	m.mu.Unlock()
	signal(ws.poke)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("worker %s: %s requested, still in progress: %w", name, what, ctx.Err())
	}
}

// CheckNode asks a node's connection for a keepalive answer within timeout,
// for when a request to it got no first byte in time: nil when it
// answered; otherwise the node is suspect (OnNodeSuspect) until one is.
func (m *Manager) CheckNode(ctx context.Context, name string, timeout time.Duration) error {
	m.mu.Lock()
	ns, ok := m.nodes[name]
	var t Transport
	if ok {
		t = ns.transport
	}
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("node %s is not part of the fleet", name)
	}
	c, ok := t.(interface {
		CheckLink(context.Context, time.Duration) error
	})
	if !ok {
		return nil // local and sim nodes have no link to lose
	}
	return c.CheckLink(ctx, timeout)
}

// RetryNode forgets the node's reconnection backoff and probes it now: for
// after an operator fixed what made connecting fail, such as re-trusting a
// changed host key, so the node is back in seconds rather than at the end of
// a backoff that may have grown to minutes.
func (m *Manager) RetryNode(name string) {
	m.mu.Lock()
	ns, ok := m.nodes[name]
	var t Transport
	if ok {
		t = ns.transport
	}
	m.mu.Unlock()
	if !ok {
		return
	}
	if r, ok := t.(interface{ resetBackoff() }); ok {
		r.resetBackoff()
	}
	signal(ns.poke)
}

func (m *Manager) model(id string) (fleet.Model, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mo := range m.desired.Models {
		if mo.ID == id {
			return mo, true
		}
	}
	return fleet.Model{}, false
}

// stateDir is where the node keeps engine files.
func (m *Manager) stateDir(t Transport) string {
	if s, ok := t.(interface{ StateDir() string }); ok {
		if d := s.StateDir(); d != "" {
			return d
		}
	}
	return m.opts.RemoteStateDir
}

// update changes the worker under the lock and reports it, while this
// manager leads.
func (m *Manager) update(ws *workerState, f func(w *fleet.Worker)) {
	ws.persist.Lock()
	defer ws.persist.Unlock()
	m.mu.Lock()
	f(&ws.w)
	w := ws.w
	m.mu.Unlock()
	if m.opts.OnWorker != nil && m.mayReport(ws) {
		m.opts.OnWorker(w)
	}
}

// mayReport says whether a change of the worker may be reported now (see
// reporting); a hub whose StillLeading says no ends the worker's goroutines.
func (m *Manager) mayReport(ws *workerState) bool {
	if !m.reporting(ws) {
		return false
	}
	if m.opts.StillLeading != nil && !m.opts.StillLeading() {
		m.giveUp(ws, "report")
		return false
	}
	return true
}

func (m *Manager) setState(ws *workerState, state fleet.WorkerState, reason string) {
	m.update(ws, func(w *fleet.Worker) { w.State, w.Reason = state, reason })
}

func (m *Manager) event(level, subject, msg string) {
	if m.opts.OnEvent != nil {
		m.opts.OnEvent(fleet.Event{At: time.Now(), Level: level, Subject: subject, Message: msg})
	}
}

// workerEvent is an event about the worker, dropped once its goroutines
// were ended for leadership given up.
func (m *Manager) workerEvent(ws *workerState, level, msg string) {
	if m.reporting(ws) {
		m.event(level, ws.name, msg)
	}
}

// fault marks a point where a crash is worst, for tests that kill the hub there.
func (m *Manager) fault(point string) {
	if m.opts.Fault != nil {
		m.opts.Fault(point)
	}
}

// Hold records that the worker is to stay stopped, durably, before its
// engine is stopped (a stop drains first, which takes a while): a hub killed
// in between finds the worker held and stops its engine when it starts
// again. StopWorker does the stopping.
func (m *Manager) Hold(ctx context.Context, name string) error {
	m.mu.Lock()
	ws, ok := m.workers[name]
	leading := m.leading
	m.mu.Unlock()
	if !leading {
		return fmt.Errorf("worker %s: the stop was not recorded: %w", name, ErrNotLeading)
	}
	if !ok || ws.retiring {
		return fmt.Errorf("no worker %s: workers are named NODE/MODEL, see `fleet workers`", name)
	}
	ws.persist.Lock()
	defer ws.persist.Unlock()
	if !m.mayReport(ws) {
		return fmt.Errorf("worker %s: the stop was not recorded: %w", name, ErrNotLeading)
	}
	m.mu.Lock()
	was := ws.w.Held
	ws.w.Held = true
	w := ws.w
	m.mu.Unlock()
	if m.opts.RecordWorker == nil {
		if m.opts.OnWorker != nil {
			m.opts.OnWorker(w)
		}
		return nil
	}
	if err := m.opts.RecordWorker(ctx, w); err != nil {
		m.mu.Lock()
		ws.w.Held = was
		m.mu.Unlock()
		return fmt.Errorf("worker %s: the stop could not be recorded, so nothing was stopped: %w", name, err)
	}
	return nil
}

// recordLaunch gives the worker's next launch its serial, durably, before
// the engine starts (ManagerOptions.RecordLaunch), and marks it starting.
func (m *Manager) recordLaunch(ctx context.Context, ws *workerState) error {
	ws.persist.Lock()
	defer ws.persist.Unlock()
	m.mu.Lock()
	w := ws.w
	m.mu.Unlock()
	w.State, w.Reason = fleet.WorkerStarting, ""
	// A launch recorded is one the next leader looks for: none is recorded
	// by a hub that may no longer lead.
	if !m.leads(ws, "record launch") {
		return fmt.Errorf("worker %s: not launched: %w", ws.name, ErrNotLeading)
	}
	if m.opts.RecordLaunch != nil {
		saved, err := m.opts.RecordLaunch(ctx, w)
		if err != nil {
			return err
		}
		w.Launch = saved.Launch
		raise(&m.lastLaunch, w.Launch)
	}
	m.mu.Lock()
	ws.w.State, ws.w.Reason, ws.w.Launch = w.State, w.Reason, w.Launch
	w = ws.w
	m.mu.Unlock()
	if m.opts.OnWorker != nil && m.mayReport(ws) {
		m.opts.OnWorker(w)
	}
	return nil
}

// raise sets v to to, unless it is higher already.
func raise(v *atomic.Int64, to int64) {
	for {
		cur := v.Load()
		if cur >= to || v.CompareAndSwap(cur, to) {
			return
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (m *Manager) engineOptions() []enginectl.Option {
	own := enginectl.WithFleet(enginectl.Fleet{ID: m.opts.FleetID, LastLaunch: m.lastLaunch.Load, OnNewer: m.opts.OnNewerEngine})
	return append([]enginectl.Option{enginectl.WithLogger(m.logger), own}, m.opts.EngineOptions...)
}
