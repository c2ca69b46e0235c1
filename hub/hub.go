// Package hub composes the store, the node manager and the router into the
// running fleet hub, and offers the actions (drain, restart, apply, …) that
// the console, SSH exec and the local CLI all call. Roles are enforced and
// audited here, on the server side, in one place.
package hub

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"fleet"
	"fleet/cli"
	"fleet/enginectl"
	"fleet/fleetfile"
	"fleet/internal/mdns"
	"fleet/nodes"
	"fleet/router"
	"fleet/sim"
	"fleet/sshserver"
	"fleet/store"
	"fleet/themes"
)

// Options configure a hub.
type Options struct {
	DataDir  string
	HTTPAddr string // the router, e.g. 127.0.0.1:8080
	// FleetFile is applied at start when set; Demo applies the built-in demo fleet.
	FleetFile string
	Demo      bool
	Logger    *slog.Logger
	// FleetBin is the fleet binary simulated engines run from; "" copies the
	// running executable into the data dir.
	FleetBin string
	// DrainTimeout bounds how long a drain waits for in-flight requests.
	DrainTimeout time.Duration
	// Policy is the router's scheduling policy ("" = fleet).
	Policy string
	// QueueTimeout and QueueSize bound the router's queue per model: how
	// long a request waits for a slot or a coming worker, and how many may
	// wait (0 = the router's defaults, 30 s and 256).
	QueueTimeout time.Duration
	QueueSize    int
	// BodyTimeout is how long a router client has to send its request body
	// (0 = the router's default).
	BodyTimeout time.Duration
	// RequireKeys makes the router demand an API key even on loopback; a
	// non-loopback HTTPAddr always does.
	RequireKeys bool
	// SSHAddr is where the console is served over SSH ("" = no console).
	SSHAddr string
	// AdminKeysFile is an authorized_keys file whose keys become admins.
	AdminKeysFile string
	// Theme is the console's server-wide theme ("" = from each client's background).
	Theme string
	// MDNSName is announced by mDNS as NAME.local with an _ssh._tcp service
	// when the console listens off loopback ("" = no announcement).
	MDNSName string
	// SSHMaxConnsPerIPPerMinute limits new SSH connections per address
	// (0 = the server's default; negative disables).
	SSHMaxConnsPerIPPerMinute int
	// SSH session limits per connection, per user and consoles per hub
	// (0 = the server's defaults; negative disables).
	SSHMaxSessionsPerConn int
	SSHMaxSessionsPerUser int
	SSHMaxConsoles        int
	// ProbeInterval and ReconcileInterval pace the node manager (0 = its defaults).
	ProbeInterval     time.Duration
	ReconcileInterval time.Duration
	// AdmissionWait bounds how long a worker on probation waits for its
	// model's reference worker and for peers starting with it (0 = 2 min).
	AdmissionWait time.Duration
	// RejectedGrace is how long a rejected worker's engine stays up to be
	// looked at (0 = the node manager's default, 10 min).
	RejectedGrace time.Duration
}

// Hub is the running fleet hub.
type Hub struct {
	opts   Options
	log    *slog.Logger
	store  *store.Store
	mgr    *nodes.Manager
	router *router.Router

	mu      sync.Mutex
	workers map[string]fleet.Worker // by worker name, as the manager last reported
	nodes   map[string]fleet.Node
	models  []fleet.Model
	// placements are the declared ones: a placed worker the manager has not
	// reported yet is one the router waits for.
	placements []fleet.Placement
	// bench is each worker's latest bench sweep, kept here so snapshots
	// (twice a second per console) never parse stored runs.
	bench map[string]benchSummary

	samples chan fleet.Sample
	// refMu serialises reading and retaking a model's reference shape.
	refMu sync.Mutex
	// checks bounds each user's shape and bench runs (see limits.go).
	checks userChecks
	// speeds are admission speed measurements, by worker (guarded by mu).
	speeds map[string]speedRecord
	// httpAddr is where the router listens, once Run has bound it.
	httpAddr string
	// lock is the data dir's lock, held until Close.
	lock *os.File
	// lanName is the console's mDNS name once announced (announce.go).
	lanName string
}

// LocalAdmin is who acts through the control socket: the hub's own OS user.
func LocalAdmin() fleet.User {
	name := os.Getenv("USER")
	if name == "" {
		name = "local"
	}
	return fleet.User{Name: name + "@hub", Role: fleet.RoleAdmin}
}

