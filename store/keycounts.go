package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// KeyCount is what one hub counted of one API key in one minute: the
// requests it admitted and the tokens they spent. The hubs sharing a
// database publish theirs and read the others', so a key's limits hold
// across them. Key "" is a hub's mark that it is there.
type KeyCount struct {
	Minute   time.Time // the minute's start, by the database's clock (keySync reads it)
	Hub, Key string
	Requests int64
	Tokens   int64
}

// maxKeyCountsPerStatement bounds one publishing statement's rows (five
// placeholders each, well inside either database's limit); a hub sends
// one row per key that had traffic, so more is rare.
const maxKeyCountsPerStatement = 200

// PublishKeyCounts records each row's counts as its hub's total for that
// minute and key, replacing what was there: a publish that is retried, or
// repeated with a larger total, counts each request once. It takes no
// store lock (a statement on its own, not a transaction behind the
// store's writers), since hubs publish several times a second.
func (s *Store) PublishKeyCounts(ctx context.Context, rows []KeyCount) error {
	for len(rows) > 0 {
		n := min(len(rows), maxKeyCountsPerStatement)
		batch := rows[:n]
		rows = rows[n:]
		args := make([]any, 0, 5*len(batch))
		values := make([]string, 0, len(batch))
		for _, r := range batch {
			if r.Hub == "" || r.Minute.IsZero() {
				return fmt.Errorf("publish key counts: a row has no hub or minute (%+v); nothing more was stored", r)
			}
			values = append(values, "(?, ?, ?, ?, ?)")
			args = append(args, r.Minute.Truncate(time.Minute).Unix(), r.Hub, r.Key, r.Requests, r.Tokens)
		}
		_, err := s.db.ExecContext(ctx, `INSERT INTO key_counts (minute, hub, key_name, requests, tokens) VALUES `+
			strings.Join(values, ", ")+`
			ON CONFLICT (minute, hub, key_name) DO UPDATE SET requests = excluded.requests, tokens = excluded.tokens`, args...)
		if err != nil {
			return fmt.Errorf("publish %d key counts to %s: %w", len(batch), s.path, err)
		}
	}
	return nil
}

// KeyCountsSince is every other hub's counts (all but hub's) of the
// minutes from since's on.
func (s *Store) KeyCountsSince(ctx context.Context, hub string, since time.Time) ([]KeyCount, error) {
	return queryAll(ctx, s.db, "read the other hubs' key counts", func(r rowScanner) (KeyCount, error) {
		var (
			c      KeyCount
			minute int64
		)
		err := r.Scan(&minute, &c.Hub, &c.Key, &c.Requests, &c.Tokens)
		c.Minute = time.Unix(minute, 0).UTC()
		return c, err
	}, `SELECT minute, hub, key_name, requests, tokens FROM key_counts WHERE minute >= ? AND hub != ?`,
		since.Truncate(time.Minute).Unix(), hub)
}

// PruneKeyCounts deletes the counts of minutes before before's.
func (s *Store) PruneKeyCounts(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM key_counts WHERE minute < ?`, before.Truncate(time.Minute).Unix())
	if err != nil {
		return 0, fmt.Errorf("prune key counts: %w", err)
	}
	return res.RowsAffected()
}
