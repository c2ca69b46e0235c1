package hub

// Several hubs on one PostgreSQL database (docs/postgres.md): every hub
// routes and serves the console and the CLI; the one holding the lease, the
// leader, drives the nodes. cluster is that part of a hub: the lease and
// the heartbeat, switching between leading and following, the follower's
// mirror fed from the database, and the actions a follower's users ask for,
// which the leader carries out. On SQLite there is one hub, the leader
// always, and none of it runs.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/store"
)

const (
	// DefaultLeaseTTL is how long the leader's lease lasts unrenewed
	// (serve --lease-ttl).
	DefaultLeaseTTL = 6 * time.Second
	// leaseRenewEvery paces the lease's renewal and the hub's heartbeat.
	leaseRenewEvery = 2 * time.Second
	// leaseStopMargin: a leader stops driving the nodes this long before
	// its lease expires, counted by its own monotonic clock from when the
	// last renewal began, so that it has stopped before another hub may
	// take over (the database's clock and this one's may drift).
	leaseStopMargin = 2 * time.Second
	// MinLeaseTTL leaves a leader one missed renewal before it stops.
	MinLeaseTTL = leaseRenewEvery + leaseStopMargin + time.Second
	// actionPoll is how often a follower waiting for its action looks at
	// it without a notification (one lost to a reconnection).
	actionPoll = time.Second
	// drainPoll paces a hub's look at its requests in flight on drained
	// workers (published when they change) and the leader's look at the
	// other hubs' while a drain waits: a drain ends at most about two of
	// them after the last request on any hub.
	drainPoll = 250 * time.Millisecond
)

// Hub roles, as status and /healthz say them.
const (
	RoleLeader   = "leader"
	RoleFollower = "follower"
	// RoleGone is status's word for a hub whose heartbeat lapsed.
	RoleGone = "gone"
)

// errNoLeader is an action asked on a follower while no hub leads.
var errNoLeader = errors.New("no hub holds the leader's lease, so nothing was done; see `fleet status` for the hubs and their heartbeats")

// cluster is a hub's part in a fleet of several hubs.
type cluster struct {
	h   *Hub
	st  *store.Store
	log *slog.Logger
	// name is the hub's (--hub-name), instance this process's, home its
	// data dir as HOST:PATH.
	name, instance, home string
	ttl                  time.Duration
	// on: several hubs may share the database (PostgreSQL).
	on bool

	// turn serialises becoming leader, becoming follower and reloading
	// the follower's mirror.
	turn sync.Mutex

	mu      sync.Mutex
	leading bool
	epoch   int64
	// until is when this leader stops driving the nodes unless it renews
	// (monotonic: the renewal's start + ttl - leaseStopMargin).
	until time.Time
	// leader is the hub holding the lease as last seen ("" none).
	leader string
	// nameTaken: another instance took this hub's name while this one
	// missed its heartbeats (it was frozen or cut off); until this one
	// has it back, it is unhealthy, so that keepalived sends the clients
	// elsewhere.
	nameTaken bool
	// dbSeen is when the database last answered.
	dbSeen time.Time
	// readAt is when, by the database's clock, this hub read the workers
	// its router follows (a follower's last reload): what it publishes
	// with its requests in flight on drained workers.
	readAt int64

	// waiters wake the followers' callers waiting for an action (by ID);
	// serve wakes the leader's action server.
	waitMu  sync.Mutex
	waiters map[int64]chan struct{}
	serve   chan struct{}
	// claim asks for a lease claim now (the lease was released).
	claim chan struct{}
	// keysChanged tells the ledger that an API key was created, revoked
	// or had its limits changed on some hub, or may have been (listening
	// began again): it reads the keys again (Ledger.watchKeys).
	keysChanged chan struct{}
	// left makes leave run once (Close, or Open failing after register).
	left sync.Once
	// publish asks for this hub's requests in flight on drained workers to
	// be published now (the mirror was reloaded).
	publish chan struct{}
}