// Open prepares a hub: opens (and migrates) the database, applies the demo or
// fleet file, and restores the workers the database knew.
func Open(ctx context.Context, opts Options) (_ *Hub, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 5 * time.Minute
	}
	if opts.QueueTimeout < 0 {
		return nil, fmt.Errorf("--queue-timeout %s is negative; give how long a request may wait, e.g. 30s", opts.QueueTimeout)
	}
	if opts.QueueSize < 0 {
		return nil, fmt.Errorf("--queue-size %d is negative; give how many requests may wait per model, e.g. 256", opts.QueueSize)
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the data dir %s: %w", opts.DataDir, err)
	}
	if err := checkWritable(opts.DataDir); err != nil {
		return nil, err
	}
	// The lock comes before the store: a hub refused because another runs
	// must not have applied its fleet file (or the demo) to that hub's store.
	lock, err := lockDataDir(opts.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	dbPath := filepath.Join(opts.DataDir, "fleet.db")
	fi, statErr := os.Stat(dbPath)
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	if statErr == nil && fi.Size() == 0 {
		// SQLite takes a zero-length file for a new database; say so, since
		// it may be what is left of a lost one.
		opts.Logger.Warn("the database file was empty (0 bytes): initialised it as a new, empty fleet database", "path", dbPath)
	}
	h := &Hub{
		opts:    opts,
		log:     opts.Logger,
		store:   st,
		workers: map[string]fleet.Worker{},
		nodes:   map[string]fleet.Node{},
		bench:   map[string]benchSummary{},
		speeds:  map[string]speedRecord{},
		samples: make(chan fleet.Sample, 4096),
		lock:    lock,
	}
	if h.opts.FleetBin == "" {
		bin, err := installSelf(opts.DataDir)
		if err != nil {
			return nil, err
		}
		h.opts.FleetBin = bin
	}
	// Refusals come before the fleet file is applied: a hub that will not
	// start must leave the stored fleet as it was.
	var keys router.KeyVerifier
	if opts.RequireKeys || !fleet.IsLoopbackAddr(opts.HTTPAddr) {
		if err := requireKeys(ctx, st, opts.HTTPAddr); err != nil {
			return nil, err
		}
		keys = st
	}
	if err := requireConsoleAdmins(ctx, st, opts); err != nil {
		return nil, err
	}
	if opts.MDNSName != "" {
		if _, err := mdns.ParseName(opts.MDNSName); err != nil {
			return nil, fmt.Errorf("--mdns: %w", err)
		}
	}
	if _, err := router.NewPolicy(cmp.Or(opts.Policy, "fleet")); err != nil {
		return nil, fmt.Errorf("--policy: %w", err)
	}
	switch {
	case opts.FleetFile != "":
		data, err := os.ReadFile(opts.FleetFile)
		if err != nil {
			return nil, fmt.Errorf("reading the fleet file: %w", err)
		}
		if _, err := h.apply(ctx, filepath.Base(opts.FleetFile), data, false); err != nil {
			return nil, err
		}
	case opts.Demo:
		if _, err := h.apply(ctx, "demo fleet", fleetfile.Demo, false); err != nil {
			return nil, err
		}
	}
	h.router = router.New(router.Options{
		Logger:       opts.Logger.With("component", "router"),
		Registerer:   prometheus.NewRegistry(),
		Policy:       opts.Policy,
		QueueTimeout: opts.QueueTimeout,
		QueueSize:    opts.QueueSize,
		BodyTimeout:  opts.BodyTimeout,
		Keys:         keys,
		// A request got no first byte: is the worker's node still there?
		OnNoFirstByte: h.checkWorkerNode,
		OnSample: func(s fleet.Sample) {
			select {
			case h.samples <- s:
			default: // the store is behind; a lost sample costs a sparkline point, not a request
			}
		},
	})
	h.mgr = nodes.NewManager(nodes.ManagerOptions{
		Logger:            opts.Logger.With("component", "nodes"),
		DataDir:           opts.DataDir,
		FleetBin:          h.opts.FleetBin,
		ProbeInterval:     opts.ProbeInterval,
		ReconcileInterval: opts.ReconcileInterval,
		HostKeys:          hostKeys{st},
		SimPlatform: func(profile string) (fleet.Platform, error) {
			p, err := sim.LookupProfile(profile)
			if err != nil {
				return fleet.Platform{}, err
			}
			return p.Platform, nil
		},
		SimMimic: func(profile string) fleet.EngineKind {
			p, err := sim.LookupProfile(profile)
			if err != nil {
				return ""
			}
			return p.Mimic
		},
		Gate:            h.gate,
		Admit:           h.admit,
		RejectedGrace:   opts.RejectedGrace,
		OnWorker:        h.onWorker,
		OnWorkerRemoved: h.onWorkerRemoved,
		OnNode:          h.onNode,
		OnNodeSuspect:   h.onNodeSuspect,
		OnEvent:         h.onEvent,
	})
	f, err := st.LoadFleet(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range f.Nodes {
		h.nodes[n.Name] = n
	}
	h.models = f.Models
	h.placements = f.Placements
	if err := h.router.SetModels(f.Models); err != nil {
		return nil, err
	}
	known, err := st.Workers(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range known {
		// What the store says is history until the node manager has checked
		// the engine: a worker is not shown (or routed to) as ready before.
		if w.State != fleet.WorkerStopped && w.State != fleet.WorkerRejected {
			w.State, w.Reason = fleet.WorkerStarting, "checking the engine recorded before the hub restarted"
		}
		h.workers[w.Name()] = w
	}
	if err := h.loadBenchRuns(ctx); err != nil {
		return nil, err
	}
	h.mgr.SetDesired(f)
	h.mgr.Restore(known)
	if err := h.restorePendingStops(ctx, f); err != nil {
		return nil, err
	}
	h.syncRouter()
	return h, nil
}

// requireKeys refuses to open the router to a network without a single API
// key to check: that would be an open inference endpoint on the LAN.
func requireKeys(ctx context.Context, st *store.Store, addr string) error {
	keys, err := st.APIKeys(ctx)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.Revoked.IsZero() {
			return nil
		}
	}
	return fmt.Errorf("the router would listen on %s and require API keys, but none exists; "+
		"start the hub on loopback first (fleet serve --http 127.0.0.1:8080), create one with 'fleet key create NAME', "+
		"then restart with --http %s", addr, addr)
}

// installSelf copies the running executable to DATA/bin/fleet so simulated
// engines run from a path that outlives `go run`'s temporary build, which
// lets a restarted hub recognise (and adopt) them by their argv. The copy is
// replaced atomically only when the content changed: running engines keep
// their old inode.
func installSelf(dataDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the fleet executable to run simulated engines from: %w", err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return "", fmt.Errorf("reading the fleet executable %s: %w", self, err)
	}
	dst := filepath.Join(dataDir, "bin", "fleet")
	if old, err := os.ReadFile(dst); err == nil && sha256.Sum256(old) == sha256.Sum256(data) {
		return dst, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", fmt.Errorf("creating %s: %w", filepath.Dir(dst), err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, data, 0o700); err != nil {
		return "", fmt.Errorf("installing the fleet binary for simulated engines: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("installing the fleet binary for simulated engines: %w", err)
	}
	return dst, nil
}

// Close releases the database. Engines keep running: a hub that stops must
// not take the fleet down with it.
func (h *Hub) Close() error {
	err := h.store.Close()
	h.lock.Close() // releases the data dir to the next hub
	return err
}

// Run serves the router and the control socket and keeps the nodes
// reconciled until ctx is cancelled.
func (h *Hub) Run(ctx context.Context, ready func(httpAddr string)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctl, err := listenControl(h.opts.DataDir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", h.opts.HTTPAddr)
	if err != nil {
		ctl.Close()
		return fmt.Errorf("the router cannot listen on %s: %w (pass another --http address)", h.opts.HTTPAddr, err)
	}
	srv := router.NewServer(h.opts.HTTPAddr, h.router.Handler())
	var console *sshserver.Server
	if h.opts.SSHAddr != "" {
		home, _ := os.UserHomeDir()
		bootstrap := ""
		if home != "" {
			bootstrap = filepath.Join(home, ".ssh")
		}
		console, err = sshserver.New(sshserver.Options{
			Addr:                     h.opts.SSHAddr,
			HostKeyPath:              filepath.Join(h.opts.DataDir, "ssh_host_ed25519_key"),
			Users:                    h.store,
			Audit:                    func(e fleet.AuditEntry) { h.audit(fleet.User{Name: e.User}, e.Action, e.Target, e.Outcome) },
			Source:                   h.ConsoleSource,
			Exec:                     h.Exec,
			MaxConnsPerIPPerMinute:   h.opts.SSHMaxConnsPerIPPerMinute,
			MaxSessionsPerConn:       h.opts.SSHMaxSessionsPerConn,
			MaxSessionsPerUser:       h.opts.SSHMaxSessionsPerUser,
			MaxConsoles:              h.opts.SSHMaxConsoles,
			Logger:                   h.log.With("component", "ssh"),
			AdminKeysFile:            h.opts.AdminKeysFile,
			LoopbackBootstrapKeysDir: bootstrap,
			Theme:                    h.opts.Theme,
		})
		if err != nil {
			ctl.Close()
			ln.Close()
			return err
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	spawn := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	if console != nil {
		defer h.announce()()
		spawn(func() {
			if err := console.ListenAndServe(ctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("ssh console: %w", err)
				cancel()
			}
		})
	}
	spawn(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("router: %w", err)
			cancel()
		}
	})
	spawn(func() { serveControl(ctx, ctl, h.execLocal, h.log) })
	spawn(func() {
		if err := h.mgr.Run(ctx); err != nil && ctx.Err() == nil {
			errc <- fmt.Errorf("node manager: %w", err)
			cancel()
		}
	})
	spawn(func() { h.flushSamples(ctx) })
	spawn(func() { h.scrapeEngines(ctx, engineScrapeInterval) })
	h.mu.Lock()
	h.httpAddr = ln.Addr().String()
	h.mu.Unlock()
	h.log.Info("hub running", "router", ln.Addr().String(), "data", h.opts.DataDir)
	if ready != nil {
		ready(ln.Addr().String())
	}
	<-ctx.Done()
	shutdown, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	_ = srv.Shutdown(shutdown)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func (h *Hub) routerAddr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.httpAddr
}

func (h *Hub) execLocal(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(ctx, h, LocalAdmin(), args, stdin, stdout, stderr)
}

// Exec runs one command line for an SSH user.
func (h *Hub) Exec(ctx context.Context, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(ctx, h, u, args, stdin, stdout, stderr)
}

// flushSamples batches the router's measurements into the store, so a
// request never waits on SQLite.
func (h *Hub) flushSamples(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var batch []fleet.Sample
	flush := func() {
		if len(batch) == 0 {
			return
		}
		if err := h.store.AddSamples(context.WithoutCancel(ctx), batch); err != nil {
			h.log.Warn("could not store request samples", "n", len(batch), "err", err)
		}
		batch = batch[:0]
	}
	for {
		select {
		case s := <-h.samples:
			batch = append(batch, s)
			if len(batch) >= 512 {
				flush()
			}
		case <-t.C:
			flush()
		case <-ctx.Done():
			flush()
			return
		}
	}
}

// engineScrapeInterval paces reading each engine's own load (vLLM
// running/waiting, llama-server slots); the router ignores a reading older
// than three intervals.
const engineScrapeInterval = 5 * time.Second

// scrapeEngines tells the router what each ready engine reports about its
// own load, which can exceed what the router has in flight (another client
// on the engine, requests the router gave up on that still decode).
func (h *Hub) scrapeEngines(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		for _, w := range h.mgr.Workers() {
			if w.State != fleet.WorkerReady {
				continue
			}
			wg.Add(1)
			go func() { // one per worker: an unreachable node must not delay the others
				defer wg.Done()
				at := time.Now()
				l, err := h.mgr.Scrape(ctx, w.Name())
				if err != nil {
					if !errors.Is(err, enginectl.ErrNoLoadSignal) && ctx.Err() == nil {
						h.log.Debug("engine load scrape failed", "worker", w.Name(), "err", err)
					}
					return
				}
				h.router.ObserveEngineLoad(w.Name(), router.EngineLoad{Running: l.Running, Waiting: l.Waiting, Slots: l.Slots, At: at})
			}()
		}
		wg.Wait()
	}
}

func (h *Hub) onWorker(w fleet.Worker) {
	h.mu.Lock()
	if old, ok := h.workers[w.Name()]; ok {
		w.Drained = old.Drained // the drain flag is the hub's, not the manager's
	}
	h.workers[w.Name()] = w
	h.mu.Unlock()
	saved, err := h.store.SaveWorker(context.Background(), w)
	if errors.Is(err, store.ErrNotFound) {
		// A retiring worker whose node or model left the fleet: its pending
		// stop, not a worker row, keeps it until its engine is stopped.
		h.log.Debug("not persisting a worker that left the fleet", "worker", w.Name(), "state", w.State)
	} else if err != nil {
		h.log.Error("could not persist worker state", "worker", w.Name(), "state", w.State, "err", err)
	} else {
		h.mu.Lock()
		if cur, ok := h.workers[w.Name()]; ok {
			cur.ID = saved.ID
			h.workers[w.Name()] = cur
		}
		h.mu.Unlock()
	}
	h.syncRouter()
}

func (h *Hub) onWorkerRemoved(w fleet.Worker) {
	h.mu.Lock()
	delete(h.workers, w.Name())
	h.mu.Unlock()
	if err := h.store.DeleteWorker(context.Background(), w.Node, w.Model); err != nil && !errors.Is(err, store.ErrNotFound) {
		h.log.Warn("could not forget a removed worker", "worker", w.Name(), "err", err)
	}
	if err := h.store.DeletePendingStop(context.Background(), w.Name()); err != nil {
		h.log.Warn("could not forget the pending stop of a stopped engine", "worker", w.Name(), "err", err)
	}
	h.syncRouter()
}

func (h *Hub) onNode(n fleet.Node) {
	h.mu.Lock()
	if _, declared := h.nodes[n.Name]; !declared {
		// A node that left the fleet, kept connected only to stop its engines.
		h.mu.Unlock()
		return
	}
	h.nodes[n.Name] = n
	h.mu.Unlock()
	ctx := context.Background()
	if n.Platform != nil {
		if err := h.store.SetNodeProbe(ctx, n.Name, *n.Platform, n.ProbedAt); err != nil {
			h.log.Warn("could not persist node probe", "node", n.Name, "err", err)
		}
	}
	if err := h.store.SetNodeState(ctx, n.Name, n.State, n.Reason); err != nil {
		h.log.Warn("could not persist node state", "node", n.Name, "err", err)
	}
}

func (h *Hub) onEvent(e fleet.Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if _, err := h.store.AddEvent(context.Background(), e); err != nil {
		h.log.Warn("could not store event", "subject", e.Subject, "err", err)
	}
}

// syncRouter hands the router the ready set, with drained workers marked.
func (h *Hub) syncRouter() {
	h.mu.Lock()
	var bs []router.Backend
	var drained []string
	for name, w := range h.workers {
		if w.State != fleet.WorkerReady && w.State != fleet.WorkerDraining {
			continue
		}
		bs = append(bs, router.Backend{
			Name:       name,
			Model:      w.Model,
			ServedName: h.servedNameLocked(w),
			Engine:     w.Engine,
			Addr:       net.JoinHostPort("127.0.0.1", fmt.Sprint(w.Port)),
			Dial:       h.mgr.Dialer(w.Node),
			Context:    w.Context,
			Slots:      w.Slots,
		})
		if w.Drained || w.State == fleet.WorkerDraining {
			drained = append(drained, name)
		}
	}
	outlook := h.outlookLocked()
	h.mu.Unlock()
	h.router.SetBackendsAndOutlook(bs, outlook)
	for _, name := range drained {
		h.router.Drain(name)
	}
}

// outlookLocked tells the router, per model, which placed workers are on
// their way and which cannot serve: a placement whose worker the manager
// has not reported yet is pending, and a worker stopped on its way to a
// restart (not held by 'fleet stop') is coming back.
func (h *Hub) outlookLocked() map[string]router.Outlook {
	states := map[string][]fleet.WorkerState{}
	for _, p := range h.placements {
		state := fleet.WorkerPending
		if w, ok := h.workers[p.Node+"/"+p.Model]; ok {
			state = w.State
			if state == fleet.WorkerStopped && !w.Held {
				state = fleet.WorkerStarting
			}
		}
		states[p.Model] = append(states[p.Model], state)
	}
	out := make(map[string]router.Outlook, len(states))
	for m, ss := range states {
		out[m] = router.OutlookOf(ss)
	}
	return out
}

func (h *Hub) servedName(w fleet.Worker) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.servedNameLocked(w)
}

