package hub

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"fleet/internal/pgtest"
	"fleet/store"
)

// TestSecondHubIsRefusedBeforeTouchingTheStore: a hub asked to apply the
// demo on a data dir another hub holds must be refused before it writes the
// demo over that hub's fleet.
func TestSecondHubIsRefusedBeforeTouchingTheStore(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, withoutMax(t), 0o600); err != nil {
		t.Fatal(err)
	}
	first, err := openHub(t, Options{DataDir: dir, FleetFile: file})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	before, err := first.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	audits := lastAuditID(t, first)

	second, err := openHub(t, Options{DataDir: dir, Demo: true})
	if err == nil {
		second.Close()
		t.Fatal("a second hub opened the data dir of a running one")
	}
	for _, want := range []string{"another hub", "pid", dir, "--data"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	after, err := first.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the refused hub rewrote the stored fleet:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := auditSince(t, first, audits); len(got) != 0 {
		t.Errorf("the refused hub left audit lines: %+v", got)
	}

	// Once the first hub is gone, the dir is free again.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := openHub(t, Options{DataDir: dir})
	if err != nil {
		t.Fatalf("after the first hub closed: %v", err)
	}
	again.Close()
}

// TestEmptyDatabaseFileIsSaidToBeInitialised: a zero-length fleet.db is
// what a lost database can leave; the hub starts, and says what it did.
func TestEmptyDatabaseFileIsSaidToBeInitialised(t *testing.T) {
	for _, tt := range []struct {
		name  string
		empty bool
	}{{"zero-length file", true}, {"no file", false}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.empty {
				if err := os.WriteFile(filepath.Join(dir, "fleet.db"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			h, err := openHub(t, Options{DataDir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			h.Close()
			said := strings.Contains(logs.String(), "database file was empty (0 bytes): initialised")
			if said != tt.empty {
				t.Errorf("logged the empty-database line: %v, want %v; logs:\n%s", said, tt.empty, logs.String())
			}
		})
	}
}

// TestUnknownPolicyChangesNothing: a mistyped --policy is refused by the
// router's constructor before the fleet file is applied, so the store is
// left as it was.
func TestUnknownPolicyChangesNothing(t *testing.T) {
	dir := t.TempDir()
	h, err := openHub(t, Options{DataDir: dir, Demo: true, Policy: "fastest"})
	if err == nil {
		h.Close()
		t.Fatal("a hub opened with the unknown policy \"fastest\"")
	}
	for _, want := range []string{"--policy", `"fastest"`, "round-robin"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	again, err := openHub(t, Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if nodes, err := again.store.Nodes(t.Context()); err != nil || len(nodes) != 0 {
		t.Errorf("the refused hub stored nodes %v (err %v); want none", nodes, err)
	}
}

// A disk that fills up while the hub copies itself to DATA/bin/fleet leaves
// no half-written DATA/bin/fleet.new behind: the failed start says why and
// takes its partial copy with it. /dev/full answers every write with ENOSPC,
// as a full disk does.
func TestInstallSelfOnAFullDiskLeavesNoPartialCopy(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system to stand in for a full disk")
	}
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "bin"), 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(data, "bin", "fleet.new")
	if err := os.Symlink("/dev/full", tmp); err != nil {
		t.Fatal(err)
	}
	_, err := installSelf(data)
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("installSelf on a full disk: %v, want an ENOSPC error", err)
	}
	if _, serr := os.Lstat(tmp); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("after the failed install %s is still there (%v)", tmp, serr)
	}
	if _, serr := os.Lstat(filepath.Join(data, "bin", "fleet")); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("a failed install left bin/fleet (%v)", serr)
	}
}

