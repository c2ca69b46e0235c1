package hub

// API keys across hubs: the router checks keys against a cache of the
// live keys' hashes (keyCache), and hubs that share a PostgreSQL database
// hold each key's limits together by publishing what they admitted and
// reading what the others did (keySync).

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/store"
)

// keyCache answers the router's key checks from memory: the live keys'
// hashes, read at start and again whenever a key is created or revoked
// (on this hub, or on another one sharing its database, which notifies).
// A failed read keeps the keys known: a hub whose database is unreachable
// goes on checking keys as they were.
type keyCache struct {
	store *store.Store
	mu    sync.RWMutex
	// byHash names each live key by its SHA-256. Looking a hash up in a
	// map takes a time that depends on the hash, which tells nothing of
	// the key: a guess's hash is as far from a real one's as any.
	byHash map[[32]byte]string
}

// VerifyAPIKey is router.KeyVerifier, from memory; it never fails.
func (c *keyCache) VerifyAPIKey(_ context.Context, key string) (string, bool, error) {
	if !strings.HasPrefix(key, store.APIKeyPrefix) {
		return "", false, nil
	}
	h := store.HashAPIKey(key)
	c.mu.RLock()
	defer c.mu.RUnlock()
	name, ok := c.byHash[h]
	return name, ok, nil
}

// count is how many live keys the cache holds; ok is false before it
// was first loaded (a hub that does not check keys never loads it).
func (c *keyCache) count() (n int, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.byHash), c.byHash != nil
}

// reload reads the live keys again; on an error the keys known stay.
func (c *keyCache) reload(ctx context.Context) error {
	keys, err := c.store.LiveAPIKeyHashes(ctx)
	if err != nil {
		return err
	}
	byHash := make(map[[32]byte]string, len(keys))
	for _, k := range keys {
		byHash[k.Hash] = k.Name
	}
	c.mu.Lock()
	c.byHash = byHash
	c.mu.Unlock()
	return nil
}

// keyReloadInterval is how often a hub on PostgreSQL rereads the keys,
// their limits and each key's tokens of the day (the usage table, which
// every hub writes), besides when a key changes: what a notification
// missed, and tokens the other hubs spent past the counts they publish.
const keyReloadInterval = time.Minute

// watchKeys reloads the keys whenever one is created, revoked or has its
// limits changed on any hub (changed: the cluster's listener heard
// fleet_keys, or listening began again and changes may have been missed),
// and every interval. A failed reload keeps the keys as they were.
func (lg *Ledger) watchKeys(ctx context.Context, changed <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
		err := lg.reloadKeys(ctx)
		if err != nil && ctx.Err() == nil {
			lg.log.Warn("could not read the API keys again; checking them as they were", "err", err)
		}
		if lg.keysReloaded != nil {
			lg.keysReloaded(err)
		}
	}
}

// keySyncInterval paces publishing this hub's counts of each key and
// reading the other hubs': a quarter of a second, so a hub's counts miss
// at most about half a second of the others' (keylimit.Leash).
const keySyncInterval = 250 * time.Millisecond

// keyCountsWindow is how far back a hub reads the others' counts and
// keeps its own unpublished ones: a request older than a minute no longer
// counts against requests a minute, and the day's tokens reach every hub
// through the usage table as well (keyReloadInterval). It also absorbs a
// skew of up to a minute between the hubs' clocks.
const keyCountsWindow = 2 * time.Minute

// keyCountsKept is how long key_counts rows stay in the database.
const keyCountsKept = 10 * time.Minute

// keyAloneAfter is how long syncs may fail before a hub holds each key's
// limits on its own (no leash): with the database unreachable it cannot
// see the others, and refusing a key's requests for that would stop
// serving it; the others are in the same state, so the fleet may then
// admit up to N times a limit (docs/limits.md).
const keyAloneAfter = time.Second

// keySync publishes this hub's counts of each key (its book's Take) to the
// database and counts the other hubs' into its book (Others). Only hubs on
// PostgreSQL run it: on SQLite a hub is alone.
type keySync struct {
	store *store.Store
	book  keyBook
	hub   string
	log   *slog.Logger

	// mine is this hub's total of each minute and key; dirty are the
	// entries not yet written. taken is what the book handed over and the
	// others have not been shown yet (the book's leash holds it).
	mine  map[minuteKey]fleet.KeyCounts
	dirty map[minuteKey]bool
	taken map[string]fleet.KeyCounts
	// seen is the other hubs' totals as last read; read says it was
	// read once (what the first read finds predates this hub's tokens
	// seed, see sync).
	seen map[hubMinuteKey]fleet.KeyCounts
	read bool
	// failing is when syncs began failing (zero: the last one worked);
	// alone says the book was told it is alone.
	failing time.Time
	alone   bool
	// dropped counts unwritten counts given up (older than the window).
	dropped int
	pruned  time.Time
	// skew is the database's clock less this hub's, as last read: the
	// minutes are the database's, as the lease's expiry is, so that a hub
	// whose clock is off counts in the same minutes as the others.
	skew time.Duration
}

type minuteKey struct {
	minute int64
	key    string
}

type hubMinuteKey struct {
	hub string
	minuteKey
}

// keyBook is the router's book of key limits (keylimit.Book), as a hub
// shares it with the others.
type keyBook interface {
	Take() map[string]fleet.KeyCounts
	Published(counts map[string]fleet.KeyCounts)
	Others(counts map[string]fleet.KeyCounts, peers int, at time.Time)
}

