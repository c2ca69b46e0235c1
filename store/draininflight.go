package store

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// On several hubs every hub routes, so a drain (and a restart or stop,
// which drain first) is over only when no hub has a request in flight on
// the worker. Each hub publishes, for the workers its router has drained,
// how many requests it has in flight on each, with when it read the
// workers its router follows (ReadAt, the database's clock): the leader
// waits until every live hub has read the drain and has none in flight.

// Now is the database's clock in Unix nanoseconds, the clock ReadAt and
// the heartbeats are on.
func (s *Store) Now(ctx context.Context) (int64, error) {
	var now int64
	if err := s.db.QueryRowContext(ctx, `SELECT `+s.db.d.nowNanos).Scan(&now); err != nil {
		return 0, fmt.Errorf("read the clock of %s: %w", s.path, err)
	}
	return now, nil
}

// AskDrainAnswers starts a wait for worker's drain, recorded before: it
// reads the database's clock (since) and, in the same transaction, tells
// every hub to read the worker again (a notice on ChannelWorkers, sent when
// the transaction commits). A hub's read on that notice is after since, so
// what it publishes then, as read at since or later, answers this drain; a
// read before it may have preceded the drain.
func (s *Store) AskDrainAnswers(ctx context.Context, worker string) (since int64, err error) {
	err = s.inTx(ctx, func(tx *txn) error {
		if err := tx.QueryRowContext(ctx, `SELECT `+s.db.d.nowNanos).Scan(&since); err != nil {
			return err
		}
		return tx.notify(ctx, ChannelWorkers, worker)
	})
	if err != nil {
		return 0, fmt.Errorf("ask the other hubs about their requests in flight on %s, in %s: %w", worker, s.path, err)
	}
	return since, nil
}

// PublishDrainInFlight makes hub's rows the requests it has in flight on
// each worker its router has drained (worker → count), its router
// following the workers as read at readAt; a worker not in inflight loses
// its row. It writes only hub's rows, which no other hub writes, so it
// waits on no other hub.
func (s *Store) PublishDrainInFlight(ctx context.Context, hub string, readAt int64, inflight map[string]int) error {
	names := make([]string, 0, len(inflight))
	for name := range inflight {
		names = append(names, name)
	}
	sort.Strings(names)
	err := s.inTx(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM drain_inflight WHERE hub = ?`, hub); err != nil {
			return err
		}
		for _, name := range names {
			if _, err := tx.ExecContext(ctx, `INSERT INTO drain_inflight (hub, worker, inflight, read_at) VALUES (?, ?, ?, ?)`,
				hub, name, inflight[name], readAt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("publish hub %s's requests in flight on drained workers to %s: %w", hub, s.path, err)
	}
	return nil
}

// DrainHolder is a live hub that holds up a drain: it has not read the
// drain yet (Seen false), or has requests in flight on the worker.
type DrainHolder struct {
	Hub      string
	Seen     bool
	InFlight int
}

// DrainHolders lists the live hubs other than self (heartbeat within
// liveWithin) that hold up a drain of worker recorded before since (the
// database's clock): those that have not published the worker drained as
// read at since or later, and those with requests in flight on it. A hub
// whose heartbeat is older holds nothing up: it is dead or frozen, and its
// requests with it.
func (s *Store) DrainHolders(ctx context.Context, self, worker string, since int64, liveWithin time.Duration) ([]DrainHolder, error) {
	all, err := queryAll(ctx, s.db, "read the hubs' requests in flight on "+worker, func(r rowScanner) (DrainHolder, error) {
		var (
			h      DrainHolder
			readAt int64
		)
		err := r.Scan(&h.Hub, &h.InFlight, &readAt)
		h.Seen = readAt >= since
		return h, err
	}, `SELECT h.name, COALESCE(d.inflight, 0), COALESCE(d.read_at, 0) FROM hubs h
		LEFT JOIN drain_inflight d ON d.hub = h.name AND d.worker = ?
		WHERE h.name <> ? AND h.heartbeat_at > `+s.db.d.nowNanos+` - ? ORDER BY h.name`,
		worker, self, int64(liveWithin))
	if err != nil {
		return nil, err
	}
	var holding []DrainHolder
	for _, h := range all {
		if !h.Seen || h.InFlight > 0 {
			holding = append(holding, h)
		}
	}
	return holding, nil
}