// servedNameLocked is the name w's engine answers to, which the router and
// the checks send it (an Ollama tag differs from the model ID).
func (h *Hub) servedNameLocked(w fleet.Worker) string {
	for _, m := range h.models {
		if m.ID == w.Model {
			return enginectl.ServedName(m, w.Engine)
		}
	}
	return w.Model
}

// Snapshot is the fleet as the console shows it now.
func (h *Hub) Snapshot(ctx context.Context) fleet.Snapshot {
	stats := map[string]router.BackendStats{}
	for _, s := range h.router.Stats() {
		stats[s.Name] = s
	}
	h.mu.Lock()
	snap := fleet.Snapshot{At: time.Now(), Models: slices.Clone(h.models)}
	for _, n := range h.nodes {
		snap.Nodes = append(snap.Nodes, n)
	}
	for name, w := range h.workers {
		v := fleet.WorkerView{Worker: w, Host: "?", GPU: "?"}
		if w.Drained && w.State == fleet.WorkerReady {
			v.State = fleet.WorkerDraining // ready ⇄ draining: the hub's drain flag is the state people see
		}
		if n, ok := h.nodes[w.Node]; ok && n.Platform != nil {
			v.Host, v.GPU = n.Platform.HostLabel(), n.Platform.GPULabel()
		}
		if b, ok := h.bench[name]; ok {
			v.Bench, v.BenchAt = b.points, b.at
		}
		if s, ok := stats[name]; ok {
			v.InFlight = s.InFlight
			v.TokPerSec, v.TTFTms, v.ITLms = s.TokPerSec, s.TTFTms, s.ITLms
			v.PredictedTTFTms = s.PredictedTTFTms
			v.TTFTHistory, v.ITLHistory = s.TTFTHistory, s.ITLHistory
			if s.CacheHitKnown {
				v.CacheHit = &s.CacheHit
			}
		}
		snap.Workers = append(snap.Workers, v)
	}
	h.mu.Unlock()
	sort.Slice(snap.Nodes, func(i, j int) bool { return snap.Nodes[i].Name < snap.Nodes[j].Name })
	sort.Slice(snap.Workers, func(i, j int) bool { return snap.Workers[i].Name() < snap.Workers[j].Name() })
	if evs, err := h.store.Events(ctx, "", 0, 100); err == nil {
		snap.Events = evs
	}
	return snap
}

