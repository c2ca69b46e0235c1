// Package hub composes the store, the node manager and the router into the
// running fleet hub, and offers the actions (drain, restart, apply, …) that
// the console, SSH exec and the local CLI all call. Roles are enforced and
// audited here, on the server side, by one table (fleet.Actions) and one
// guard (audit.go; do, in actions.go), and what leaves the hub for a user
// is redacted here. The Hub composes parts that own their state: the guard,
// the mirror of the fleet (state.go), the admission package's Judge
// (verdicts on workers: memory, shape, speed, references) and Runs (the
// shape and bench runs users start), Admin (admin.go: users, keys, the
// audit trail), Ledger (usage.go: usage, key limits) and the pruner
// (retention.go); hub.go runs and wires them, actions.go and stop.go act.
// The command tree is given to the hub (Options.Commands) and calls it
// through API, the hub with its parts.
package hub

import (
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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"fleet"
	"fleet/enginectl"
	"fleet/fleetfile"
	"fleet/hub/admission"
	"fleet/internal/mdns"
	"fleet/nodes"
	"fleet/router"
	"fleet/sshserver"
	"fleet/store"
)

// Options configure a hub.
type Options struct {
	// Version is the binary's version line, for `status`.
	Version string
	// DataDir holds the hub's lock, control socket, console host key, the
	// fleet binary simulated engines run from, local nodes' engine files
	// and, without DatabaseURL, the SQLite database fleet.db.
	DataDir string
	// DatabaseURL, when set, puts the state in PostgreSQL
	// (postgres://USER:PASSWORD@HOST:PORT/DATABASE) instead of the data
	// dir's SQLite file.
	DatabaseURL string
	HTTPAddr    string // the router, e.g. 127.0.0.1:8080
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
	// BodiesInFlightMiB and KeyBodiesInFlightMiB bound the request bodies
	// the router holds at once, in all and per API key, in MiB (0 = the
	// router's defaults; negative: no bound).
	BodiesInFlightMiB    int
	KeyBodiesInFlightMiB int
	// WriteTimeout is how long a write of an answer to a router client may
	// block before the client is cut and its engine request cancelled (0 =
	// the router's default; negative: no limit).
	WriteTimeout time.Duration
	// RequireKeys makes the router demand an API key even on loopback; a
	// non-loopback HTTPAddr always does.
	RequireKeys bool
	// CommandLine is how the hub was started, the arguments after
	// "fleet" as typed, for a refusal that says what to run again.
	CommandLine []string
	// MetricsOpenLoopback leaves the router's /metrics open to loopback
	// clients (a Prometheus on the hub's machine) when keys are required.
	MetricsOpenLoopback bool
	// SSHAddr is where the console is served over SSH ("" = no console).
	SSHAddr string
	// AdminKeysFile is an authorized_keys file whose keys become admins.
	AdminKeysFile string
	// Theme is the console's server-wide theme ("" = from each client's background).
	Theme string
	// MDNSName is announced by mDNS as NAME.local with an _ssh._tcp service
	// when the console listens off loopback ("" = no announcement).
	MDNSName string
	// SSHMaxConnsPerIPPerMinute limits failed SSH logins per address a
	// minute (sshserver.Options.MaxConnsPerIPPerMinute; 0 = the server's
	// default; negative disables).
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
	// model's reference worker and for a peer measured faster whose shape is
	// being checked (0 = admission.DefaultWait, 2 min).
	AdmissionWait time.Duration
	// RejectedGrace is how long a rejected worker's engine stays up to be
	// looked at (0 = the node manager's default, 10 min).
	RejectedGrace time.Duration
	// EnginePorts are the ports engines listen on, on nodes whose fleet
	// file entry sets no ports: (zero = fleet.DefaultEnginePorts).
	EnginePorts fleet.PortRange
	// Retention is how long request samples, usage minutes and events are
	// kept in the database (0 = DefaultRetention; negative keeps them all).
	// Audit lines of repeated refusals go after it too.
	Retention time.Duration
	// AuditMaxRows caps the audit log's lines (0 = DefaultAuditMaxRows;
	// negative: no cap); see Store.PruneAudit for which go first.
	AuditMaxRows int
	// Fault is called with the name of each point where a crash is worst
	// (a launch recorded, an engine started, a stop accepted, ...): the
	// crash tests' hub kills itself at one (FLEET_CRASH_AT). nil in use.
	Fault func(point string)
	// HubName names this hub among the hubs sharing a PostgreSQL database
	// ("" = the host name); two live hubs with one name are refused.
	HubName string
	// LeaseTTL is how long the leader's lease lasts unrenewed on
	// PostgreSQL (0 = DefaultLeaseTTL; at least MinLeaseTTL).
	LeaseTTL time.Duration
	// SimProfile looks up a simulated node's profile (sim:PROFILE): the
	// platform its node reports and the engine its workers mimic.
	// cmd/fleet passes the built-in profiles (sim/profiles); nil refuses
	// sim nodes.
	SimProfile func(name string) (fleet.Platform, fleet.EngineKind, error)
	// Commands runs one command line (SSH exec, the control socket)
	// against this hub; cmd/fleet passes the command tree (cli.Run). It is
	// given, not imported, so that the hub stays below the CLI it serves.
	// Nil refuses every command line.
	Commands Commands
}