func newCluster(h *Hub, st *store.Store, opts Options) (*cluster, error) {
	name := opts.HubName
	if name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return nil, fmt.Errorf("naming this hub: the host name is unknown (%v); pass --hub-name NAME", err)
		}
		name = host
	}
	if len(name) > 64 || fleet.Sanitize(name) != name {
		return nil, fmt.Errorf("--hub-name %q: a hub name is at most 64 printable characters; choose another", name)
	}
	ttl := opts.LeaseTTL
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if ttl < MinLeaseTTL {
		return nil, fmt.Errorf("--lease-ttl %s is too short: the lease is renewed every %s and its leader stops %s before it expires, so give at least %s (default %s)",
			ttl, leaseRenewEvery, leaseStopMargin, MinLeaseTTL, DefaultLeaseTTL)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	home, err := dataHome(opts.DataDir)
	if err != nil {
		return nil, err
	}
	c := &cluster{h: h, st: st, log: opts.Logger.With("component", "cluster"), name: name, instance: hex.EncodeToString(b[:]),
		home: host + ":" + home, ttl: ttl, on: st.Clustered(),
		waiters: map[int64]chan struct{}{}, serve: make(chan struct{}, 1), claim: make(chan struct{}, 1),
		keysChanged: make(chan struct{}, 1), publish: make(chan struct{}, 1)}
	if !c.on {
		c.leading, c.leader = true, name
	}
	return c, nil
}

// register enters this hub in the hubs table, refusing a name another live
// hub has, and on PostgreSQL tries the lease once: a hub that gets it may
// apply its start-up fleet file before Run.
func (c *cluster) register(ctx context.Context, httpAddr, sshAddr, version string) error {
	if !c.on {
		return nil
	}
	if err := c.st.RegisterHub(ctx, store.HubInfo{Name: c.name, Instance: c.instance, Home: c.home,
		HTTPAddr: httpAddr, SSHAddr: sshAddr, Version: version}); err != nil {
		return err
	}
	l, err := c.st.ClaimLease(ctx, c.name, c.ttl)
	if err != nil {
		return err
	}
	c.sawDB()
	c.mu.Lock()
	c.leader = l.Holder
	if l.ValidFor <= 0 {
		c.leader = ""
	}
	c.mu.Unlock()
	if l.Leader {
		// Not leading yet (the manager does not run): Run's first renewal
		// starts the term. Writes at this epoch are the start-up apply's.
		c.st.SetEpoch(l.Epoch)
	}
	return nil
}

// role is this hub's role now; leader names the hub leading ("" none).
func (c *cluster) role() (role, leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leading {
		return RoleLeader, c.name
	}
	return RoleFollower, c.leader
}

// stillLeading is the node manager's check before each act on an engine:
// whether this hub's lease is still valid by its own monotonic clock.
func (c *cluster) stillLeading() bool {
	if !c.on {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading && time.Now().Before(c.until)
}

func (c *cluster) sawDB() {
	c.mu.Lock()
	c.dbSeen = time.Now()
	c.mu.Unlock()
}

// dbAnswers says whether the database answered within the lease's time.
func (c *cluster) dbAnswers() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.dbSeen) < c.ttl
}

// run keeps the lease, the heartbeat, the follower's mirror and the action
// queue until ctx ends; then it gives the lease up and leaves the hubs
// table. The node manager must have stopped acting by then (Run waits for
// it first).
func (c *cluster) run(ctx context.Context, httpAddr, sshAddr, version string) {
	if !c.on {
		<-ctx.Done()
		return
	}
	// The row again with the address the router got.
	if err := c.st.RegisterHub(ctx, store.HubInfo{Name: c.name, Instance: c.instance, Home: c.home,
		HTTPAddr: httpAddr, SSHAddr: sshAddr, Version: version}); err != nil {
		c.log.Error("could not update this hub's row", "err", err)
	}
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); c.publishDrains(ctx) }()
	go func() { defer wg.Done(); c.listen(ctx) }()
	go func() { defer wg.Done(); c.serveActions(ctx) }()
	go func() { defer wg.Done(); c.keepLease(ctx) }()
	wg.Wait()
}

// leave ends this hub's part, once: following (engines left as they run),
// the lease released so another hub takes over at once, its row removed.
func (c *cluster) leave() {
	if !c.on {
		return
	}
	c.left.Do(c.leaveOnce)
}

