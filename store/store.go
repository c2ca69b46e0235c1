// Package store is fleet's SQLite state: the schema, its versioned
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
	"os"
	"path/filepath"
	"strings"
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// ErrNotFound is wrapped by every error about a name the database does not
// hold (node, model, worker, user, API key), so callers can map it to a
// "not found" answer with errors.Is.
var ErrNotFound = errors.New("not found")

// ErrSchemaTooNew is wrapped when the database was written by a newer fleet.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

// Store is an open fleet database. It is safe for concurrent use.
type Store struct {
	db     *sql.DB
	path   string
	logger *slog.Logger
	now    func() time.Time

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

// Open opens (creating if needed) the database at path and brings its schema
// up to date. It refuses a database written by a newer fleet, because this
// binary would misread or damage tables it does not know.
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
	s := &Store{db: db, path: path, logger: slog.New(slog.DiscardHandler), now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w (is it a SQLite file fleet may read and write?)", path, err)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the database.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close database %s: %w", s.path, err)
	}
	return nil
}

// Path is the database file.
func (s *Store) Path() string { return s.path }

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return fmt.Errorf("open database %s: prepare migrations: %w", s.path, err)
	}
	var current int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("open database %s: read schema version: %w", s.path, err)
	}
	if current > len(migrations) {
		return fmt.Errorf("open database %s: %w: database schema version %d is newer than this fleet binary supports (%d); upgrade fleet or point --data at another directory",
			s.path, ErrSchemaTooNew, current, len(migrations))
	}
	for v := current + 1; v <= len(migrations); v++ {
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, migrations[v-1]); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, v, s.now().UnixNano())
			return err
		})
		if err != nil {
			return fmt.Errorf("open database %s: apply schema migration %d: %w", s.path, v, err)
		}
		s.logger.Info("applied schema migration", "db", s.path, "version", v)
	}
	return nil
}

// inTx runs fn in one transaction (BEGIN IMMEDIATE through the DSN, so
// writers queue on the busy timeout instead of failing on upgrade).
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
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

// isUnique reports a UNIQUE or PRIMARY KEY violation.
func isUnique(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey)
}

func isForeignKey(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && se.ExtendedCode == sqlite3.ErrConstraintForeignKey
}

func clampLimit(limit int) int {
	if limit <= 0 {
		return -1 // SQLite: no limit
	}
	return limit
}