// Commands runs one command line for user u against the hub's API and
// returns its exit status.
type Commands func(ctx context.Context, api API, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int

// API is what the command tree and the console call: the hub's own
// commands and those of the parts it composes, each answered by the part
// that owns it (users and keys by Admin, usage and key limits by Ledger, shape
// and bench by admission's Runs).
type API struct {
	*Hub
	*Admin
	*Ledger
	*admission.Runs
}

// API is the hub with the parts it composes, for the command tree.
func (h *Hub) API() API { return API{Hub: h, Admin: h.admin, Ledger: h.ledger, Runs: h.runs} }

// Hub is the running fleet hub.
type Hub struct {
	opts   Options
	log    *slog.Logger
	store  *store.Store
	mgr    *nodes.Manager
	router *router.Router

	// saveMu orders the writes of worker rows (recordWorker).
	saveMu sync.Mutex
	// state is the hub's copy of the fleet as the node manager last
	// reported it (state.go).
	state *mirror
	// judge judges workers leaving probation, and again when their model's
	// reference moves; runs are the shape and bench runs users start
	// (package admission).
	judge *admission.Judge
	runs  *admission.Runs
	// mu guards httpAddr, started and lanName.
	mu sync.Mutex

	samples chan fleet.Sample
	// httpAddr is where the router listens, once Run has bound it, and
	// started when (for `status`).
	httpAddr string
	started  time.Time
	// lock is the data dir's lock, held until Close.
	lock *os.File
	// lanName is the console's mDNS name once announced (announce.go).
	lanName string
	// guard authorizes and audits every action a user asks for (audit.go).
	guard *guard
	// pruner keeps history within its retention (retention.go).
	pruner *pruner
	// detached is the work actions start and do not wait for; Close ends it.
	detached *background
	// admin answers the user, key and audit-trail commands (admin.go);
	// ledger keeps the keys' usage and limits (usage.go).
	admin  *Admin
	ledger *Ledger
	// cluster is this hub's part in a fleet of several hubs on one
	// PostgreSQL database: the lease, leading or following (cluster.go).
	cluster *cluster
}

// LocalAdmin is who acts through the control socket: the hub's own OS user.
func LocalAdmin() fleet.User {
	name := os.Getenv("USER")
	if name == "" {
		name = "local"
	}
	return fleet.User{Name: name + "@hub", Role: fleet.RoleAdmin}
}

// Admission names what it asks of a store and a router (admission.Store,
// admission.Router); the hub hands it its own.
var (
	_ admission.Store  = (*store.Store)(nil)
	_ admission.Router = (*router.Router)(nil)
)

// Open prepares a hub: opens (and migrates) the database, applies the demo or
// fleet file, and restores the workers the database knew.
func Open(ctx context.Context, opts Options) (_ *Hub, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DrainTimeout < 0 {
		return nil, fmt.Errorf("--drain-timeout %s is negative; give how long a drain waits for requests in flight, e.g. 5m", opts.DrainTimeout)
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
	st, err := openStore(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	if err := checkHome(ctx, st, opts.DataDir, opts.DatabaseURL); err != nil {
		return nil, err
	}
	h := &Hub{
		opts:  opts,
		log:   opts.Logger,
		store: st,
		guard: &guard{store: st, log: opts.Logger},
		state: &mirror{
			workers: map[string]fleet.Worker{},
			nodes:   map[string]fleet.Node{},
			bench:   map[benchKey]admission.BenchSummary{},
		},
		samples: make(chan fleet.Sample, 4096),
		lock:    lock,

		detached: newBackground(),
	}
	if h.cluster, err = newCluster(h, st, opts); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			h.cluster.leave()
		}
	}()
	// Before the fleet file: a hub refused for its name changes nothing,
	// and one that takes the lease now may apply it.
	if err := h.cluster.register(ctx, opts.HTTPAddr, opts.SSHAddr, opts.Version); err != nil {
		return nil, err
	}
	if err := h.guard.interruptedBefore(ctx, h.cluster.name, h.cluster.instance); err != nil {
		return nil, err
	}
	if stored, err := st.LoadFleet(ctx); err != nil {
		return nil, err
	} else if err := h.cluster.checkMachines(ctx, stored); err != nil {
		return nil, fmt.Errorf("this hub cannot join the fleet: %w", err)
	}
	h.pruner = newPruner(st, opts.Logger, h.guard, opts)
	h.ledger = &Ledger{guard: h.guard, store: st, log: opts.Logger, keys: keyCache{store: st}}
	h.admin = &Admin{guard: h.guard, store: st, ledger: h.ledger}
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
		if err := requireKeys(ctx, st, opts); err != nil {
			return nil, err
		}
		if err := h.ledger.keys.reload(ctx); err != nil {
			return nil, err
		}
		keys = &h.ledger.keys
	} else {
		h.ledger.keysNotChecked = router.KeysNotCheckedNote
	}
	if err := requireConsoleAdmins(ctx, st, opts); err != nil {
		return nil, err
	}
	if opts.MDNSName != "" {
		if _, err := mdns.ParseName(opts.MDNSName); err != nil {
			return nil, fmt.Errorf("--mdns: %w", err)
		}
	}
	// Built before the fleet file is applied, so that a bad --policy
	// changes nothing.
	reg := prometheus.NewRegistry()
	reg.MustRegister(newHubCollector(h))
	rt, err := router.New(router.Options{
		Logger:       opts.Logger.With("component", "router"),
		Registerer:   reg,
		Policy:       opts.Policy,
		QueueTimeout: opts.QueueTimeout,
		QueueSize:    opts.QueueSize,
		BodyTimeout:  opts.BodyTimeout,
		WriteTimeout: opts.WriteTimeout,
		// Negative stays negative (no bound), 0 the default.
		MaxBodiesInFlight:    int64(opts.BodiesInFlightMiB) << 20,
		MaxKeyBodiesInFlight: int64(opts.KeyBodiesInFlightMiB) << 20,
		Keys:                 keys,
		// A request got no first byte: is the worker's node still there?
		OnNoFirstByte: h.checkWorkerNode,
		OnSample: func(s fleet.Sample) {
			select {
			case h.samples <- s:
			default: // the store is behind; a lost sample costs a sparkline point, not a request
			}
		},
		// Tokens per key, model and worker, batched to SQLite (usage.go).
		OnUsage:             h.ledger.usage.add,
		MetricsOpenLoopback: opts.MetricsOpenLoopback,
		Health:              h.cluster.health,
	})
	if err != nil {
		return nil, fmt.Errorf("--policy: %w", err)
	}
	h.router = rt
	h.ledger.router = rt
	if err := h.ledger.loadKeyLimits(ctx); err != nil {
		return nil, err
	}
	switch {
	case opts.FleetFile != "":
		data, err := os.ReadFile(opts.FleetFile)
		if err != nil {
			return nil, fmt.Errorf("reading the fleet file: %w", err)
		}
		if _, err := h.apply(ctx, filepath.Base(opts.FleetFile), data, false); err != nil {
			return nil, h.cluster.startApplyError("--fleet "+opts.FleetFile, err)
		}
	case opts.Demo:
		if _, err := h.apply(ctx, "demo fleet", fleetfile.Demo, false); err != nil {
			return nil, h.cluster.startApplyError("--demo", err)
		}
	}
	identity, err := st.Identity(ctx)
	if err != nil {
		return nil, err
	}
	h.mgr = nodes.NewManager(nodes.ManagerOptions{
		FleetID:    identity.FleetID,
		LastLaunch: identity.Launches,
		OnNewerEngine: func(pid int, launch int64) {
			if err := st.SawNewerLaunch(context.WithoutCancel(ctx), launch); err != nil {
				opts.Logger.Error("could not record an engine of a newer copy of the database", "pid", pid, "launch", launch, "err", err)
			}
		},
		RecordLaunch:      h.recordLaunch,
		RecordWorker:      h.recordWorker,
		Fault:             opts.Fault,
		Logger:            opts.Logger.With("component", "nodes"),
		DataDir:           opts.DataDir,
		FleetBin:          h.opts.FleetBin,
		ProbeInterval:     opts.ProbeInterval,
		ReconcileInterval: opts.ReconcileInterval,
		HostKeys:          hostKeys{st},
		SimPlatform:       simPlatform(opts.SimProfile),
		SimMimic:          simMimic(opts.SimProfile),
		// The judge is built on the manager just below; the manager asks
		// for verdicts only once it runs.
		Gate: func(ctx context.Context, w fleet.Worker, n fleet.Node, held nodes.Held) ([]int, error) {
			return h.judge.Gate(ctx, w, n, held)
		},
		Admit:           func(ctx context.Context, w fleet.Worker) error { return h.judge.Admit(ctx, w) },
		RejectedGrace:   opts.RejectedGrace,
		PortMin:         h.enginePorts().Min,
		PortMax:         h.enginePorts().Max,
		OnWorker:        h.onWorker,
		OnWorkerRemoved: h.onWorkerRemoved,
		OnNode:          h.onNode,
		OnNodeSuspect:   h.onNodeSuspect,
		OnEvent:         h.onEvent,
		// On PostgreSQL a hub leads only while it holds the lease.
		Following:     h.cluster.on,
		StillLeading:  h.cluster.stillLeading,
		OtherDataDirs: h.cluster.otherDataDirs,
	})
	if h.judge, h.runs, err = admission.New(ctx, admission.Config{
		Fleet: h.state, Guard: guardForRuns{h.guard}, Nodes: h.mgr, Store: st, Router: rt, Log: opts.Logger,
		Registerer: reg, Event: h.onEvent, RouterAddr: h.routerAddr, Detach: h.detached.goDetached,
		OnLeader: h.cluster.onLeader, Wait: opts.AdmissionWait,
	}); err != nil {
		return nil, err
	}
	f, err := st.LoadFleet(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range f.Nodes {
		h.state.nodes[n.Name] = n
	}
	h.state.models = f.Models
	h.state.placements = f.Placements
	h.judge.CountModels(f.Models)
	if err := h.router.SetModels(f.Models); err != nil {
		return nil, err
	}
	known, err := st.Workers(ctx)
	if err != nil {
		return nil, err
	}
	_, leader := h.cluster.role()
	for _, w := range known {
		// What the store says is history until the node manager has checked
		// the engine: a worker is not shown (or routed to) as ready before.
		// Unless another hub leads the fleet now: then it is the leader's
		// word, and this hub routes by it at once.
		if w.State != fleet.WorkerStopped && w.State != fleet.WorkerRejected && (leader == "" || leader == h.cluster.name) {
			w.State, w.Reason = fleet.WorkerStarting, "checking the engine recorded before the hub restarted"
		}
		h.state.workers[w.Name()] = w
	}
	h.mgr.SetDesired(f)
	if !h.cluster.on {
		// On PostgreSQL the workers are handed over when this hub leads.
		h.mgr.Restore(known)
		if err := h.restorePendingStops(ctx, f); err != nil {
			return nil, err
		}
	}
	h.syncRouter()
	return h, nil
}

// simPlatform and simMimic hand the node manager the sim profile lookup
// cmd/fleet gave (Options.SimProfile); without one, sim nodes are refused
// with an error that names the option (only a test or a program embedding
// the hub can leave it out).
func simPlatform(lookup func(string) (fleet.Platform, fleet.EngineKind, error)) func(string) (fleet.Platform, error) {
	if lookup == nil {
		return func(string) (fleet.Platform, error) {
			return fleet.Platform{}, errors.New("this hub was opened without hub.Options.SimProfile, the lookup of sim profiles: open it with one (cmd/fleet passes the built-in profiles of sim/profiles), or give the node a user@host or local address")
		}
	}
	return func(profile string) (fleet.Platform, error) {
		p, _, err := lookup(profile)
		return p, err
	}
}

func simMimic(lookup func(string) (fleet.Platform, fleet.EngineKind, error)) func(string) fleet.EngineKind {
	if lookup == nil {
		return nil
	}
	return func(profile string) fleet.EngineKind {
		_, mimic, err := lookup(profile)
		if err != nil {
			return ""
		}
		return mimic
	}
}

// requireKeys refuses to open the router to a network without a single API
// key to check: that would be an open inference endpoint on the LAN. The
// refusal names the flag that asked for keys and the command line to run
// again once the first key is made without a hub (CreateKeyWithoutHub).
func requireKeys(ctx context.Context, st *store.Store, opts Options) error {
	keys, err := st.APIKeys(ctx)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.Revoked.IsZero() {
			return nil
		}
	}
	why := "--require-keys"
	if !fleet.IsLoopbackAddr(opts.HTTPAddr) {
		why = "--http " + opts.HTTPAddr + " is off loopback"
	}
	again := "then start the hub again with the same flags"
	if len(opts.CommandLine) > 0 {
		// Never the database URL's password, which the line may hold.
		line := fleet.RedactArgv(opts.CommandLine)
		again = "then run again: fleet " + nodes.ShellQuote(line)
		if !slices.Equal(line, opts.CommandLine) {
			again += " with each " + fleet.Redacted + " as you gave it"
		}
	}
	create := "fleet key create NAME --data " + nodes.ShellQuote([]string{opts.DataDir})
	if opts.DatabaseURL != "" {
		create = "FLEET_DATABASE_URL=URL " + create + " (URL: the hub's database URL)"
	}
	return fmt.Errorf("the router would listen on %s and require API keys (%s), but none exists; "+
		"create the first one without a hub: %s (it prints the key once), %s",
		opts.HTTPAddr, why, create, again)
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
	err = os.WriteFile(tmp, data, 0o700)
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		// A partial copy (a full disk) would only take more of the space.
		os.Remove(tmp)
		return "", fmt.Errorf("installing the fleet binary for simulated engines as %s (free some space in %s, or fix its permissions, and start again): %w",
			dst, filepath.Dir(dst), err)
	}
	return dst, nil
}