// audit writes the audit line of something that changed nothing (a
// refusal, a failure before acting); a failure to write it is logged.
// Actions write theirs first, with begin.
func (h *Hub) audit(u fleet.User, action, target, outcome string) {
	e := auditEntry(u, action, target, outcome)
	if err := h.store.AddAudit(context.Background(), e); err != nil {
		h.log.Error("could not write the audit line", "user", e.User, "action", action, "target", e.Target, "err", err)
	}
}

// authorize refuses (and audits the refusal of) an action the user's role
// does not allow.
func (h *Hub) authorize(u fleet.User, need fleet.Role, action, target string) error {
	if u.Role.Allows(need) {
		return nil
	}
	h.audit(u, action, target, "denied: needs "+string(need))
	return fmt.Errorf("permission denied: %s needs the %s role; you (%s) are %s", action, need, u.Name, roleName(u.Role))
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func roleName(r fleet.Role) string {
	if r == "" {
		return "nobody"
	}
	return string(r)
}

// resolve turns names typed by an operator into worker names: a node name is
// every worker on it; NODE/MODEL is one worker; "all" is every worker.
func (h *Hub) resolve(targets []string) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, t := range targets {
		if t == "all" {
			if len(h.workers) == 0 {
				return nil, errors.New("the fleet has no workers yet; place a model in the fleet file")
			}
			for name := range h.workers {
				out = append(out, name)
			}
			continue
		}
		if _, ok := h.workers[t]; ok {
			out = append(out, t)
			continue
		}
		var found bool
		for name, w := range h.workers {
			if w.Node == t {
				out = append(out, name)
				found = true
			}
		}
		if !found {
			known := make([]string, 0, len(h.workers))
			for name := range h.workers {
				known = append(known, name)
			}
			sort.Strings(known)
			if _, isNode := h.nodes[t]; isNode {
				return nil, fmt.Errorf("node %q has no workers yet; place a model on it in the fleet file (known workers: %s)", t, listOrNone(known))
			}
			return nil, fmt.Errorf("no worker or node named %q; known workers: %s", t, listOrNone(known))
		}
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// Act drains, undrains or restarts workers, after checking the role.
func (h *Hub) Act(ctx context.Context, u fleet.User, kind string, targets []string) (string, error) {
	target := strings.Join(targets, " ")
	switch kind {
	case "drain", "undrain", "restart", "stop", "start":
	default:
		return "", fmt.Errorf("unknown action %q: use drain, undrain, restart, stop or start", kind)
	}
	if err := h.authorize(u, fleet.ActionRole(kind), kind, target); err != nil {
		return "", err
	}
	names, err := h.resolve(targets)
	if err != nil {
		h.audit(u, kind, target, "failed: "+err.Error())
		return "", err
	}
	if kind == "stop" || kind == "start" {
		return h.stopStart(ctx, u, kind, names)
	}
	var msgs []string
	for _, name := range names {
		line, err := h.begin(u, kind, name)
		if err != nil {
			return strings.Join(msgs, "\n"), err
		}
		var msg string
		switch kind {
		case "drain":
			msg, err = h.drain(name)
		case "undrain":
			msg, err = h.undrain(name)
		case "restart":
			msg, err = h.restart(ctx, name)
		}
		line.endErr(err)
		if err != nil {
			return strings.Join(msgs, "\n"), err
		}
		msgs = append(msgs, msg)
	}
	return strings.Join(msgs, "\n"), nil
}

func (h *Hub) setDrained(name string, drained bool) (fleet.Worker, error) {
	h.mu.Lock()
	w, ok := h.workers[name]
	was := w.Drained
	if ok {
		w.Drained = drained
		h.workers[name] = w
	}
	h.mu.Unlock()
	if !ok {
		return w, fmt.Errorf("worker %s is gone", name)
	}
	if _, err := h.store.SaveWorker(context.Background(), w); err != nil {
		// Not recorded, not done: the flag people see goes back too.
		h.mu.Lock()
		if cur, ok := h.workers[name]; ok {
			cur.Drained = was
			h.workers[name] = cur
		}
		h.mu.Unlock()
		return w, fmt.Errorf("recording the drain flag of %s: %w; nothing was changed", name, err)
	}
	return w, nil
}

func (h *Hub) drain(name string) (string, error) {
	if _, err := h.setDrained(name, true); err != nil {
		return "", err
	}
	h.router.Drain(name)
	inflight := h.router.InFlight(name)
	h.onEvent(fleet.Event{Level: "info", Subject: name, Message: fmt.Sprintf("draining: no new requests; %d in flight", inflight)})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.opts.DrainTimeout)
		defer cancel()
		if err := h.router.WaitIdle(ctx, name); err != nil {
			h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: fmt.Sprintf("drain timed out after %s with %d requests still in flight", h.opts.DrainTimeout, h.router.InFlight(name))})
			return
		}
		h.onEvent(fleet.Event{Level: "info", Subject: name, Message: "drained: no requests in flight"})
	}()
	return fmt.Sprintf("draining %s: no new requests; %d in flight will finish (timeout %s)", name, inflight, h.opts.DrainTimeout), nil
}

