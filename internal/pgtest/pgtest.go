// Package pgtest hands tests an empty PostgreSQL database of their own. It
// is imported only by _test.go files (store, cmd/fleet); product code must
// not use it.
//
// URL's server is a real PostgreSQL cluster that .ci/with-postgres starts
// (initdb into a temp dir, on a unix socket there) and names in
// $FLEET_TEST_DATABASE_URL, shared by every test of a run. A test that
// must stop and start its database (hubs living through an outage) starts
// a cluster of its own from the same binaries with StartCluster. Nothing is
// downloaded. Without PostgreSQL a test is skipped with a message saying
// how to run it, except in CI (CI=true), where it fails: CI must test both
// dialects.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// EnvURL names the cluster's database URL.
const EnvURL = "FLEET_TEST_DATABASE_URL"

// URL returns the URL of a new, empty schema in the test cluster's
// database, as the only schema fleet's connections see (search_path), and
// drops it with everything in it when the test ends. Every call is a
// separate, empty database as far as fleet can tell; several URLs of one
// test are several databases.
func URL(t testing.TB) string {
	t.Helper()
	base := os.Getenv(EnvURL)
	if base == "" {
		missing(t, "no PostgreSQL to test on: $"+EnvURL+" is not set; run the tests under .ci/with-postgres (e.g. `.ci/with-postgres go test ./store`), which starts a throwaway cluster")
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("$%s is not a URL: %v", EnvURL, err)
	}
	ctx := context.Background()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("open $%s: %v", EnvURL, err)
	}
	defer admin.Close()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	// A schema rather than a database: created in a millisecond, where
	// CREATE DATABASE copies a template on a machine the tests share.
	schema := "fleet_test_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatalf("create a schema in the test cluster at $%s: %v (is .ci/with-postgres's cluster still running?)", EnvURL, err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("pgx", base)
		if err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
			return
		}
		defer admin.Close()
		if _, err := admin.ExecContext(context.Background(), `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// URLWithPassword is URL with user fleet and password in it: the test
// cluster trusts its socket and ignores the password, so a test can plant
// one and check that no output shows it.
func URLWithPassword(t testing.TB, password string) string {
	t.Helper()
	u, err := url.Parse(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("fleet", password)
	return u.String()
}
