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
// with their runs), usage minutes and events. The audit log is never
// pruned: it is the record of who did what.
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
		{"usage", &p.Usage, `DELETE FROM usage WHERE rowid IN
			(SELECT rowid FROM usage WHERE bucket < ? LIMIT ?)`, before.Unix()},
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
