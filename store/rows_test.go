package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestQueryAll: the one row loop every read of the store goes through, on a
// real SQLite file: rows in order, an empty read as [] (not nil), and every
// failure (query, scan, the caller's own) wrapped in what the read is, with
// nothing returned.
func TestQueryAll(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if _, err := s.db.ExecContext(ctx, `CREATE TABLE numbers (n INTEGER, label TEXT); INSERT INTO numbers VALUES (3, 'c'), (1, 'a'), (2, 'b')`); err != nil {
			t.Fatal(err)
		}
		scanInt := func(r rowScanner) (int, error) {
			var n int
			err := r.Scan(&n)
			return n, err
		}
		var calls int
		refuseTwo := func(r rowScanner) (int, error) {
			calls++
			n, err := scanInt(r)
			if err == nil && n == 2 {
				err = errors.New("two is not allowed")
			}
			return n, err
		}
		noColumn := "read numbers: no such column: nope"
		if db.name == "postgres" {
			noColumn = `read numbers: ERROR: column "nope" does not exist`
		}
		for _, tc := range []struct {
			name, query string
			scan        func(rowScanner) (int, error)
			want        []int
			wantErr     string
			wantCalls   int
		}{
			{"rows in order", `SELECT n FROM numbers ORDER BY n`, scanInt, []int{1, 2, 3}, "", 0},
			{"no rows is an empty list", `SELECT n FROM numbers WHERE n > 9`, scanInt, []int{}, "", 0},
			{"a bad query", `SELECT nope FROM numbers`, scanInt, nil, noColumn, 0},
			{"a value that does not scan", `SELECT label FROM numbers`, scanInt, nil, "read numbers: sql: Scan error", 0},
			{"the caller's error stops the read", `SELECT n FROM numbers ORDER BY n`, refuseTwo, nil, "read numbers: two is not allowed", 2},
		} {
			t.Run(tc.name, func(t *testing.T) {
				calls = 0
				got, err := queryAll(ctx, s.db, "read numbers", tc.scan, tc.query)
				if tc.wantErr != "" {
					if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
						t.Fatalf("err = %v, want it to start with %q", err, tc.wantErr)
					}
					if got != nil {
						t.Errorf("got %v along with the error, want nothing", got)
					}
					if tc.wantCalls > 0 && calls != tc.wantCalls {
						t.Errorf("scan called %d times, want %d (no row after the failing one)", calls, tc.wantCalls)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got == nil || !reflect.DeepEqual(got, tc.want) {
					t.Errorf("got %#v, want %#v", got, tc.want)
				}
			})
		}
	})
}

// TestEachRowClosesItsRows: a read that stops half-way (the caller's error
// at the first row) or runs to the end gives its connection back: rows left
// open would hold a connection each until the garbage collector ran.
func TestEachRowClosesItsRows(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if _, err := s.db.ExecContext(ctx, `CREATE TABLE numbers (n INTEGER); INSERT INTO numbers VALUES (1), (2), (3)`); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			read func(rowScanner) error
		}{
			{"stopped at the first row", func(rowScanner) error { return errors.New("stop") }},
			{"read to the end", func(r rowScanner) error { var n int; return r.Scan(&n) }},
		} {
			for range 3 {
				_ = eachRow(ctx, s.db, "read numbers", tc.read, `SELECT n FROM numbers`)
			}
			if n := s.db.db.Stats().InUse; n != 0 {
				t.Errorf("%s: %d connections still in use after the reads returned", tc.name, n)
			}
		}
	})
}

// TestStoredJSONErrorsSayWhich: a row the store cannot decode is named in
// the error, under the read it failed.
func TestStoredJSONErrorsSayWhich(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		id := fleetA().Models[0].ID
		if _, err := s.db.ExecContext(ctx, `UPDATE models SET aliases = '{broken' WHERE id = ?`, id); err != nil {
			t.Fatal(err)
		}
		_, err := s.LoadFleet(ctx)
		want := fmt.Sprintf("read models: model %s: stored aliases are not valid JSON", id)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("LoadFleet = %v, want an error saying %q", err, want)
		}
	})
}