func (h *Hub) undrain(name string) (string, error) {
	if _, err := h.setDrained(name, false); err != nil {
		return "", err
	}
	h.router.Undrain(name)
	h.onEvent(fleet.Event{Level: "info", Subject: name, Message: "undrained: taking requests"})
	return fmt.Sprintf("%s takes requests again", name), nil
}

func (h *Hub) restart(ctx context.Context, name string) (string, error) {
	if _, err := h.drain(name); err != nil {
		return "", err
	}
	wait, cancel := context.WithTimeout(ctx, h.opts.DrainTimeout)
	err := h.router.WaitIdle(wait, name)
	cancel()
	if err != nil {
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: "restart: drain timed out; stopping with requests in flight"})
	}
	if err := h.mgr.RestartWorker(ctx, name); err != nil {
		return "", fmt.Errorf("restarting %s: %w; it stays drained, so once it is ready again run `fleet undrain %s`", name, err, name)
	}
	if _, err := h.setDrained(name, false); err != nil {
		return "", err
	}
	h.router.Undrain(name)
	h.mu.Lock()
	w := h.workers[name]
	h.mu.Unlock()
	return fmt.Sprintf("restarted %s: %s", name, strings.Join(w.Argv, " ")), nil
}

// Apply makes the declared fleet match a fleet file.
func (h *Hub) Apply(ctx context.Context, u fleet.User, filename string, data []byte, dryRun bool) (string, error) {
	action := "apply"
	if dryRun {
		action = "apply --dry-run"
	}
	if err := h.authorize(u, fleet.RoleAdmin, action, filename); err != nil {
		return "", err
	}
	if dryRun {
		plan, err := h.apply(ctx, filename, data, true)
		if err != nil {
			h.audit(u, action, filename, "failed: "+err.Error())
		}
		return plan, err
	}
	line, err := h.begin(u, action, filename)
	if err != nil {
		return "", err
	}
	plan, err := h.apply(ctx, filename, data, false)
	line.endErr(err)
	return plan, err
}

