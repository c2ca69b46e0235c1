package pgtest

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"fleet/internal/netnstest"
)

// TestClusterStopsAndStartsWithItsData: a private cluster answers on its
// socket, also from another network namespace; stopped, it refuses
// connections; started again, it has the rows written before; after the
// test its directory is gone.
func TestClusterStopsAndStartsWithItsData(t *testing.T) {
	var dir string
	t.Run("cluster", func(t *testing.T) {
		c := StartCluster(t)
		dir = c.dir
		if !strings.Contains(c.URL(), "host="+c.dir) {
			t.Fatalf("URL %s does not name the socket's dir %s", c.URL(), c.dir)
		}
		db, err := sql.Open("pgx", c.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before the stop')`); err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 {
			ns := netnstest.New(t)
			if err := ns.Do(func() error { return ping(c.URL()) }); err != nil {
				t.Errorf("the cluster is not reachable from %s: %v", ns, err)
			}
		}

		c.Stop()
		if err := ping(c.URL()); err == nil {
			t.Fatal("the cluster answers after Stop")
		}
		c.Start()
		var v string
		if err := db.QueryRowContext(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != "before the stop" {
			t.Fatalf("after Stop and Start: %q, %v; want the row written before", v, err)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's dir %s outlived its test: %v", dir, err)
	}
}

func ping(url string) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}
