package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The channels on which a write tells the other hubs on one PostgreSQL
// database what changed (Listen). Each write notifies in its own
// transaction, so a hub that hears one reads the committed change.
const (
	// ChannelWorkers: a worker's row changed; the payload is its name
	// (NODE/MODEL).
	ChannelWorkers = "fleet_workers"
	// ChannelFleet: an apply changed the nodes, models or placements, or a
	// node's state, drain or host key changed (payload: the node, or "").
	ChannelFleet = "fleet_fleet"
	// ChannelKeys: an API key was created, revoked or its limits changed;
	// the payload is the key's name.
	ChannelKeys = "fleet_keys"
	// ChannelActions: an action was queued or finished; the payload is its
	// ID.
	ChannelActions = "fleet_actions"
	// ChannelLease: the leader's lease changed hands; the payload is the
	// new holder.
	ChannelLease = "fleet_lease"
)

// ErrNotLeader is wrapped when the database refused a write about workers,
// launches or pending stops because the writer's epoch (SetEpoch) does not
// hold the leader's lease.
var ErrNotLeader = errors.New("this hub does not hold the leader's lease")

// ErrHubNameTaken is wrapped when a live hub already has the name another
// hub registers or heartbeats with.
var ErrHubNameTaken = errors.New("another running hub has this name")

// HubStaleAfter is how long after its last heartbeat a hub's name may be
// taken by another instance: a hub killed by kill -9 frees its name then.
const HubStaleAfter = 10 * time.Second

// finishedActionsKept is how long a finished action's row stays, for a
// follower whose caller reads its result late.
const finishedActionsKept = 24 * time.Hour

// change is what a write does besides its statement: hold the fleet-state
// lock, fence it by the lease's epoch, notify the other hubs.
type change struct {
	state            stateLock
	fenced           bool
	channel, payload string
}

// stateLock is how a write holds lockFleetState.
type stateLock int

const (
	stateNone stateLock = iota
	// stateShared: a write of workers or pending stops, which an apply
	// must not interleave with; such writes run side by side.
	stateShared
	// stateExclusive: an apply, alone.
	stateExclusive
)

// SetEpoch is the lease epoch this hub writes with (ClaimLease's): every
// write about workers, launches and pending stops then carries it, and on
// PostgreSQL the database refuses it unless that epoch holds the lease and
// has not expired. 0, a follower's, is refused always. SQLite, one hub that
// always leads, has no fence.
func (s *Store) SetEpoch(epoch int64) { s.epoch.Store(epoch) }

// Epoch is the epoch SetEpoch set.
func (s *Store) Epoch() int64 { return s.epoch.Load() }

// Clustered says whether several hubs may share this database (PostgreSQL):
// then only the lease's holder may write about workers.
func (s *Store) Clustered() bool { return s.db.d.fence != "" }

// inChangeTx runs fn in a transaction locked, fenced and notifying as c
// says. The state lock comes before the fence's share lock on the lease
// row, so a write waiting for an apply holds nothing a lease renewal (or
// the apply) waits on.
func (s *Store) inChangeTx(ctx context.Context, c change, fn func(tx *txn) error) error {
	return s.inTx(ctx, func(tx *txn) error {
		if c.state != stateNone {
			if err := tx.lock(ctx, lockFleetState, c.state == stateShared); err != nil {
				return err
			}
		}
		if c.fenced {
			if err := s.fence(ctx, tx); err != nil {
				return err
			}
		}
		if err := fn(tx); err != nil {
			return err
		}
		if c.channel != "" {
			return tx.notify(ctx, c.channel, c.payload)
		}
		return nil
	})
}

// fence asks the database whether this hub's epoch holds the lease, and
// keeps the lease from changing hands until tx ends.
func (s *Store) fence(ctx context.Context, tx *txn) error {
	if s.db.d.fence == "" {
		return nil
	}
	if _, err := tx.ExecContext(ctx, s.db.d.fence, s.epoch.Load()); err != nil {
		if s.db.d.notLeader(err) {
			return notLeaderError(err)
		}
		return fmt.Errorf("check this hub's lease: %w", err)
	}
	return nil
}

// notLeaderError words the database's refusal for an operator.
func notLeaderError(err error) error {
	why := err.Error()
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		why = pe.Message
	}
	return fmt.Errorf("%w (%s), so nothing was written: only the leader changes workers; `fleet status` names the leader", ErrNotLeader, why)
}