func (c *cluster) leaveOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c.mu.Lock()
	leading := c.leading
	c.leading, c.until = false, time.Time{}
	c.mu.Unlock()
	if leading && c.h.mgr != nil {
		c.h.mgr.SetLeading(false, nil)
	}
	// The epoch register took (a hub opened, not run) or the term's.
	if epoch := c.st.Epoch(); epoch != 0 {
		if err := c.st.ReleaseLease(ctx, c.name, epoch); err != nil {
			c.log.Warn("could not release the lease; another hub takes over when it expires", "err", err)
		}
	}
	c.st.SetEpoch(0)
	if err := c.st.UnregisterHub(ctx, c.name, c.instance); err != nil {
		c.log.Warn("could not remove this hub from the hubs table; it shows until its heartbeat is old", "err", err)
	}
}

func (c *cluster) keepLease(ctx context.Context) {
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	for {
		c.renew(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.claim:
		}
	}
}

// renew renews or claims the lease, and leads or follows as the database
// answers. A leader that cannot renew stops driving the nodes once its
// lease, by its own clock, is within leaseStopMargin of expiring.
func (c *cluster) renew(ctx context.Context) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, leaseRenewEvery)
	defer cancel()
	// The heartbeat first: an instance whose name another took (it was
	// thought dead) must not renew the lease that name holds.
	if err := c.st.HubHeartbeat(rctx, c.name, c.instance); errors.Is(err, store.ErrHubNameTaken) {
		// Registered again once the name is free (the other stopped, or
		// its heartbeat lapsed).
		if err := c.st.RegisterHub(rctx, store.HubInfo{Name: c.name, Instance: c.instance, Home: c.home,
			HTTPAddr: c.h.routerAddr(), SSHAddr: c.h.opts.SSHAddr, Version: c.h.opts.Version}); err != nil {
			c.mu.Lock()
			first := !c.nameTaken
			c.nameTaken = true
			c.mu.Unlock()
			if first {
				c.log.Error("another hub runs with this hub's name: this one follows, claims nothing and answers /healthz 503 until it has the name back; stop one of them", "err", err)
			}
			c.follow(ctx, "another hub took its name")
			return
		}
		c.mu.Lock()
		was := c.nameTaken
		c.nameTaken = false
		c.mu.Unlock()
		if was {
			c.log.Info("this hub has its name again", "hub", c.name)
		}
	}
	l, err := c.st.ClaimLease(rctx, c.name, c.ttl)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		c.mu.Lock()
		lapsed := c.leading && !time.Now().Before(c.until)
		c.mu.Unlock()
		c.log.Warn("could not renew or claim the leader's lease", "err", err)
		if lapsed {
			c.follow(ctx, "its lease lapsed: the database did not answer its renewal")
		}
		return
	}
	c.sawDB()
	if !l.Leader {
		c.mu.Lock()
		c.leader = l.Holder
		if l.ValidFor <= 0 {
			c.leader = ""
		}
		leading := c.leading
		c.mu.Unlock()
		if leading {
			c.follow(ctx, "hub "+l.Holder+" holds the lease now")
		}
		return
	}
	c.mu.Lock()
	c.until = start.Add(c.ttl - leaseStopMargin)
	c.leader = c.name
	same := c.leading && c.epoch == l.Epoch
	c.mu.Unlock()
	if !same {
		c.lead(ctx, l.Epoch)
	}
}

// lead starts a term of leadership at epoch: the node manager adopts every
// worker the database has (by PID and recorded argv; nothing restarted)
// and the engines of removed placements still to stop, and the action
// queue is served.
func (c *cluster) lead(ctx context.Context, epoch int64) {
	c.turn.Lock()
	defer c.turn.Unlock()
	c.mu.Lock()
	was := c.leading
	c.leading = false
	c.mu.Unlock()
	if was {
		// Its lease lapsed and it took it again: another hub may have led
		// meanwhile, so the term starts anew from the database.
		c.h.mgr.SetLeading(false, nil)
	}
	c.st.SetEpoch(epoch)
	// Taken, nothing adopted yet: a hub dying here leaves a lease that
	// only expires, the former leader's actions unfailed and its stops
	// undone, for the next leader.
	c.h.fault("lease.taken")
	f, known, err := c.readFleet(ctx)
	if err != nil {
		c.st.SetEpoch(0)
		c.log.Error("took the lease but could not read the fleet; trying again at the next renewal", "err", err)
		return
	}
	c.setMirror(f, known)
	c.h.mgr.SetDesired(f)
	c.mu.Lock()
	c.leading, c.epoch = true, epoch
	c.mu.Unlock()
	// The leader records the nodes' state; what this hub saw while it
	// followed goes in now.
	for _, n := range c.h.state.nodeList() {
		c.h.onNode(n)
	}
	if err := c.h.restorePendingStops(ctx, f); err != nil {
		c.log.Error("could not hand over the engines of removed placements still to stop", "err", err)
	}
	c.h.mgr.SetLeading(true, known)
	c.log.Info("this hub leads the fleet", "hub", c.name, "epoch", epoch, "workers", len(known))
	c.h.onEvent(fleet.Event{Level: "info", Subject: c.name, Message: fmt.Sprintf("hub %s leads the fleet (lease epoch %d): it adopts the engines and drives the nodes", c.name, epoch)})
	if n, err := c.st.FailOrphanedActions(ctx); err != nil {
		c.log.Warn("could not fail the actions a former leader left unfinished", "err", err)
	} else if n > 0 {
		c.log.Warn("actions a former leader took and did not finish were failed; their callers are told to look", "n", n)
	}
	signal(c.serve)
}