// Close releases the database. Engines keep running: a hub that stops must
// not take the fleet down with it.
func (h *Hub) Close() error {
	h.cluster.leave()
	h.detached.close()
	h.guard.flushRefusals()
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
			Users:                    newConsoleUsers(h.store),
			Audit:                    h.guard.auditSSH,
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
			DrainTimeout:             h.opts.DrainTimeout,
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
		// Every hub serves the console, a follower as well as the leader;
		// on PostgreSQL it is announced only while this hub can serve.
		if h.cluster.on {
			spawn(func() { h.cluster.announceWhileServing(ctx, h.announce) })
		} else {
			defer h.announce()()
		}
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
	spawn(func() { h.ledger.flushUsage(ctx, usageFlushInterval) })
	if h.cluster.on {
		// Other hubs may share the database: the keys are read again when
		// one changes there, and their limits are held with the others.
		ks := newKeySync(h.store, h.router.KeyBook(), h.cluster.name, h.log.With("component", "keys"))
		spawn(func() { ks.run(ctx, keySyncInterval) })
		spawn(func() { h.ledger.watchKeys(ctx, h.cluster.keysChanged, keyReloadInterval) })
	}
	spawn(func() { h.pruner.run(ctx, pruneInterval) })
	spawn(func() { h.scrapeEngines(ctx, engineScrapeInterval) })
	h.mu.Lock()
	h.httpAddr, h.started = ln.Addr().String(), time.Now()
	h.mu.Unlock()
	spawn(func() { h.cluster.run(ctx, ln.Addr().String(), h.opts.SSHAddr, h.opts.Version) })
	h.log.Info("hub running", "router", ln.Addr().String(), "data", h.opts.DataDir)
	if ready != nil {
		ready(ln.Addr().String())
	}
	<-ctx.Done()
	shutdown, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	_ = srv.Shutdown(shutdown)
	wg.Wait()
	// After the node manager stopped: the lease goes to another hub at once.
	h.cluster.leave()
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
	return h.Exec(ctx, LocalAdmin(), args, stdin, stdout, stderr)
}

