package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"fleet"
)

// UsageBucket is the time bucket usage is kept in.
const UsageBucket = time.Minute

// AddUsage adds one batch of usage, each row to its minute bucket (the row's
// Bucket, truncated), at once: rows already there for the same bucket, key,
// model and worker, of this hub (SetAuditOrigin), are added to.
//
// Each hub adds to rows of its own (the hub is in the key), so on
// PostgreSQL it never waits for another hub's transaction, and the upsert
// adds to the row as last committed (READ COMMITTED), so two writes of one
// hub at once lose nothing. They lock their rows in one order (sorted
// here), so they cannot deadlock.
func (s *Store) AddUsage(ctx context.Context, rows []fleet.Usage) error {
	if len(rows) == 0 {
		return nil
	}
	for i, u := range rows {
		if u.Bucket.IsZero() || u.Model == "" || u.Worker == "" {
			return fmt.Errorf("add usage: row %d has no time, model or worker; nothing was stored", i)
		}
	}
	// One statement cannot upsert a row twice: rows of one minute, key,
	// model and worker are summed first.
	type rowKey struct {
		bucket             int64
		key, model, worker string
	}
	byRow := map[rowKey]*fleet.Usage{}
	for _, u := range rows {
		u.Bucket = u.Bucket.Truncate(UsageBucket)
		at := rowKey{u.Bucket.Unix(), u.Key, u.Model, u.Worker}
		if sum, ok := byRow[at]; ok {
			sum.Requests += u.Requests
			sum.PromptTokens += u.PromptTokens
			sum.CachedTokens += u.CachedTokens
			sum.CompletionTokens += u.CompletionTokens
			continue
		}
		byRow[at] = &u
	}
	sums := make([]*fleet.Usage, 0, len(byRow))
	for _, u := range byRow {
		sums = append(sums, u)
	}
	slices.SortFunc(sums, func(a, b *fleet.Usage) int {
		return cmp.Or(a.Bucket.Compare(b.Bucket), strings.Compare(a.Key, b.Key),
			strings.Compare(a.Model, b.Model), strings.Compare(a.Worker, b.Worker))
	})
	hub := ""
	if o := s.auditOrigin.Load(); o != nil {
		hub = o.hub
	}
	const columns = 9
	err := s.insertRows(ctx, len(sums), func(lo, hi int) (string, []any) {
		args := make([]any, 0, columns*(hi-lo))
		for _, u := range sums[lo:hi] {
			args = append(args, u.Bucket.Unix(), u.Key, u.Model, u.Worker, hub,
				u.Requests, u.PromptTokens, u.CachedTokens, u.CompletionTokens)
		}
		return `INSERT INTO usage (bucket, key, model, worker, hub, requests, prompt_tokens, cached_tokens, completion_tokens)
			VALUES ` + valueRows(hi-lo, columns) + `
			ON CONFLICT (bucket, key, model, worker, hub) DO UPDATE SET
				requests = usage.requests + excluded.requests,
				prompt_tokens = usage.prompt_tokens + excluded.prompt_tokens,
				cached_tokens = usage.cached_tokens + excluded.cached_tokens,
				completion_tokens = usage.completion_tokens + excluded.completion_tokens`, args
	})
	if err != nil {
		return fmt.Errorf("add %d usage rows to %s: %w", len(rows), s.path, err)
	}
	return nil
}

// UsageBy names what usage totals are grouped by.
type UsageBy string

const (
	UsageByKey    UsageBy = "key"
	UsageByModel  UsageBy = "model"
	UsageByWorker UsageBy = "worker"
)

// Usage totals the usage counted since since (from the start of its minute),
// grouped by key, model or worker, most tokens first.
func (s *Store) Usage(ctx context.Context, since time.Time, by UsageBy) ([]fleet.Usage, error) {
	var col string
	switch by {
	case UsageByKey, UsageByModel, UsageByWorker:
		col = string(by)
	default:
		return nil, fmt.Errorf("usage: cannot group by %q; use key, model or worker", by)
	}
	// col is one of three constants above, never client text.
	return queryAll(ctx, s.db, "usage by "+string(by), func(r rowScanner) (fleet.Usage, error) {
		var (
			u    fleet.Usage
			name string
		)
		err := r.Scan(&name, &u.Requests, &u.PromptTokens, &u.CachedTokens, &u.CompletionTokens)
		switch by {
		case UsageByKey:
			u.Key = name
		case UsageByModel:
			u.Model = name
		case UsageByWorker:
			u.Worker = name
		}
		return u, err
	}, `SELECT `+col+`, SUM(requests), SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens)
		FROM usage WHERE bucket >= ? GROUP BY `+col+`
		ORDER BY SUM(prompt_tokens) + SUM(completion_tokens) DESC, `+col,
		since.Truncate(UsageBucket).Unix())
}

// KeyTokensSince is each key's prompt plus completion tokens since since, so
// a restarted hub goes on counting a day's token limit where it was.
func (s *Store) KeyTokensSince(ctx context.Context, since time.Time) (map[string]int64, error) {
	out := map[string]int64{}
	err := eachRow(ctx, s.db, "tokens per key", func(r rowScanner) error {
		var (
			k string
			n int64
		)
		if err := r.Scan(&k, &n); err != nil {
			return err
		}
		out[k] = n
		return nil
	}, `SELECT key, SUM(prompt_tokens) + SUM(completion_tokens) FROM usage
		WHERE bucket >= ? AND key != '' GROUP BY key`, since.Truncate(UsageBucket).Unix())
	if err != nil {
		return nil, err
	}
	return out, nil
}

// KeyActivity is when each key was last used (the start of the last minute
// it had a request answered, within the usage kept) and how many requests
// it had answered since today, for `fleet key list`. Keys never used are
// absent.
func (s *Store) KeyActivity(ctx context.Context, today time.Time) (map[string]KeyActivity, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key, MAX(bucket), SUM(CASE WHEN bucket >= ? THEN requests ELSE 0 END) FROM usage
		WHERE key != '' GROUP BY key`, today.Truncate(UsageBucket).Unix())
	if err != nil {
		return nil, fmt.Errorf("key activity: %w", err)
	}
	defer rows.Close()
	out := map[string]KeyActivity{}
	for rows.Next() {
		var (
			k    string
			last int64
			a    KeyActivity
		)
		if err := rows.Scan(&k, &last, &a.RequestsToday); err != nil {
			return nil, fmt.Errorf("key activity: %w", err)
		}
		a.LastUsed = time.Unix(last, 0).UTC()
		out[k] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("key activity: %w", err)
	}
	return out, nil
}

// KeyActivity is one key's use, as KeyActivity reads it.
type KeyActivity struct {
	LastUsed      time.Time
	RequestsToday int64
}

// SetAPIKeyLimits sets a live key's limits (0: none).
func (s *Store) SetAPIKeyLimits(ctx context.Context, name string, l fleet.KeyLimits) error {
	if l.RequestsPerMinute < 0 || l.TokensPerDay < 0 {
		return fmt.Errorf("set limits of API key %s: a limit cannot be negative (0 removes it); nothing changed", name)
	}
	return s.changeOne(ctx, change{channel: ChannelKeys, payload: name}, "set limits of API key "+name, "live API key "+name, "; `fleet key list` shows the keys",
		`UPDATE api_keys SET requests_per_minute = ?, tokens_per_day = ? WHERE name = ? AND revoked = 0`,
		l.RequestsPerMinute, l.TokensPerDay, name)
}
