package store

import (
	"context"
	"fmt"
	"time"
)

// pruneBatch bounds one DELETE: a hub that kept weeks of samples deletes
// them in short transactions, so the router's batched writes and the
// console's reads never wait long behind a prune.
const pruneBatch = 5000

// Pruned says how many rows of each kind PruneHistory deleted.
type Pruned struct {
	Samples, Usage, Events int64
}

// PruneHistory deletes what is older than before of the tables that grow
// with traffic: the router's request samples (bench and shape samples stay
// with their runs), usage minutes and events. The audit log has its own
// bound (PruneAudit).
func (s *Store) PruneHistory(ctx context.Context, before time.Time) (Pruned, error) {
	var p Pruned
	for _, t := range []struct {
		what  string
		n     *int64
		query string
		arg   int64
	}{
		{"request samples", &p.Samples, `DELETE FROM samples WHERE id IN
			(SELECT id FROM samples WHERE at < ? AND kind = 'request' LIMIT ?)`, unixNano(before)},
		{"usage", &p.Usage, `DELETE FROM usage WHERE (bucket, key, model, worker, hub) IN
			(SELECT bucket, key, model, worker, hub FROM usage WHERE bucket < ? LIMIT ?)`, before.Unix()},
		// Events have no index on at, but ids grow with time: the oldest
		// come first in id order.
		{"events", &p.Events, `DELETE FROM events WHERE id IN
			(SELECT id FROM events WHERE at < ? ORDER BY id LIMIT ?)`, unixNano(before)},
	} {
		for {
			res, err := s.db.ExecContext(ctx, t.query, t.arg, pruneBatch)
			if err != nil {
				return p, fmt.Errorf("prune %s older than %s in %s: %w", t.what, before.Format(time.RFC3339), s.path, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return p, fmt.Errorf("prune %s older than %s in %s: %w", t.what, before.Format(time.RFC3339), s.path, err)
			}
			*t.n += n
			if n < pruneBatch {
				break
			}
		}
	}
	return p, nil
}

// PruneAudit keeps the audit log bounded. Lines that stand for repeated
// refusals and failures (count > 0) go when they are older than before; then,
// while the log holds more than maxRows lines, the oldest such lines go
// first and, only when none is left, the oldest lines of actions: a flood
// of refusals cannot push out the record of what people did. maxRows <= 0
// leaves the size alone. It returns how many lines it deleted.
func (s *Store) PruneAudit(ctx context.Context, before time.Time, maxRows int) (int64, error) {
	var deleted int64
	del := func(what, query string, args ...any) (int64, error) {
		res, err := s.db.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, fmt.Errorf("prune %s of the audit log in %s: %w", what, s.path, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("prune %s of the audit log in %s: %w", what, s.path, err)
		}
		deleted += n
		return n, nil
	}
	if !before.IsZero() {
		for {
			n, err := del("repeat lines older than "+before.Format(time.RFC3339), `DELETE FROM audit WHERE id IN
				(SELECT id FROM audit WHERE count > 0 AND at < ? ORDER BY id LIMIT ?)`, unixNano(before), pruneBatch)
			if err != nil || n < pruneBatch {
				if err != nil {
					return deleted, err
				}
				break
			}
		}
	}
	if maxRows <= 0 {
		return deleted, nil
	}
	for _, step := range []struct{ what, query string }{
		{"the oldest repeat lines", `DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE count > 0 ORDER BY id LIMIT ?)`},
		{"the oldest lines", `DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY id LIMIT ?)`},
	} {
		for {
			var rows int
			if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM audit`).Scan(&rows); err != nil {
				return deleted, fmt.Errorf("count the lines of the audit log in %s: %w", s.path, err)
			}
			if rows <= maxRows {
				return deleted, nil
			}
			n, err := del(step.what, step.query, min(rows-maxRows, pruneBatch))
			if err != nil {
				return deleted, err
			}
			if n == 0 {
				break // none of this kind left: the next step
			}
		}
	}
	return deleted, nil
}