// follow ends this hub's term, if any, without touching an engine, and
// mirrors the fleet from the database.
func (c *cluster) follow(ctx context.Context, why string) {
	c.turn.Lock()
	c.mu.Lock()
	was := c.leading
	c.leading, c.until = false, time.Time{}
	c.mu.Unlock()
	if was {
		c.h.mgr.SetLeading(false, nil)
		c.st.SetEpoch(0)
		c.log.Warn("this hub no longer leads the fleet; it follows", "hub", c.name, "why", why)
		c.h.onEvent(fleet.Event{Level: "warn", Subject: c.name, Message: "hub " + c.name + " no longer leads the fleet (" + why + "); engines are left as they run"})
	}
	c.turn.Unlock()
	c.reload(ctx)
}

// readFleet reads the declared fleet and the workers.
func (c *cluster) readFleet(ctx context.Context) (fleet.Fleet, []fleet.Worker, error) {
	f, err := c.st.LoadFleet(ctx)
	if err != nil {
		return f, nil, err
	}
	known, err := c.st.Workers(ctx)
	return f, known, err
}

// reload mirrors the fleet from the database on a follower; on a leader
// the node manager's reports are the mirror. A failure keeps the mirror
// (and the routing) as it was.
func (c *cluster) reload(ctx context.Context) {
	c.turn.Lock()
	defer c.turn.Unlock()
	if role, _ := c.role(); role == RoleLeader {
		return
	}
	// The clock first: the workers read after it are at least as new.
	readAt, err := c.st.Now(ctx)
	var f fleet.Fleet
	var known []fleet.Worker
	if err == nil {
		f, known, err = c.readFleet(ctx)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("could not read the fleet from the database; routing to the workers known before", "err", err)
		}
		return
	}
	c.sawDB()
	c.setMirror(f, known)
	c.h.mgr.SetDesired(f)
	c.mu.Lock()
	c.readAt = readAt
	c.mu.Unlock()
	signal(c.publish)
}

// publishDrains publishes, whenever they change, this hub's requests in
// flight on the workers its router serves drained, with when it read the
// workers (readAt): a drain waits on the leader until every live hub has
// read it and has none in flight (waitIdle). Nothing is written while no
// worker is drained.
func (c *cluster) publishDrains(ctx context.Context) {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	var (
		last       map[string]int // RegisterHub cleared this hub's rows
		lastReadAt int64
		failing    bool
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.publish:
		}
		// readAt before the workers: a newer one comes with its workers
		// already in the router (reload sets it after setMirror).
		c.mu.Lock()
		readAt := c.readAt
		c.mu.Unlock()
		inflight := c.h.drainedInFlight()
		if maps.Equal(inflight, last) && (len(inflight) == 0 || readAt == lastReadAt) {
			continue
		}
		if err := c.st.PublishDrainInFlight(ctx, c.name, readAt, inflight); err != nil {
			if !failing && ctx.Err() == nil {
				c.log.Warn("could not publish this hub's requests in flight on drained workers; the leader's drains wait for it until it does or their timeout", "err", err)
			}
			failing = true
			continue
		}
		failing = false
		last, lastReadAt = inflight, readAt
	}
}