func (h *Hub) apply(ctx context.Context, filename string, data []byte, dryRun bool) (string, error) {
	next, err := fleetfile.Parse(filename, data)
	if err != nil {
		return "", err
	}
	if err := fleetfile.RefuseRedacted(filename, next); err != nil {
		return "", err
	}
	// A dry run validates exactly as an apply does, launch checks included.
	for _, m := range next.Models {
		if err := enginectl.CheckRecipes(m); err != nil {
			return "", fmt.Errorf("%s: %w; nothing was changed", filename, err)
		}
	}
	cur, err := h.store.LoadFleet(ctx)
	if err != nil {
		return "", err
	}
	plan := fleetfile.Diff(cur, next)
	if dryRun {
		if plan.Empty() {
			return "no changes\n", nil
		}
		return plan.String(), nil
	}
	if !plan.Empty() {
		if err := h.store.ApplyFleet(ctx, next); err != nil {
			return "", err
		}
	}
	if h.mgr != nil { // nil while Open applies the start-up file
		applied, err := h.store.LoadFleet(ctx)
		if err != nil {
			return "", err
		}
		h.mu.Lock()
		h.models = applied.Models
		h.placements = applied.Placements
		for _, n := range applied.Nodes {
			if old, ok := h.nodes[n.Name]; ok && n.Platform == nil {
				n.Platform = old.Platform
			}
			h.nodes[n.Name] = n
		}
		for name := range h.nodes {
			if !slices.ContainsFunc(applied.Nodes, func(n fleet.Node) bool { return n.Name == name }) {
				delete(h.nodes, name)
			}
		}
		h.mu.Unlock()
		if err := h.router.SetModels(applied.Models); err != nil {
			// The fleet file's validation makes this unreachable; say so loudly if not.
			h.log.Error("the router refused the applied models; it keeps the previous ones", "err", err)
		}
		h.mgr.SetDesired(applied)
		h.syncRouter()
		h.referencesMoved(ctx, cur, applied)
	}
	if plan.Empty() {
		return "no changes\n", nil
	}
	return plan.String(), nil
}