// Exec runs one command line for an SSH user.
func (h *Hub) Exec(ctx context.Context, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if h.opts.Commands == nil {
		fmt.Fprintln(stderr, "this hub was opened without a command tree (hub.Options.Commands), so it runs no command lines; start it with fleet serve")
		return 1
	}
	return h.opts.Commands(ctx, h.API(), u, args, stdin, stdout, stderr)
}

// flushSamples batches the router's measurements into the store, so a
// request never waits on the database. A batch the database does not take
// is kept (bounded) and written with the next, once a second.
func (h *Hub) flushSamples(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var batch sampleBatch
	failing := false
	write := func() { failing = batch.write(context.WithoutCancel(ctx), h.store, h.log) != nil }
	for {
		select {
		case s := <-h.samples:
			batch.add(s)
			// A database that refused the last write is not asked again
			// before the next tick.
			if len(batch.rows) >= 512 && !failing {
				write()
			}
		case <-t.C:
			write()
		case <-ctx.Done():
			write()
			return
		}
	}
}

// maxPendingSamples bounds the request samples waiting for the database
// (about 100 bytes each): 20 s of 1,000 requests a second, kept while it
// does not answer; further ones are dropped, counted in the log.
const maxPendingSamples = 20000

// sampleBatch is the request samples not yet written.
type sampleBatch struct {
	rows    []fleet.Sample
	dropped int
}

