package store

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
)

// testDB is one empty database of one dialect, which a test may open as
// often as it likes (two hubs on one database, a reopen after a change).
type testDB struct {
	name string
	// target is what the store opens: the SQLite file or the URL.
	target string
	open   func(ctx context.Context, opts ...Option) (*Store, error)
}

// openTest opens the database for the length of the test.
func (db testDB) openTest(t *testing.T) *Store {
	t.Helper()
	s, err := db.open(context.Background())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// forEachDialect runs fn as one subtest per dialect the store speaks, each
// on a new, empty database: SQLite in a temp dir, PostgreSQL in a schema
// of its own in .ci/with-postgres's cluster (skipped without one, outside
// CI only).
func forEachDialect(t *testing.T, fn func(t *testing.T, db testDB)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "sub", "fleet.db")
		fn(t, testDB{name: "sqlite", target: path, open: func(ctx context.Context, opts ...Option) (*Store, error) {
			return Open(ctx, path, opts...)
		}})
	})
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.URL(t)
		fn(t, testDB{name: "postgres", target: url, open: func(ctx context.Context, opts ...Option) (*Store, error) {
			s, err := OpenPostgres(ctx, url, opts...)
			if err != nil {
				return nil, err
			}
			return s, leadForTest(ctx, s)
		}})
	})
}

// leadForTest makes s write as the leader would, holding the lease for the
// length of any test (every store a test opens shares the holder).
func leadForTest(ctx context.Context, s *Store) error {
	l, err := s.ClaimLease(ctx, "store test", time.Hour)
	if err != nil || !l.Leader {
		s.Close()
		return fmt.Errorf("claim the lease for the test: %+v, %v", l, err)
	}
	s.SetEpoch(l.Epoch)
	return nil
}

func TestRebind(t *testing.T) {
	for _, tc := range []struct {
		query, sqlite, postgres string
	}{
		{`SELECT 1`, `SELECT 1`, `SELECT 1`},
		{`SELECT a FROM t WHERE b = ? AND c > ?`, `SELECT a FROM t WHERE b = ? AND c > ?`, `SELECT a FROM t WHERE b = $1 AND c > $2`},
		{`SELECT '?', "odd?name" FROM t WHERE x = ?`, `SELECT '?', "odd?name" FROM t WHERE x = ?`, `SELECT '?', "odd?name" FROM t WHERE x = $1`},
		{`VALUES (?, 'it''s ?', ?)`, `VALUES (?, 'it''s ?', ?)`, `VALUES ($1, 'it''s ?', $2)`},
	} {
		if got := sqliteDialect.rebind(tc.query); got != tc.sqlite {
			t.Errorf("SQLite rebind(%q) = %q, want %q", tc.query, got, tc.sqlite)
		}
		if got := postgresDialect.rebind(tc.query); got != tc.postgres {
			t.Errorf("PostgreSQL rebind(%q) = %q, want %q", tc.query, got, tc.postgres)
		}
	}
}

// TestEveryDialectHasEveryMigration: a version number is one schema on
// every database, so a migration added to SQLite's history without
// PostgreSQL's (or the reverse) fails here, with or without a PostgreSQL.
func TestEveryDialectHasEveryMigration(t *testing.T) {
	if len(postgresMigrations) != len(migrations) {
		t.Fatalf("SQLite has %d schema migrations and PostgreSQL %d: port the new one (store/schema.go) to store/schema_postgres.go",
			len(migrations), len(postgresMigrations))
	}
}

// TestSchemasAgree: after every migration, both databases hold the same
// tables with the same columns, so every statement finds on one what it
// finds on the other.
func TestSchemasAgree(t *testing.T) {
	ctx := context.Background()
	columns := map[string]map[string][]string{}
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.openTest(t)
		query := `SELECT m.name, p.name FROM sqlite_schema m, pragma_table_info(m.name) p
			WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'`
		if db.name == "postgres" {
			query = `SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()`
		}
		tables := map[string][]string{}
		err := eachRow(ctx, s.db, "read the schema", func(r rowScanner) error {
			var table, column string
			if err := r.Scan(&table, &column); err != nil {
				return err
			}
			tables[table] = append(tables[table], column)
			return nil
		}, query)
		if err != nil {
			t.Fatal(err)
		}
		for _, cols := range tables {
			slices.Sort(cols)
		}
		if len(tables) < 10 {
			t.Fatalf("only %d tables read: %v", len(tables), tables)
		}
		columns[db.name] = tables
	})
	if len(columns) == 2 && !reflect.DeepEqual(columns["sqlite"], columns["postgres"]) {
		for table, cols := range columns["sqlite"] {
			if pg := columns["postgres"][table]; !reflect.DeepEqual(cols, pg) {
				t.Errorf("table %s: SQLite has columns %s, PostgreSQL %s", table, strings.Join(cols, ", "), strings.Join(pg, ", "))
			}
		}
		for table := range columns["postgres"] {
			if _, ok := columns["sqlite"][table]; !ok {
				t.Errorf("table %s is on PostgreSQL only", table)
			}
		}
	}
}

// TestNamesSortByteByByte: lists ordered by name (workers, users, keys,
// usage) come in the same order on every database, byte by byte as SQLite
// compares, even where the database's locale sorts by a language's rules
// (.ci/with-postgres makes its cluster so): "Zeta" before "alpha", "rig-b"
// before "rig_a" and "riga".
func TestNamesSortByteByByte(t *testing.T) {
	names := []string{"alpha", "Zeta", "riga", "rig_a", "rig-b"}
	want := slices.Clone(names)
	slices.Sort(want)
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		f := fleet.Fleet{Models: []fleet.Model{{ID: "m", Context: 4096}}}
		for _, n := range names {
			f.Nodes = append(f.Nodes, fleet.Node{Name: n, Address: "sim:" + n})
			f.Placements = append(f.Placements, fleet.Placement{Model: "m", Node: n})
		}
		if err := s.ApplyFleet(ctx, f); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if _, err := s.SaveWorker(ctx, fleet.Worker{Node: n, Model: "m", Engine: fleet.EngineSim, State: fleet.WorkerReady}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CreateAPIKey(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		ws, err := s.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := s.APIKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var gotWorkers, gotKeys []string
		for _, w := range ws {
			gotWorkers = append(gotWorkers, w.Node)
		}
		for _, k := range keys {
			gotKeys = append(gotKeys, k.Name)
		}
		if !slices.Equal(gotWorkers, want) || !slices.Equal(gotKeys, want) {
			t.Errorf("workers by node %q, keys %q; want both %q", gotWorkers, gotKeys, want)
		}
	})
}