// Export prints the declared fleet as a fleet file; recipe env values are
// redacted for everyone but admins (see fleet.RedactModels).
func (h *Hub) Export(ctx context.Context, u fleet.User) ([]byte, error) {
	f, err := h.store.LoadFleet(ctx)
	if err != nil {
		return nil, err
	}
	if !u.Role.Allows(fleet.RoleAdmin) {
		f.Models = fleet.RedactModels(f.Models)
	}
	return fleetfile.Marshal(f)
}

// Events lists recent events, oldest first.
func (h *Hub) Events(ctx context.Context, subject string, afterID int64, limit int) ([]fleet.Event, error) {
	return h.store.Events(ctx, subject, afterID, limit)
}

// Audit lists recent audit entries; operators and admins may read it.
func (h *Hub) Audit(ctx context.Context, u fleet.User, limit int) ([]fleet.AuditEntry, error) {
	if err := h.authorize(u, fleet.RoleOperator, "audit", ""); err != nil {
		return nil, err
	}
	return h.store.Audit(ctx, limit)
}

// AddUser adds a console user (admin only).
func (h *Hub) AddUser(ctx context.Context, u fleet.User, nu fleet.User) error {
	if err := h.authorize(u, fleet.RoleAdmin, "user add", nu.Name); err != nil {
		return err
	}
	line, err := h.begin(u, "user add", nu.Name+" ("+string(nu.Role)+")")
	if err != nil {
		return err
	}
	err = h.store.AddUser(ctx, nu)
	line.endErr(err)
	return err
}

// RemoveUser removes a console user (admin only).
func (h *Hub) RemoveUser(ctx context.Context, u fleet.User, name string) error {
	if err := h.authorize(u, fleet.RoleAdmin, "user rm", name); err != nil {
		return err
	}
	line, err := h.begin(u, "user rm", name)
	if err != nil {
		return err
	}
	err = h.store.RemoveUser(ctx, name)
	line.endErr(err)
	return err
}