// waitIdle waits until no hub has a request in flight on worker name, or
// ctx ends: this hub's router, and on several hubs every other live hub
// (heartbeat within store.HubStaleAfter), each of which must also have
// read the drain, recorded before waitIdle was called: it is asked to read
// the worker again, and answers once its router follows that read. A hub
// whose heartbeat is older holds nothing up. Its error names what is still
// in flight.
func (c *cluster) waitIdle(ctx context.Context, name string) error {
	var since int64
	if c.on {
		var err error
		if since, err = c.st.AskDrainAnswers(ctx, name); err != nil {
			// Without the database no other hub can be asked; this hub's
			// own requests are still waited for.
			c.log.Warn("cannot ask the other hubs about their requests in flight on a drained worker; waiting for this hub's only", "worker", name, "err", err)
			return c.h.router.WaitIdle(ctx, name)
		}
	}
	if err := c.h.router.WaitIdle(ctx, name); err != nil {
		return err
	}
	if !c.on {
		return nil
	}
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	var holding []store.DrainHolder
	for {
		now, err := c.st.DrainHolders(ctx, c.name, name, since, store.HubStaleAfter)
		if err == nil {
			if len(now) == 0 {
				return nil
			}
			holding = now
		} else if ctx.Err() == nil {
			c.log.Warn("could not read the other hubs' requests in flight on a drained worker; asking again", "worker", name, "err", err)
		}
		select {
		case <-ctx.Done():
			var what []string
			for _, h := range holding {
				if !h.Seen {
					what = append(what, "hub "+h.Hub+" has not said it drained it")
				} else {
					what = append(what, fmt.Sprintf("hub %s has %d in flight", h.Hub, h.InFlight))
				}
			}
			if n := c.h.router.InFlight(name); n > 0 {
				what = append(what, fmt.Sprintf("this hub has %d in flight", n))
			}
			if len(what) == 0 {
				what = append(what, "the other hubs' requests in flight are unknown")
			}
			return fmt.Errorf("waiting for the requests in flight on %s (%s): %w", name, strings.Join(what, ", "), ctx.Err())
		case <-t.C:
		}
	}
}

// listen follows the other hubs' changes: a follower mirrors workers and
// the fleet, waiters hear of their actions, the leader of queued ones.
func (c *cluster) listen(ctx context.Context) {
	var notes <-chan store.Notification
	for notes == nil {
		var err error
		if notes, err = c.st.Listen(ctx, store.ChannelWorkers, store.ChannelFleet, store.ChannelActions, store.ChannelLease, store.ChannelKeys); err != nil {
			c.log.Warn("cannot listen for the other hubs' changes yet; trying again", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(leaseRenewEvery):
			}
		}
	}
	c.reload(ctx)
	signal(c.keysChanged) // changes made before listening began
	for {
		var n store.Notification
		var ok bool
		select {
		case <-ctx.Done():
			return
		case n, ok = <-notes:
			if !ok {
				return
			}
		}
		dirty := false
		// Take every notification already there, then reload once.
		for more := true; more; {
			switch n.Channel {
			case store.ChannelWorkers, store.ChannelFleet:
				dirty = true
			case store.ChannelActions:
				if id, err := strconv.ParseInt(n.Payload, 10, 64); err == nil {
					c.wake(id)
				} else {
					c.wakeAll()
				}
				signal(c.serve)
			case store.ChannelLease:
				signal(c.claim)
			case store.ChannelKeys:
				signal(c.keysChanged)
			}
			if n.Resync {
				dirty = true
				signal(c.keysChanged)
			}
			select {
			case n, more = <-notes:
			default:
				more = false
			}
		}
		if dirty {
			c.reload(ctx)
		}
	}
}

// onLeader runs local, an action that changes the fleet, here when this
// hub leads; on a follower it queues the action for the leader, which runs
// the same code (carryOut) without auditing it again, and waits for its
// result. The caller has authorized and audited it.
func (c *cluster) onLeader(ctx context.Context, u fleet.User, action fleet.ActionName, target string, args any, local func() (string, error)) (string, error) {
	if !c.on || c.stillLeading() {
		return local()
	}
	return c.forward(ctx, u, action, target, args)
}