func (b *sampleBatch) add(s fleet.Sample) {
	if len(b.rows) >= maxPendingSamples {
		b.dropped++
		return
	}
	b.rows = append(b.rows, s)
}

// write stores the batch; what the store refuses is kept for the next.
func (b *sampleBatch) write(ctx context.Context, st *store.Store, log *slog.Logger) error {
	if b.dropped > 0 {
		log.Warn("request samples dropped: the database fell behind", "dropped", b.dropped)
		b.dropped = 0
	}
	if len(b.rows) == 0 {
		return nil
	}
	if err := st.AddSamples(ctx, b.rows); err != nil {
		log.Warn("could not store request samples; keeping them for the next try", "n", len(b.rows), "err", err)
		return err
	}
	b.rows = b.rows[:0]
	return nil
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
		// The mirror's workers, not the manager's: a follower's manager
		// supervises none, and its router needs the engines' load as much.
		for _, w := range h.state.ready() {
			wg.Add(1)
			go func() { // one per worker: an unreachable node must not delay the others
				defer wg.Done()
				at := time.Now()
				l, err := h.mgr.ScrapeWorker(ctx, w)
				if err != nil {
					if !errors.Is(err, enginectl.ErrNoLoadSignal) && ctx.Err() == nil {
						h.log.Debug("engine load scrape failed", "worker", w.Name(), "err", err)
					}
					return
				}
				h.router.ObserveEngineLoad(w.Name(), router.EngineLoad{Running: l.Running, Waiting: l.Waiting, Slots: l.Slots, At: at})
			}()
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.scrapeEngineMetrics(ctx, w)
			}()
		}
		wg.Wait()
	}
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