// Users lists console users (admin only).
func (h *Hub) Users(ctx context.Context, u fleet.User) ([]fleet.User, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "user list", ""); err != nil {
		return nil, err
	}
	return h.store.Users(ctx)
}

// WorkerLog returns the last lines of a worker's engine log.
func (h *Hub) WorkerLog(ctx context.Context, name string, lines int) ([]string, error) {
	var buf bytes.Buffer
	if err := h.mgr.WorkerLog(ctx, name, lines, &buf); err != nil {
		return nil, fmt.Errorf("reading the log of %s: %w (%s)", name, err, strings.TrimSpace(buf.String()))
	}
	return strings.Split(strings.TrimRight(buf.String(), "\n"), "\n"), nil
}

// hostKeys backs the SSH transport's host-key pinning with the store.
type hostKeys struct{ st *store.Store }

func (k hostKeys) PinnedHostKey(ctx context.Context, node string) (string, error) {
	n, err := k.st.Node(ctx, node)
	if errors.Is(err, store.ErrNotFound) {
		return pendingHostKey(ctx, k.st, node)
	}
	if err != nil {
		return "", err
	}
	return n.HostKey, nil
}

func (k hostKeys) PinHostKey(ctx context.Context, node, key string) error {
	return k.st.SetNodeHostKey(ctx, node, key)
}

// ForceAdmit overrides a failed admission check (operator; audited).
func (h *Hub) ForceAdmit(ctx context.Context, u fleet.User, worker string) (string, error) {
	if err := h.authorize(u, fleet.RoleOperator, "admit --force", worker); err != nil {
		return "", err
	}
	names, err := h.resolve([]string{worker})
	if err != nil {
		h.audit(u, "admit --force", worker, "failed: "+err.Error())
		return "", err
	}
	for _, name := range names {
		line, err := h.begin(u, "admit --force", name)
		if err != nil {
			return "", err
		}
		if err := h.mgr.ForceAdmit(ctx, name); err != nil {
			line.endErr(err)
			return "", fmt.Errorf("admitting %s: %w", name, err)
		}
		line.end("ok")
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: "admitted by " + u.Name + " over its failed admission check"})
	}
	return fmt.Sprintf("admitted %s over its admission check", strings.Join(names, ", ")), nil
}

// TrustNode forgets a node's pinned host key so the next connection pins the
// key the node presents now (admin; audited). It is how an operator accepts
// a reinstalled machine after the hub refused its changed key.
func (h *Hub) TrustNode(ctx context.Context, u fleet.User, node string) (string, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "node trust", node); err != nil {
		return "", err
	}
	n, err := h.store.Node(ctx, node)
	if err != nil {
		h.audit(u, "node trust", node, "failed: "+err.Error())
		return "", err
	}
	line, err := h.begin(u, "node trust", node)
	if err != nil {
		return "", err
	}
	if err := h.store.SetNodeHostKey(ctx, node, ""); err != nil {
		line.endErr(err)
		return "", err
	}
	h.mgr.RetryNode(node)
	was := "none pinned"
	if n.HostKey != "" {
		was = nodes.HostKeyFingerprint(n.HostKey)
	}
	line.end("ok (was " + was + ")")
	h.onEvent(fleet.Event{Level: "warn", Subject: node, Message: u.Name + " cleared the pinned host key; the next connection pins the key the node presents"})
	return fmt.Sprintf("node %s: pinned host key cleared; connecting again now, and that connection records the new one", node), nil
}

// CreateKey creates a router API key and returns it; only its hash is kept.
func (h *Hub) CreateKey(ctx context.Context, u fleet.User, name string) (string, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "key create", name); err != nil {
		return "", err
	}
	line, err := h.begin(u, "key create", name)
	if err != nil {
		return "", err
	}
	key, err := h.store.CreateAPIKey(ctx, name)
	line.endErr(err)
	return key, err
}

// Keys lists router API keys (names and dates, never the keys).
func (h *Hub) Keys(ctx context.Context, u fleet.User) ([]store.APIKey, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "key list", ""); err != nil {
		return nil, err
	}
	return h.store.APIKeys(ctx)
}

// RevokeKey revokes a router API key at once.
func (h *Hub) RevokeKey(ctx context.Context, u fleet.User, name string) error {
	if err := h.authorize(u, fleet.RoleAdmin, "key revoke", name); err != nil {
		return err
	}
	line, err := h.begin(u, "key revoke", name)
	if err != nil {
		return err
	}
	err = h.store.RevokeAPIKey(ctx, name)
	line.endErr(err)
	return err
}

// SetTheme stores a user's own console theme ("" = from the terminal's background).
func (h *Hub) SetTheme(ctx context.Context, u fleet.User, name string) error {
	if name != "" {
		if _, err := themes.Named(name); err != nil {
			return err
		}
	}
	if u.Fingerprint == "" {
		return fmt.Errorf("%s is not a console user; themes are per SSH user (set one with: ssh -p PORT hub theme NAME)", u.Name)
	}
	return h.store.SetUserTheme(ctx, u.Name, name)
}