// forward queues an action for the leader and waits for its result.
func (c *cluster) forward(ctx context.Context, u fleet.User, action fleet.ActionName, target string, args any) (string, error) {
	l, err := c.st.ReadLease(ctx)
	if err != nil {
		return "", fmt.Errorf("%s %s was not done: the database did not answer (%w); nothing was changed", action, target, err)
	}
	if l.Holder == "" || l.ValidFor <= 0 {
		return "", errNoLeader
	}
	data, err := json.Marshal(args)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", action, target, err)
	}
	id, err := c.st.QueueAction(ctx, store.Action{Hub: c.name, User: u.Name, Action: string(action), Target: target, Args: string(data)})
	if err != nil {
		return "", fmt.Errorf("%s %s was not done: %w; nothing was changed", action, target, err)
	}
	woken := make(chan struct{}, 1)
	c.waitMu.Lock()
	c.waiters[id] = woken
	c.waitMu.Unlock()
	defer func() {
		c.waitMu.Lock()
		delete(c.waiters, id)
		c.waitMu.Unlock()
	}()
	t := time.NewTicker(actionPoll)
	defer t.Stop()
	for {
		a, err := c.st.GetAction(context.WithoutCancel(ctx), id)
		switch {
		case err != nil:
			c.log.Warn("could not read the state of an action queued for the leader", "id", id, "err", err)
		case a.State == store.ActionDone:
			return a.Result, nil
		case a.State == store.ActionFailed:
			return "", errors.New(a.Result)
		case a.State == store.ActionPending:
			if l, err := c.st.ReadLease(ctx); err == nil && (l.Holder == "" || l.ValidFor <= 0) {
				if cancelled, err := c.st.CancelAction(context.WithoutCancel(ctx), id, errNoLeader.Error()); err == nil && cancelled {
					return "", errNoLeader
				}
			}
		}
		select {
		case <-woken:
		case <-t.C:
		case <-ctx.Done():
			why := "the caller stopped waiting before the leader took it"
			if cancelled, err := c.st.CancelAction(context.WithoutCancel(ctx), id, why); err == nil && cancelled {
				return "", fmt.Errorf("%s %s was not done: %s", action, target, why)
			}
			return "", fmt.Errorf("%s %s: the leader is carrying it out, but this command stopped waiting (%w); `fleet audit` and `fleet status` show how it ends", action, target, ctx.Err())
		}
	}
}

func (c *cluster) wake(id int64) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	if w, ok := c.waiters[id]; ok {
		signal(w)
	}
}

func (c *cluster) wakeAll() {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	for _, w := range c.waiters {
		signal(w)
	}
}

// serveActions carries out, while this hub leads, the actions followers
// queued: each at once, side by side, as the leader's own users' are.
func (c *cluster) serveActions(ctx context.Context) {
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.serve:
		}
		for c.stillLeading() {
			a, ok, err := c.st.TakeAction(ctx)
			if err != nil {
				if ctx.Err() == nil {
					c.log.Warn("could not take the next queued action", "err", err)
				}
				break
			}
			if !ok {
				break
			}
			c.h.detached.goDetached(ctx, func(ctx context.Context) {
				msg, err := c.carryOut(ctx, a)
				result := msg
				if err != nil {
					result = err.Error()
				}
				if ferr := c.st.FinishAction(context.WithoutCancel(ctx), a.ID, err != nil, result); ferr != nil {
					c.log.Error("could not record how a queued action ended; its caller is told to look", "id", a.ID, "action", a.Action, "err", ferr)
				}
			})
		}
	}
}

// applyArgs are a forwarded apply's.
type applyArgs struct {
	File string `json:"file"`
	Data []byte `json:"data"`
}

// carryOut does on the leader an action a follower authorized and audited:
// the code the leader runs for its own users, without a second audit line.
func (c *cluster) carryOut(ctx context.Context, a store.Action) (string, error) {
	h := c.h
	name := a.Target
	switch fleet.ActionName(a.Action) {
	case fleet.ActionDrain, fleet.ActionUndrain, fleet.ActionRestart:
		op, _ := h.workerOp(fleet.ActionName(a.Action))
		return op(ctx, name)
	case fleet.ActionStop:
		if err := h.mgr.Hold(ctx, name); err != nil {
			return "", fmt.Errorf("stopping %s: %w", name, err)
		}
		return h.stopWorker(ctx, name)
	case fleet.ActionStart:
		return h.startWorker(ctx, name)
	case fleet.ActionForceAdmit:
		return "", forceAdmit(ctx, h.mgr, name)
	case fleet.ActionNodeTrust:
		return clearHostKey(ctx, h.store, h.mgr, name)
	case fleet.ActionShapePin:
		return h.judge.Pin(ctx, name)
	case fleet.ActionApply:
		var args applyArgs
		if err := json.Unmarshal([]byte(a.Args), &args); err != nil {
			return "", fmt.Errorf("apply queued by hub %s: its arguments are not readable (%w); nothing was changed: apply again", a.Hub, err)
		}
		return h.apply(ctx, args.File, args.Data, false)
	}
	return "", fmt.Errorf("hub %s queued %q, which this leader does not carry out (an older fleet?); nothing was done: run it on the leader", a.Hub, a.Action)
}

