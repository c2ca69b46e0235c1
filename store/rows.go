package store

import (
	"context"
	"fmt"
)

// rowScanner is a row being read: *sql.Rows inside a loop, *sql.Row alone.
type rowScanner interface{ Scan(dest ...any) error }

// eachRow runs query on q and hands every row to read, in order, stopping at
// the first error. Every error (running the query, from read, or ending the
// rows) comes back wrapped in what, the read in the operator's words ("read
// nodes"), so read words only what is its own ("node rig: stored platform
// is not valid JSON"). The rows are closed when it returns, so the caller
// may query again at once inside a transaction.
func eachRow(ctx context.Context, q queryer, what string, read func(rowScanner) error, query string, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := read(rows); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// queryAll is eachRow collecting what scan makes of each row. The list is
// never nil, so an empty one encodes as [] in JSON.
func queryAll[T any](ctx context.Context, q queryer, what string, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	out := []T{}
	err := eachRow(ctx, q, what, func(r rowScanner) error {
		v, err := scan(r)
		if err != nil {
			return err
		}
		out = append(out, v)
		return nil
	}, query, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}
