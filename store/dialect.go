package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// dialect is everything that differs between the databases the store
// speaks. Every statement is written once, in the SQL both accept, with ?
// placeholders; the few spots where SQLite and PostgreSQL spell a thing
// differently ask the dialect, so no statement tests which database it is on.
type dialect struct {
	// name is the database's name for error messages.
	name string
	// migrations is the schema history; version N is migrations[N-1] in
	// every dialect, so a version number means the same tables and columns.
	migrations []string
	// elsewhere is the operator's way to another database.
	elsewhere string
	// numbered placeholders: $1, $2, … instead of ?.
	numbered bool
	// lock and lockShared, when set, take a transaction-scoped advisory
	// lock, exclusive or shared, named by their one argument (txn.lock).
	// SQLite has none: BEGIN IMMEDIATE (the DSN) queues every writer on
	// the file already.
	lock, lockShared string
	// skipLocked ends a subquery that picks a row to take, so that it
	// passes over rows another transaction has locked.
	skipLocked string
	// jsonStrings is a subquery giving one row per string of the JSON
	// array bound to its one placeholder.
	jsonStrings string
	// jsonField reads the value of a top-level key of a JSON text column.
	jsonField func(column, key string) string
	// unique and foreignKey classify a constraint violation.
	unique, foreignKey func(error) bool
	// nowNanos is the database's clock in Unix nanoseconds: the lease and
	// the hubs' heartbeats are timed by it, never by a hub's clock.
	nowNanos string
	// fence, when set, runs first in a write about workers, launches or
	// pending stops with the writer's lease epoch as its one argument; it
	// fails (notLeader) unless that epoch holds the lease.
	fence string
	// notLeader tells fence's refusal from other errors.
	notLeader func(error) bool
	// notify, when set, announces a change to the other hubs with its two
	// arguments, the channel and the payload, when the transaction commits.
	notify string
}

var sqliteDialect = dialect{
	name:        "SQLite",
	migrations:  migrations,
	elsewhere:   "point --data at another directory",
	jsonStrings: `SELECT value FROM json_each(?)`,
	jsonField: func(column, key string) string {
		return `json_extract(` + column + `, '$.` + key + `')`
	},
	unique: func(err error) bool {
		var se sqlite3.Error
		return errors.As(err, &se) && (se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey)
	},
	foreignKey: func(err error) bool {
		var se sqlite3.Error
		return errors.As(err, &se) && se.ExtendedCode == sqlite3.ErrConstraintForeignKey
	},
	// 'now' has milliseconds in SQLite; one hub on one file needs no more.
	nowNanos:  `CAST((julianday('now') - 2440587.5) * 86400000000000 AS INTEGER)`,
	notLeader: func(error) bool { return false },
}

var postgresDialect = dialect{
	name:       "PostgreSQL",
	migrations: postgresMigrations,
	elsewhere:  "point --database-url at another database",
	numbered:   true,
	// Transaction-scoped, so a hub that dies mid-transaction frees them;
	// keyed by the schema too, so fleets sharing a database in different
	// schemas do not queue on each other.
	lock:        `SELECT pg_advisory_xact_lock(hashtext(? || current_schema()))`,
	lockShared:  `SELECT pg_advisory_xact_lock_shared(hashtext(? || current_schema()))`,
	skipLocked:  ` FOR UPDATE SKIP LOCKED`,
	jsonStrings: `SELECT json_array_elements_text(CAST(? AS json))`,
	jsonField: func(column, key string) string {
		return `(CAST(` + column + ` AS json) ->> '` + key + `')`
	},
	unique:     func(err error) bool { return pgCode(err) == "23505" },
	foreignKey: func(err error) bool { return pgCode(err) == "23503" },
	// clock_timestamp, not now(): now() is the transaction's start, which
	// may be a wait on a lock ago.
	nowNanos:  `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000000 AS BIGINT)`,
	fence:     `SELECT fleet_fence(?)`,
	notLeader: func(err error) bool { return pgCode(err) == "FL001" },
	notify:    `SELECT pg_notify(?, ?)`,
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// rebind rewrites a statement's ? placeholders into the dialect's. A ?
// inside a quoted string or identifier is text, not a placeholder.
func (d *dialect) rebind(query string) string {
	if !d.numbered || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	var quote byte
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// pool is the database with the dialect applied to every statement; it and
// txn are the only way the store reaches the database.
type pool struct {
	db *sql.DB
	d  *dialect
}

func (p *pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return p.db.ExecContext(ctx, p.d.rebind(query), args...)
}

func (p *pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return p.db.QueryContext(ctx, p.d.rebind(query), args...)
}

func (p *pool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return p.db.QueryRowContext(ctx, p.d.rebind(query), args...)
}

// begin starts a transaction: on SQLite it holds the file's write lock
// (BEGIN IMMEDIATE), on PostgreSQL nothing but the rows it writes, in READ
// COMMITTED. Each write says beside its statements why that is enough;
// those that need more take a named lock (txn.lock).
func (p *pool) begin(ctx context.Context) (*txn, error) {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &txn{tx: tx, d: p.d}, nil
}

// txn is one transaction, with the dialect applied to every statement.
type txn struct {
	tx *sql.Tx
	d  *dialect
}

func (t *txn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, t.d.rebind(query), args...)
}

func (t *txn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, t.d.rebind(query), args...)
}

func (t *txn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, t.d.rebind(query), args...)
}

// The advisory locks' names. A transaction takes at most one of them, as
// its first statement, so locks are always taken in one order: named lock,
// then rows.
const (
	// lockSchema keeps two hubs starting together from migrating at once.
	lockSchema = "fleet schema "
	// lockFleetState is the declared fleet's: an apply (and a new fleet
	// identity) takes it exclusive, the leader's writes of workers and
	// pending stops take it shared. An apply reads the workers and writes
	// pending stops from what it read, and deletes the workers its
	// placements lost; a launch recorded in between would be lost with
	// them, so no such write runs during an apply. Only the leader's
	// writes take it (and `fleet fleet-id --new`), so a follower's
	// writes never wait on it.
	lockFleetState = "fleet state "
)

// lock takes the advisory lock name (exclusive, or shared with others who
// take it shared) until the transaction ends. It is the transaction's
// first statement, before any row lock.
func (t *txn) lock(ctx context.Context, name string, shared bool) error {
	query := t.d.lock
	if shared {
		query = t.d.lockShared
	}
	if query == "" {
		return nil
	}
	if _, err := t.ExecContext(ctx, query, name); err != nil {
		return fmt.Errorf("wait for the lock %q: %w", strings.TrimSpace(name), err)
	}
	return nil
}