// notify announces a change on channel when tx commits (PostgreSQL; SQLite
// has one hub, nobody to tell).
func (tx *txn) notify(ctx context.Context, channel, payload string) error {
	if tx.d.notify == "" {
		return nil
	}
	if _, err := tx.ExecContext(ctx, tx.d.notify, channel, payload); err != nil {
		return fmt.Errorf("notify the other hubs on %s: %w", channel, err)
	}
	return nil
}

// changeOne is execOne for a write that is fenced or notifies.
func (s *Store) changeOne(ctx context.Context, c change, doing, missing, hint, query string, args ...any) error {
	err := s.inChangeTx(ctx, c, func(tx *txn) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%s: %w%s", missing, ErrNotFound, hint)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	return nil
}

// HubInfo is one hub of the fleet as the hubs table holds it. Times are the
// database's clock.
type HubInfo struct {
	Name string
	// Instance tells two processes with one name apart: a new one per
	// start of a hub.
	Instance    string
	StartedAt   time.Time
	HeartbeatAt time.Time
	// HeartbeatAge is how long before the read the hub last heartbeated,
	// by the database's clock (hubs' clocks may disagree).
	HeartbeatAge time.Duration
	// HTTPAddr and SSHAddr are where the hub serves the router and the
	// console; Version is its fleet version.
	HTTPAddr, SSHAddr, Version string
	// Home is where the hub keeps its data dir, HOST:PATH. A hub holds its
	// data dir's lock while it runs, so a hub that holds it now may take
	// over a name registered with the same Home: that instance is dead
	// (kill -9 and a restart need not wait HubStaleAfter).
	Home string
}

// RegisterHub records h as a running hub of the fleet, named h.Name. It
// refuses (ErrHubNameTaken) a name whose row another instance heartbeated
// within HubStaleAfter from another Home: two live hubs with one name would
// be one in every list. The caller holds h.Home's data dir lock. On SQLite,
// where that lock already keeps one hub, the name is always taken over.
func (s *Store) RegisterHub(ctx context.Context, h HubInfo) error {
	if h.Name == "" || h.Instance == "" {
		return errors.New("register hub: no hub name or instance given; give the hub a name with --hub-name")
	}
	stale := int64(HubStaleAfter)
	if !s.Clustered() {
		stale = 0
	}
	now := s.db.d.nowNanos
	res, err := s.db.ExecContext(ctx, `INSERT INTO hubs (name, instance, started_at, heartbeat_at, http_addr, ssh_addr, version, home)
		VALUES (?, ?, `+now+`, `+now+`, ?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, started_at = excluded.started_at,
			heartbeat_at = excluded.heartbeat_at, http_addr = excluded.http_addr, ssh_addr = excluded.ssh_addr,
			version = excluded.version, home = excluded.home
		WHERE hubs.instance = excluded.instance OR (hubs.home = excluded.home AND hubs.home <> '')
			OR hubs.heartbeat_at <= excluded.heartbeat_at - ?`,
		h.Name, h.Instance, h.HTTPAddr, h.SSHAddr, h.Version, h.Home, stale)
	if err != nil {
		return fmt.Errorf("register hub %s in %s: %w", h.Name, s.path, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("register hub %s in %s: %w", h.Name, s.path, err)
	} else if n == 1 {
		// What an earlier instance of this name published is not this one's.
		if _, err := s.db.ExecContext(ctx, `DELETE FROM drain_inflight WHERE hub = ?`, h.Name); err != nil {
			return fmt.Errorf("register hub %s in %s: %w", h.Name, s.path, err)
		}
		return nil
	}
	hubs, err := s.Hubs(ctx)
	if err != nil {
		return fmt.Errorf("register hub %s: %w", h.Name, err)
	}
	for _, o := range hubs {
		if o.Name == h.Name {
			return fmt.Errorf("register hub %s: %w: it heartbeated %s ago from %s, router %s (started %s); nothing was started: give this hub another --hub-name, or stop that one (a hub that died frees its name %s after its last heartbeat)",
				h.Name, ErrHubNameTaken, o.HeartbeatAge.Round(time.Millisecond), o.Home, o.HTTPAddr, o.StartedAt.Format(time.RFC3339), HubStaleAfter)
		}
	}
	return fmt.Errorf("register hub %s: %w (it left while this one registered); try again", h.Name, ErrHubNameTaken)
}

// HubHeartbeat tells the other hubs that hub name, this instance, lives.
// It fails with ErrHubNameTaken when another instance took the name (this
// one was thought dead). One UPDATE of the hub's own row, which only a
// RegisterHub of its name writes too: it waits on no other hub.
func (s *Store) HubHeartbeat(ctx context.Context, name, instance string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE hubs SET heartbeat_at = `+s.db.d.nowNanos+` WHERE name = ? AND instance = ?`, name, instance)
	if err != nil {
		return fmt.Errorf("heartbeat of hub %s in %s: %w", name, s.path, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("heartbeat of hub %s in %s: %w", name, s.path, err)
	} else if n == 0 {
		return fmt.Errorf("heartbeat of hub %s: %w: another instance registered the name after this one missed its heartbeats; stop one of them", name, ErrHubNameTaken)
	}
	return nil
}

// UnregisterHub removes this instance's row when the hub stops cleanly.
func (s *Store) UnregisterHub(ctx context.Context, name, instance string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM hubs WHERE name = ? AND instance = ?`, name, instance)
	if err != nil {
		return fmt.Errorf("unregister hub %s from %s: %w", name, s.path, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM drain_inflight WHERE hub = ?`, name); err != nil {
			return fmt.Errorf("unregister hub %s from %s: %w", name, s.path, err)
		}
	}
	return nil
}

// Hubs lists the hubs that registered, by name, with their heartbeats'
// ages.
func (s *Store) Hubs(ctx context.Context) ([]HubInfo, error) {
	return queryAll(ctx, s.db, "read the hubs from "+s.path, func(r rowScanner) (HubInfo, error) {
		var (
			h                HubInfo
			started, beat, a int64
		)
		err := r.Scan(&h.Name, &h.Instance, &started, &beat, &a, &h.HTTPAddr, &h.SSHAddr, &h.Version, &h.Home)
		h.StartedAt, h.HeartbeatAt, h.HeartbeatAge = fromUnixNano(started), fromUnixNano(beat), time.Duration(a)
		return h, err
	}, `SELECT name, instance, started_at, heartbeat_at, `+s.db.d.nowNanos+` - heartbeat_at, http_addr, ssh_addr, version, home FROM hubs ORDER BY name`)
}

// Lease is the leader's lease as ClaimLease or ReadLease found it.
type Lease struct {
	// Holder is the hub holding it ("" when none ever did).
	Holder string
	// Epoch grows by one each time the lease is taken.
	Epoch int64
	// Leader: the caller of ClaimLease holds it now.
	Leader bool
	// ValidFor is how long it stays valid by the database's clock; 0 or
	// less when it expired.
	ValidFor time.Duration
}

// ClaimLease renews the leader's lease for ttl when holder holds it, takes
// it (epoch + 1) when it expired or was never held, and else reports who
// holds it. Expiry is by the database's clock, so hubs whose clocks
// disagree still agree on it. A holder whose own lease expired takes it
// again with a new epoch: another hub may have led in between as far as
// it knows. It takes no named lock: renewing must not wait for a long
// apply (it waits only for fenced writes in flight, whose share lock on the
// lease row keeps it from changing hands under them).
func (s *Store) ClaimLease(ctx context.Context, holder string, ttl time.Duration) (Lease, error) {
	if holder == "" {
		return Lease{}, errors.New("claim the leader's lease: no hub name given")
	}
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("claim the leader's lease: the lease time %s is not positive; give --lease-ttl a positive duration", ttl)
	}
	now := `(SELECT ` + s.db.d.nowNanos + ` AS t) AS n`
	var l Lease
	err := s.inTx(ctx, func(tx *txn) error {
		renew := func() (bool, error) {
			err := tx.QueryRowContext(ctx, `UPDATE lease SET expires_at = n.t + ? FROM `+now+`
				WHERE id = 1 AND holder = ? AND expires_at > n.t RETURNING epoch`, int64(ttl), holder).Scan(&l.Epoch)
			if errors.Is(err, sql.ErrNoRows) {
				return false, nil
			}
			l = Lease{Holder: holder, Epoch: l.Epoch, Leader: true, ValidFor: ttl}
			return err == nil, err
		}
		if ok, err := renew(); ok || err != nil {
			return err
		}
		err := tx.QueryRowContext(ctx, `UPDATE lease SET holder = ?, epoch = epoch + 1, expires_at = n.t + ? FROM `+now+`
			WHERE id = 1 AND expires_at <= n.t RETURNING epoch`, holder, int64(ttl)).Scan(&l.Epoch)
		if err == nil {
			l = Lease{Holder: holder, Epoch: l.Epoch, Leader: true, ValidFor: ttl}
			return tx.notify(ctx, ChannelLease, holder)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// Taken meanwhile, by this holder's other call maybe (a claim and a
		// release-and-claim of one hub at once).
		if ok, err := renew(); ok || err != nil {
			return err
		}
		l, err = readLease(ctx, tx, s.db.d)
		return err
	})
	if err != nil {
		return Lease{}, fmt.Errorf("claim the leader's lease in %s: %w", s.path, err)
	}
	return l, nil
}

// ReleaseLease gives up holder's lease of epoch at once, so another hub may
// take it without waiting for it to expire (a hub that stops cleanly).
func (s *Store) ReleaseLease(ctx context.Context, holder string, epoch int64) error {
	err := s.inTx(ctx, func(tx *txn) error {
		res, err := tx.ExecContext(ctx, `UPDATE lease SET expires_at = 0 WHERE id = 1 AND holder = ? AND epoch = ?`, holder, epoch)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil
		}
		return tx.notify(ctx, ChannelLease, "")
	})
	if err != nil {
		return fmt.Errorf("release the leader's lease in %s: %w", s.path, err)
	}
	return nil
}

// ReadLease reports the lease as it stands (Leader is false).
func (s *Store) ReadLease(ctx context.Context) (Lease, error) {
	l, err := readLease(ctx, s.db, s.db.d)
	if err != nil {
		return Lease{}, fmt.Errorf("read the leader's lease from %s: %w", s.path, err)
	}
	return l, nil
}

func readLease(ctx context.Context, q queryer, d *dialect) (Lease, error) {
	var (
		l    Lease
		left int64
	)
	if err := q.QueryRowContext(ctx, `SELECT holder, epoch, expires_at - `+d.nowNanos+` FROM lease WHERE id = 1`).Scan(&l.Holder, &l.Epoch, &left); err != nil {
		return Lease{}, err
	}
	l.ValidFor = time.Duration(left)
	return l, nil
}

// ActionState is where an action asked on a follower stands.
type ActionState string

// An action is pending until the leader takes it, running while it
// carries it out, then done or failed with its result.
const (
	ActionPending ActionState = "pending"
	ActionRunning ActionState = "running"
	ActionDone    ActionState = "done"
	ActionFailed  ActionState = "failed"
)

// Action is an operator's action asked on a follower (where it was
// authorized and audited) for the leader to carry out.
type Action struct {
	ID int64
	// Hub is the follower that queued it; User the operator who asked.
	Hub, User string
	// Action and Target name what to do and to what (as the audit does);
	// Args is its arguments as JSON, whose shape the hub owns.
	Action, Target, Args string
	State                ActionState
	// Result is the leader's answer: its message when done, the error
	// when failed.
	Result string
	// Epoch is the lease epoch of the leader that took it.
	Epoch       int64
	RequestedAt time.Time
	DoneAt      time.Time
}

const actionColumns = `id, hub, user_name, action, target, args, state, result, epoch, requested_at, done_at`

func scanAction(r rowScanner) (Action, error) {
	var (
		a         Action
		state     string
		req, done int64
	)
	err := r.Scan(&a.ID, &a.Hub, &a.User, &a.Action, &a.Target, &a.Args, &state, &a.Result, &a.Epoch, &req, &done)
	a.State, a.RequestedAt, a.DoneAt = ActionState(state), fromUnixNano(req), fromUnixNano(done)
	return a, err
}

// QueueAction queues a for the leader and returns its ID; finished actions
// older than a day are forgotten meanwhile.
func (s *Store) QueueAction(ctx context.Context, a Action) (int64, error) {
	if a.Args == "" {
		a.Args = "{}"
	}
	var id int64
	// No named lock: hubs that queue at once delete the same finished rows
	// (the second waits for the first's row locks, then skips what is
	// gone) and insert rows of their own.
	err := s.inTx(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM actions WHERE state IN ('done', 'failed') AND done_at < `+s.db.d.nowNanos+` - ?`, int64(finishedActionsKept)); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `INSERT INTO actions (hub, user_name, action, target, args, state, requested_at)
			VALUES (?, ?, ?, ?, ?, 'pending', `+s.db.d.nowNanos+`) RETURNING id`, a.Hub, a.User, a.Action, a.Target, a.Args).Scan(&id); err != nil {
			return err
		}
		return tx.notify(ctx, ChannelActions, fmt.Sprint(id))
	})
	if err != nil {
		return 0, fmt.Errorf("queue %s %s for the leader in %s: %w", a.Action, a.Target, s.path, err)
	}
	return id, nil
}

