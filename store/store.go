// Package store is fleet's state, in SQLite or PostgreSQL: the schema, its versioned
// migrations and every SQL statement of the project. Other packages speak to
// it in fleet.go's types and never see SQL.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver
)

// ErrNotFound is wrapped by every error about a name the database does not
// hold (node, model, worker, user, API key), so callers can map it to a
// "not found" answer with errors.Is.
var ErrNotFound = errors.New("not found")

// ErrSchemaTooNew is wrapped when the database was written by a newer fleet.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

// Store is an open fleet database. It is safe for concurrent use.
type Store struct {
	db *pool
	// path names the database in messages: the SQLite file, or the
	// PostgreSQL URL without its password and options (fleet.RedactText).
	path   string
	logger *slog.Logger
	now    func() time.Time
	// epoch is the lease epoch this hub writes with (SetEpoch).
	epoch atomic.Int64
	// auditOrigin is the hub and the run of it that write audit lines
	// (SetAuditOrigin).
	auditOrigin atomic.Pointer[auditOrigin]
	// pgConfig is how to open another connection to the PostgreSQL server
	// (Listen's); nil on SQLite.
	pgConfig *pgx.ConnConfig
	// listening, when set, is told the server process of each connection
	// Listen makes (a test kills it there).
	listening func(pid uint32)

	// applyPause, when set, is called inside ApplyFleet's transaction after
	// each step ("nodes", "models", "placements", "workers") and after the
	// commit ("committed"). The crash test uses it to stop a real process
	// mid-transaction and kill it there.
	applyPause func(step string)
}

// Option configures Open.
type Option func(*Store)

// WithLogger sends the store's logs (migrations applied) to l.
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) {
		if l != nil {
			s.logger = l
		}
	}
}

// WithClock replaces time.Now for the timestamps the store sets itself
// (API key creation, reference shape updates).
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// SchemaVersion is the newest schema this binary knows.
func SchemaVersion() int { return len(migrations) }

// Open opens (creating if needed) the SQLite database at path and brings
// its schema up to date. It refuses a database written by a newer fleet,
// because this binary would misread or damage tables it does not know.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	if path == "" {
		return nil, errors.New("open database: no path given; pass --data with a directory fleet may write to")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open database %q: the path contains '?' or '#', which SQLite would read as options; choose a directory without them", path)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open database: create directory %s: %w", dir, err)
		}
	}
	dsn := path + "?_journal_mode=WAL&_foreign_keys=on&_busy_timeout=5000&_txlock=immediate"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	return open(ctx, db, &sqliteDialect, path, "is it a SQLite file fleet may read and write?", opts)
}

// open finishes Open and OpenPostgres: it checks that db answers, then
// migrates. cannotReach is the operator's next step when it does not.
func open(ctx context.Context, db *sql.DB, d *dialect, path, cannotReach string, opts []Option) (*Store, error) {
	s := &Store{db: &pool{db: db, d: d}, path: path, logger: slog.New(slog.DiscardHandler), now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w (%s)", path, err, cannotReach)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the database.
func (s *Store) Close() error {
	if err := s.db.db.Close(); err != nil {
		return fmt.Errorf("close database %s: %w", s.path, err)
	}
	return nil
}

// Path names the database: the SQLite file, or the PostgreSQL URL without
// its password and options.
func (s *Store) Path() string { return s.path }

func (s *Store) migrate(ctx context.Context) error {
	migrations := s.db.d.migrations
	// Under the schema lock, so that hubs starting together on one
	// PostgreSQL database queue rather than race to create it.
	err := s.inTx(ctx, func(tx *txn) error {
		if err := tx.lock(ctx, lockSchema, false); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			applied_at BIGINT NOT NULL
		)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("open database %s: prepare migrations: %w", s.path, err)
	}
	current, err := schemaVersion(ctx, s.db)
	if err != nil {
		return fmt.Errorf("open database %s: %w", s.path, err)
	}
	if current > len(migrations) {
		return fmt.Errorf("open database %s: %w: database schema version %d is newer than this fleet binary supports (%d); upgrade fleet or %s",
			s.path, ErrSchemaTooNew, current, len(migrations), s.db.d.elsewhere)
	}
	for v := current + 1; v <= len(migrations); v++ {
		applied := false
		err := s.inTx(ctx, func(tx *txn) error {
			if err := tx.lock(ctx, lockSchema, false); err != nil {
				return err
			}
			// Another hub may have applied it while this one waited: the
			// lock came first, so this statement sees its commit.
			now, err := schemaVersion(ctx, tx)
			if err != nil || now >= v {
				return err
			}
			if _, err := tx.ExecContext(ctx, migrations[v-1]); err != nil {
				return err
			}
			applied = true
			_, err = tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, v, s.now().UnixNano())
			return err
		})
		if err != nil {
			return fmt.Errorf("open database %s: apply schema migration %d: %w", s.path, v, err)
		}
		if applied {
			s.logger.Info("applied schema migration", "db", s.path, "version", v)
		}
	}
	return nil
}

func schemaVersion(ctx context.Context, q queryer) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// inTx runs fn in one transaction (begin says what it holds). Writers
// queue rather than fail: on SQLite through BEGIN IMMEDIATE (the DSN) and
// the busy timeout, on PostgreSQL on the rows (and named lock) they share.
func (s *Store) inTx(ctx context.Context, fn func(tx *txn) error) error {
	tx, err := s.db.begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.tx.Rollback()
		return err
	}
	return tx.tx.Commit()
}

// maxRowsPerInsert bounds the rows of one INSERT: at 9 columns, well inside
// either database's limit on placeholders.
const maxRowsPerInsert = 500

// insertRows writes n rows, insert(lo, hi) giving the statement and
// arguments of rows lo to hi: one statement when they fit in one (atomic on
// its own, and one round trip to the database), else statements of
// maxRowsPerInsert rows in one transaction.
func (s *Store) insertRows(ctx context.Context, n int, insert func(lo, hi int) (string, []any)) error {
	if n <= maxRowsPerInsert {
		query, args := insert(0, n)
		_, err := s.db.ExecContext(ctx, query, args...)
		return err
	}
	return s.inTx(ctx, func(tx *txn) error {
		for lo := 0; lo < n; lo += maxRowsPerInsert {
			query, args := insert(lo, min(lo+maxRowsPerInsert, n))
			if _, err := tx.ExecContext(ctx, query, args...); err != nil {
				return err
			}
		}
		return nil
	})
}

// valueRows is the VALUES list of an insert of rows rows of columns values:
// "(?, ?), (?, ?)".
func valueRows(rows, columns int) string {
	row := "(" + strings.Repeat("?, ", columns-1) + "?)"
	return strings.Repeat(row+", ", rows-1) + row
}

// unixNano stores a time; the zero time is 0 so "never" survives a round trip.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func toJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// unlimited stands for "no limit" in a LIMIT clause; both dialects take
// it, where SQLite's -1 is an error on PostgreSQL.
const unlimited = math.MaxInt64

func clampLimit(limit int) int64 {
	if limit <= 0 {
		return unlimited
	}
	return int64(limit)
}