func newKeySync(st *store.Store, book keyBook, hub string, log *slog.Logger) *keySync {
	return &keySync{store: st, book: book, hub: hub, log: log,
		mine: map[minuteKey]fleet.KeyCounts{}, dirty: map[minuteKey]bool{}, taken: map[string]fleet.KeyCounts{},
		seen: map[hubMinuteKey]fleet.KeyCounts{}}
}

// run syncs every interval until ctx ends.
func (ks *keySync) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A database that does not answer (a partition drops the packets)
		// must not hold a sync, and with it the leash, for long.
		sctx, cancel := context.WithTimeout(ctx, keyAloneAfter)
		err := ks.sync(sctx, time.Now())
		cancel()
		if err != nil && ctx.Err() == nil {
			ks.log.Debug("key counts not synced with the other hubs", "err", err)
		}
	}
}

// sync publishes what the book admitted and spent since the last sync and
// counts what the other hubs did since, as of now by this hub's clock. The
// minutes counted in are the database's: with its clock unread (it does
// not answer), this hub's corrected by the skew last seen.
func (ks *keySync) sync(ctx context.Context, local time.Time) error {
	if db, err := ks.store.Now(ctx); err == nil {
		ks.skew = time.Unix(0, db).Sub(local)
	}
	now := local.Add(ks.skew)
	minute := now.Truncate(time.Minute).Unix()
	for key, c := range ks.book.Take() {
		mk := minuteKey{minute, key}
		ks.mine[mk] = addCounts(ks.mine[mk], c)
		ks.dirty[mk] = true
		ks.taken[key] = addCounts(ks.taken[key], c)
	}
	// The mark that this hub is here, so that the others leash
	// themselves before it has traffic of their keys.
	ks.dirty[minuteKey{minute, ""}] = true
	oldest := now.Add(-keyCountsWindow).Truncate(time.Minute).Unix()
	rows := make([]store.KeyCount, 0, len(ks.dirty))
	for mk := range ks.dirty {
		if mk.minute < oldest {
			delete(ks.dirty, mk)
			ks.dropped++
			continue
		}
		c := ks.mine[mk]
		rows = append(rows, store.KeyCount{Minute: time.Unix(mk.minute, 0), Hub: ks.hub, Key: mk.key, Requests: c.Requests, Tokens: c.Tokens})
	}
	for mk := range ks.mine {
		if mk.minute < oldest {
			delete(ks.mine, mk)
		}
	}
	if ks.dropped > 0 {
		ks.log.Warn("key counts older than the other hubs read were never written: the database was unreachable", "counts", ks.dropped)
		ks.dropped = 0
	}
	err := ks.store.PublishKeyCounts(ctx, rows)
	if err == nil {
		clear(ks.dirty)
		// Even counts given up above are shown: they are too old to
		// matter to the others, and they must not hold the leash.
		ks.book.Published(ks.taken)
		clear(ks.taken)
		err = ks.readOthers(ctx, now, local)
	}
	if err != nil {
		if ks.failing.IsZero() {
			ks.failing = local
		}
		if !ks.alone && local.Sub(ks.failing) >= keyAloneAfter {
			ks.log.Warn("cannot reach the database: this hub holds the API keys' limits on its own until it can", "err", err)
			ks.book.Others(nil, 0, local)
			ks.alone = true
		}
		return err
	}
	if ks.alone {
		ks.log.Info("the database is back: API keys' limits are held with the other hubs again")
	}
	ks.failing, ks.alone = time.Time{}, false
	if now.Sub(ks.pruned) >= time.Minute {
		if _, err := ks.store.PruneKeyCounts(ctx, now.Add(-keyCountsKept)); err != nil {
			return err
		}
		ks.pruned = now
	}
	return nil
}

// readOthers counts into the book what the other hubs admitted and spent
// since the last read, and how many there are: now is the database's
// time, local this hub's (the book's clock).
func (ks *keySync) readOthers(ctx context.Context, now, local time.Time) error {
	counts, err := ks.store.KeyCountsSince(ctx, ks.hub, now.Add(-keyCountsWindow))
	if err != nil {
		return err
	}
	recent := now.Add(-time.Minute).Truncate(time.Minute)
	today := now.UTC().Truncate(24 * time.Hour)
	hubs := map[string]bool{}
	news := map[string]fleet.KeyCounts{}
	for _, c := range counts {
		if !c.Minute.Before(recent) {
			hubs[c.Hub] = true
		}
		if c.Key == "" {
			continue
		}
		hk := hubMinuteKey{c.Hub, minuteKey{c.Minute.Unix(), c.Key}}
		was := ks.seen[hk]
		ks.seen[hk] = fleet.KeyCounts{Requests: c.Requests, Tokens: c.Tokens}
		d := fleet.KeyCounts{Requests: max(c.Requests-was.Requests, 0), Tokens: max(c.Tokens-was.Tokens, 0)}
		if !ks.read {
			// The tokens spent before this hub started are in the seed
			// it took from the usage table; a request of the last
			// minute still weighs on requests a minute.
			d.Tokens = 0
			if c.Minute.Before(recent) {
				d.Requests = 0
			}
		}
		if c.Minute.Before(today) {
			d.Tokens = 0
		}
		if d != (fleet.KeyCounts{}) {
			news[c.Key] = addCounts(news[c.Key], d)
		}
	}
	forget := now.Add(-keyCountsKept).Unix()
	for hk := range ks.seen {
		if hk.minute < forget {
			delete(ks.seen, hk)
		}
	}
	ks.read = true
	ks.book.Others(news, len(hubs), local)
	return nil
}

func addCounts(a, b fleet.KeyCounts) fleet.KeyCounts {
	return fleet.KeyCounts{Requests: a.Requests + b.Requests, Tokens: a.Tokens + b.Tokens}
}