// TakeAction marks the oldest pending action running under this hub's
// epoch and returns it; ok is false when none is pending. Fenced: only the
// leader takes actions.
func (s *Store) TakeAction(ctx context.Context) (a Action, ok bool, err error) {
	err = s.inChangeTx(ctx, change{fenced: true}, func(tx *txn) error {
		var err error
		// Two takers at once (a leader's two calls, or a new leader's
		// while the old one's is in flight) must not both take one action:
		// the subquery skips an action another taker has locked (on
		// PostgreSQL; SQLite's takers queue on the file), and the outer
		// state test, which READ COMMITTED evaluates again on the row as
		// last committed, refuses one a canceller changed meanwhile.
		a, err = scanAction(tx.QueryRowContext(ctx, `UPDATE actions SET state = 'running', epoch = ?
			WHERE state = 'pending' AND id = (SELECT id FROM actions WHERE state = 'pending' ORDER BY id LIMIT 1`+s.db.d.skipLocked+`)
			RETURNING `+actionColumns, s.epoch.Load()))
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		ok = err == nil
		return err
	})
	if err != nil {
		return Action{}, false, fmt.Errorf("take the next queued action from %s: %w", s.path, err)
	}
	return a, ok, nil
}

// FinishAction records how action id ended (failed with err's text when
// failed) and tells the hub that queued it. Not fenced: a leader that lost
// its lease while carrying the action out still says what it did.
func (s *Store) FinishAction(ctx context.Context, id int64, failed bool, result string) error {
	state := ActionDone
	if failed {
		state = ActionFailed
	}
	err := s.changeOne(ctx, change{channel: ChannelActions, payload: fmt.Sprint(id)}, fmt.Sprintf("record how action %d ended", id),
		fmt.Sprintf("action %d", id), "", `UPDATE actions SET state = ?, result = ?, done_at = `+s.db.d.nowNanos+` WHERE id = ?`, string(state), result, id)
	return err
}