// TestBadDatabaseURLIsRefusedWithoutItsPassword: a --database-url that is
// not a PostgreSQL URL, is malformed, or names a server nobody answers at
// fails the hub's start with what to do, never shows the password, and
// leaves no SQLite database behind in its place.
func TestBadDatabaseURLIsRefusedWithoutItsPassword(t *testing.T) {
	const password = "s3cret-pw"
	for _, tc := range []struct {
		name, url string
		want      []string
	}{
		{"not PostgreSQL", "mysql://fleet:" + password + "@db.lab/fleet",
			[]string{"is not a PostgreSQL URL", "give one like postgres://"}},
		{"malformed port", "postgres://fleet:" + password + "@db.lab:notaport/fleet",
			[]string{"the URL is malformed", "give one like postgres://"}},
		{"password in an option", "postgres://fleet@db.lab:notaport/fleet?password=" + password,
			[]string{"the URL is malformed"}},
		// Port 1 on loopback: nothing listens, the connection is refused
		// at once.
		{"unreachable", "postgres://fleet:" + password + "@127.0.0.1:1/fleet",
			[]string{"cannot reach the PostgreSQL server at 127.0.0.1:1", `user "fleet"`, "check that the server runs", "leave --database-url and $FLEET_DATABASE_URL unset"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var logs bytes.Buffer
			_, err := openHub(t, Options{DataDir: dir, DatabaseURL: tc.url, Demo: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err == nil {
				t.Fatal("the hub started")
			}
			t.Logf("refused: %v", err)
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error()+logs.String(), password) {
				t.Errorf("the password shows:\nerror: %v\nlogs: %s", err, logs.String())
			}
			if _, err := os.Stat(filepath.Join(dir, "fleet.db")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a SQLite database was made in the data dir: %v", err)
			}
		})
	}
}

// TestHubStateInPostgreSQL: with a database URL the fleet lives in
// PostgreSQL (the next hub on the same database finds the demo there), the
// data dir holds no SQLite database, and the URL's password is in no log
// line nor in status. While a hub runs, a second one with its name, from
// another data dir, is refused before it changes anything; with a name of
// its own it joins the fleet as a follower of the first. Every hub's data
// dir is the fleet's: none is refused as a copy.
func TestHubStateInPostgreSQL(t *testing.T) {
	const password = "s3cret-pw" // the test cluster trusts its socket: any password goes
	dbURL := pgtest.URLWithPassword(t, password)
	dir := t.TempDir()
	var logs bytes.Buffer
	h, err := openHub(t, Options{DataDir: dir, DatabaseURL: dbURL, Demo: true, HubName: "first", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if _, err := openHub(t, Options{DataDir: other, DatabaseURL: dbURL, HubName: "first", FleetFile: "/nonexistent"}); !errors.Is(err, store.ErrHubNameTaken) ||
		!strings.Contains(err.Error(), "give this hub another --hub-name") {
		t.Errorf("a second hub named first on the database: %v, want it refused for its name", err)
	}
	second, err := openHub(t, Options{DataDir: other, DatabaseURL: dbURL, HubName: "second", Demo: true})
	if err != nil {
		t.Fatalf("a second hub with a name of its own, the same demo: %v", err)
	}
	st2, err := second.Status(t.Context(), LocalAdmin())
	if err != nil || st2.Hub != "second" || st2.HubRole != RoleFollower || st2.Leader != "first" || len(st2.Hubs) != 2 {
		t.Errorf("the second hub's status: %+v, %v; want a follower of first, two hubs", st2, err)
	}
	second.Close()
	st, err := h.Status(t.Context(), LocalAdmin())
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	if st.Database == "" || strings.Contains(st.Database, password) || !strings.HasPrefix(st.Database, "postgres://") {
		t.Errorf("status names the database %q, want its URL without the password", st.Database)
	}
	if !strings.Contains(logs.String(), "state in PostgreSQL; the data dir keeps") || strings.Contains(logs.String(), password) {
		t.Errorf("logs do not say where the state is, or show the password:\n%s", logs.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "fleet.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a SQLite database was made in the data dir: %v", err)
	}
	// The fleet's home can still be moved (fleet-id --move, with the
	// database's URL) once no hub runs; then the fleet is there.
	moved := t.TempDir()
	out, err := Identity(t.Context(), moved, dbURL, false, true, false)
	if err != nil || !strings.Contains(out, "moved here from "+dir) {
		t.Fatalf("fleet-id --move on PostgreSQL: %q, %v", out, err)
	}
	h2, err := openHub(t, Options{DataDir: moved, DatabaseURL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	f, err := h2.store.LoadFleet(t.Context())
	if err != nil || len(f.Nodes) != 3 {
		t.Fatalf("the next hub on the database finds %d nodes (%v), want the demo's 3", len(f.Nodes), err)
	}
	if _, err := Identity(t.Context(), t.TempDir(), dbURL, false, true, false); !errors.Is(err, store.ErrOtherHub) {
		t.Errorf("fleet-id --move while a hub runs on the database: %v; want it refused", err)
	}
}