// hubsStatus is status's view of the hubs: this one, its role, the
// leader, and every hub's heartbeat.
func (c *cluster) hubsStatus(ctx context.Context, st *fleet.HubStatus) {
	role, leader := c.role()
	st.Hub, st.HubRole, st.Leader = c.name, role, leader
	if !c.on {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	hubs, err := c.st.Hubs(ctx)
	if err != nil {
		st.HubsError = fmt.Sprintf("unknown, the database did not answer (%v); this hub's role is as it last knew it", err)
		return
	}
	for _, o := range hubs {
		r := RoleFollower
		switch {
		case o.HeartbeatAge >= store.HubStaleAfter:
			// Killed, frozen or cut off: its lease (if it held it) has
			// lapsed too, and its name may be taken.
			r = RoleGone
		case o.Name == leader:
			r = RoleLeader
		}
		st.Hubs = append(st.Hubs, fleet.HubView{Name: o.Name, Role: r, HeartbeatAgeSeconds: o.HeartbeatAge.Seconds(),
			Router: o.HTTPAddr, Console: o.SSHAddr, Version: o.Version})
	}
}

// health is /healthz's answer: 200 on a hub that can route (it knows a
// ready worker, or the database answers), with its role; 503 otherwise.
func (c *cluster) health() (int, []byte) {
	role, leader := c.role()
	code, status := 200, "ok"
	c.mu.Lock()
	nameTaken := c.nameTaken
	c.mu.Unlock()
	switch {
	case nameTaken:
		code, status = 503, "another hub runs with this hub's name (--hub-name "+c.name+"), taken while this one missed its heartbeats: stop one of them"
	case c.on && !c.dbAnswers() && !c.h.state.anyReady():
		code, status = 503, "cannot route: no ready worker known and the database does not answer"
	}
	body, _ := json.Marshal(map[string]string{"status": status, "hub": c.name, "role": role, "leader": leader})
	return code, body
}

// setMirror makes the hub's mirror the fleet and workers read from the
// database, and hands the router the ready set: a follower's view of what
// the leader does, and a new leader's before its manager reports.
func (c *cluster) setMirror(f fleet.Fleet, known []fleet.Worker) {
	h := c.h
	h.state.mu.Lock()
	h.state.models, h.state.placements = f.Models, f.Placements
	nodes := make(map[string]fleet.Node, len(f.Nodes))
	for _, n := range f.Nodes {
		// What this hub's own link to the node says (its manager probes
		// every node, leading or not) stands over the database's word.
		if old, ok := h.state.nodes[n.Name]; ok && old.Address == n.Address {
			n.Platform, n.ProbedAt, n.State, n.Reason = old.Platform, old.ProbedAt, old.State, old.Reason
		}
		nodes[n.Name] = n
	}
	h.state.nodes = nodes
	workers := make(map[string]fleet.Worker, len(known))
	for _, w := range known {
		workers[w.Name()] = w
	}
	h.state.workers = workers
	h.state.mu.Unlock()
	if err := h.router.SetModels(f.Models); err != nil {
		c.log.Error("the router refused the models read from the database; it keeps the previous ones", "err", err)
	}
	h.syncRouter()
}

// startApplyError words the refusal of a start-up fleet file (or the demo)
// that a follower may not apply.
func (c *cluster) startApplyError(what string, err error) error {
	if !errors.Is(err, store.ErrNotLeader) {
		return err
	}
	_, leader := c.role()
	if leader == "" {
		leader = "another hub"
	}
	return fmt.Errorf("%s differs from the fleet in the database, and this hub does not lead (%s does), so it cannot apply it at start; nothing was changed: "+
		"start this hub without %s and run `fleet apply` (the leader carries it out), or stop the other hubs first: %w", what, leader, what, err)
}

// refuseLiveHubs refuses a change made without a hub (a first key, a
// fleet-id move) while a hub runs on the database: it goes through a hub.
func refuseLiveHubs(ctx context.Context, st *store.Store) error {
	if !st.Clustered() {
		return nil // the data dir's lock already keeps one process on SQLite
	}
	hubs, err := st.Hubs(ctx)
	if err != nil {
		return err
	}
	for _, o := range hubs {
		if o.HeartbeatAge < store.HubStaleAfter {
			return fmt.Errorf("%w: hub %s (router %s) heartbeated %s ago on %s; nothing was changed: do it through a running hub (fleet over ssh, or its control socket), or stop every hub first",
				store.ErrOtherHub, o.Name, o.HTTPAddr, o.HeartbeatAge.Round(time.Millisecond), st.Path())
		}
	}
	return nil
}

// signal wakes whoever waits on c, once, without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// announceWhileServing announces the console by mDNS (announce) while this
// hub can serve (its health is 200) and withdraws it while it cannot, so
// that a name shared by several hubs leads to one that answers.
func (c *cluster) announceWhileServing(ctx context.Context, announce func() (stop func())) {
	var stop func()
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	for {
		code, _ := c.health()
		switch {
		case code == 200 && stop == nil:
			stop = announce()
		case code != 200 && stop != nil:
			c.log.Warn("this hub cannot route: its console is no longer announced by mDNS")
			stop()
			stop = nil
		}
		select {
		case <-ctx.Done():
			if stop != nil {
				stop()
			}
			return
		case <-t.C:
		}
	}
}

// machineBound names the nodes whose engines run on the leading hub's own
// machine: local and simulated nodes. Their engines listen on that
// machine's loopback, so a hub on another machine can neither route to
// them nor, leading after a failover, adopt them by PID.
func machineBound(f fleet.Fleet) []string {
	var names []string
	for _, n := range f.Nodes {
		if _, sim := n.SimProfile(); sim || n.Address == fleet.AddressLocal {
			names = append(names, n.Name)
		}
	}
	return names
}

// otherDataDirs is the data dirs of the fleet's other hubs on this
// machine, as the hubs table has them: a killed hub's row stays. A former
// leader's launch on a local or sim node left its pid file under its own
// data dir, where the node manager looks for it before launching again.
func (c *cluster) otherDataDirs(ctx context.Context) ([]string, error) {
	if !c.on {
		return nil, nil
	}
	hubs, err := c.st.Hubs(ctx)
	if err != nil {
		return nil, err
	}
	self, own, _ := strings.Cut(c.home, ":")
	var dirs []string
	for _, h := range hubs {
		host, dir, ok := strings.Cut(h.Home, ":")
		if ok && host == self && dir != own && dir != "" && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	return dirs, nil
}

// checkMachines refuses fleet f while it has machine-bound nodes and the
// live hubs (this one included) run on more than one machine. Machines are
// told apart by host name, as a hub's home records it: hubs on one host in
// separate network namespaces are not caught.
func (c *cluster) checkMachines(ctx context.Context, f fleet.Fleet) error {
	bound := machineBound(f)
	if !c.on || len(bound) == 0 {
		return nil
	}
	hubs, err := c.st.Hubs(ctx)
	if err != nil {
		return err
	}
	self, _, _ := strings.Cut(c.home, ":")
	machines := []string{self}
	where := map[string]string{self: c.name}
	for _, h := range hubs {
		host, _, _ := strings.Cut(h.Home, ":")
		if h.HeartbeatAge >= store.HubStaleAfter || slices.Contains(machines, host) {
			continue
		}
		machines = append(machines, host)
		where[host] = h.Name
	}
	if len(machines) < 2 {
		return nil
	}
	var on []string
	for _, m := range machines {
		on = append(on, where[m]+" on "+m)
	}
	which := "node " + bound[0] + " runs its engines"
	if len(bound) > 1 {
		which = "nodes " + strings.Join(bound, ", ") + " run their engines"
	}
	return fmt.Errorf("%s on the leading hub's own machine (address %q or %q…), but this fleet's hubs run on %d machines (%s): "+
		"a hub on another machine can neither reach those engines nor adopt them when it leads; "+
		"give each such node an SSH address (user@host) in the fleet file and apply it, or run every hub on one machine",
		which, fleet.AddressLocal, fleet.AddressSimPrefix, len(machines), strings.Join(on, ", "))
}