// CancelAction fails action id with why if the leader has not taken it yet
// (a caller that stopped waiting); it says whether it did.
func (s *Store) CancelAction(ctx context.Context, id int64, why string) (bool, error) {
	var n int64
	err := s.inChangeTx(ctx, change{channel: ChannelActions, payload: fmt.Sprint(id)}, func(tx *txn) error {
		res, err := tx.ExecContext(ctx, `UPDATE actions SET state = 'failed', result = ?, done_at = `+s.db.d.nowNanos+`
			WHERE id = ? AND state = 'pending'`, why, id)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("cancel action %d in %s: %w", id, s.path, err)
	}
	return n == 1, nil
}

// FailOrphanedActions fails every action a former leader took and never
// finished (it died or lost its lease mid-way): whether it was carried out
// is unknown, and the operator is told to look. The result names the
// action and its target: one command (`stop all`) may wait for several.
// Fenced: the new leader calls it once it leads.
func (s *Store) FailOrphanedActions(ctx context.Context) (int64, error) {
	var n int64
	err := s.inChangeTx(ctx, change{fenced: true, channel: ChannelActions}, func(tx *txn) error {
		res, err := tx.ExecContext(ctx, `UPDATE actions SET state = 'failed', done_at = `+s.db.d.nowNanos+`,
			result = action || ' ' || target || ': the leader carrying it out stopped before it said how it ended; look at the fleet (fleet status) and ask again if it is not done'
			WHERE state = 'running' AND epoch <> ?`, s.epoch.Load())
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("fail the actions a former leader left unfinished in %s: %w", s.path, err)
	}
	return n, nil
}

// GetAction reads action id.
func (s *Store) GetAction(ctx context.Context, id int64) (Action, error) {
	a, err := scanAction(s.db.QueryRowContext(ctx, `SELECT `+actionColumns+` FROM actions WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Action{}, fmt.Errorf("read action %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Action{}, fmt.Errorf("read action %d from %s: %w", id, s.path, err)
	}
	return a, nil
}

// quoteChannel quotes a channel name for LISTEN (an identifier).
func quoteChannel(ch string) string {
	return `"` + strings.ReplaceAll(ch, `"`, `""`) + `"`
}
