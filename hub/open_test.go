package hub

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fleet"
	"fleet/internal/pgtest"
	"fleet/nodes"
	"fleet/store"
)

// TestOpenRefusesAnOpenRouter: a router reachable from the network with no
// API key to check would be a free inference endpoint on the LAN, so Open
// refuses it and says how to get a key.
func TestOpenRefusesAnOpenRouter(t *testing.T) {
	tests := []struct {
		name        string
		addr        string
		requireKeys bool
		// keys is the API keys the data dir already holds: "live" or "revoked".
		keys    []string
		refused bool
	}{
		{name: "all interfaces without a key", addr: "0.0.0.0:0", refused: true},
		{name: "a LAN name without a key", addr: "hub.example:8080", refused: true},
		{name: "loopback with RequireKeys without a key", addr: "127.0.0.1:0", requireKeys: true, refused: true},
		{name: "all interfaces with only a revoked key", addr: "0.0.0.0:0", keys: []string{"revoked"}, refused: true},
		{name: "all interfaces with a live key", addr: "0.0.0.0:0", keys: []string{"revoked", "live"}},
		{name: "loopback with RequireKeys and a live key", addr: "127.0.0.1:0", requireKeys: true, keys: []string{"live"}},
		{name: "loopback without a key", addr: "127.0.0.1:0"},
		{name: "IPv6 loopback without a key", addr: "[::1]:0"},
		{name: "localhost without a key", addr: "localhost:0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if len(tt.keys) > 0 {
				// Keys are made the only way there is: on a loopback hub.
				h, err := openHub(t, Options{DataDir: dir})
				if err != nil {
					t.Fatal(err)
				}
				for i, k := range tt.keys {
					name := "client" + string(rune('a'+i))
					if _, err := h.admin.CreateKey(t.Context(), admin, name); err != nil {
						t.Fatal(err)
					}
					if k == "revoked" {
						if err := h.admin.RevokeKey(t.Context(), admin, name); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := h.Close(); err != nil {
					t.Fatal(err)
				}
			}

			cmdline := []string{"serve", "--http", tt.addr, "--demo"}
			if tt.requireKeys {
				cmdline = append(cmdline, "--require-keys")
			}
			h, err := openHub(t, Options{DataDir: dir, HTTPAddr: tt.addr, RequireKeys: tt.requireKeys, Demo: true, CommandLine: cmdline})
			if err == nil {
				t.Cleanup(func() { h.Close() })
			}
			if !tt.refused {
				if err != nil {
					t.Fatalf("Open on %s: %v", tt.addr, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Open on %s with keys %v succeeded; want a refusal", tt.addr, tt.keys)
			}
			// A hub that will not start leaves the stored fleet as it was:
			// the demo it was asked to apply is not there.
			again, err2 := openHub(t, Options{DataDir: dir})
			if err2 != nil {
				t.Fatal(err2)
			}
			t.Cleanup(func() { again.Close() })
			if f, err2 := again.store.LoadFleet(t.Context()); err2 != nil || len(f.Nodes) != 0 {
				t.Errorf("after the refused start the store holds %d nodes (%v), want none", len(f.Nodes), err2)
			}
			// The error must say what is wrong and what to type next: the
			// flag that asked for keys, how to make one without a hub, and
			// the command line as it was given, not another port or flag.
			why := "--http " + tt.addr + " is off loopback"
			if tt.requireKeys {
				why = "--require-keys"
			}
			for _, want := range []string{tt.addr, "none exists", why, "fleet key create NAME --data " + dir,
				"then run again: fleet " + strings.Join(cmdline, " ")} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Open on %s: %q does not say %q", tt.addr, err, want)
				}
			}
			if !strings.Contains(tt.addr, "8080") && strings.Contains(err.Error(), "8080") {
				t.Errorf("Open on %s: %q suggests a port that was not given", tt.addr, err)
			}
		})
	}
}

// TestFirstKeyWithoutAHub: a hub that requires keys does not start without
// one, so the first is written into the data dir's database with no hub
// running (issue 21.10, which took three restarts before); it is refused
// while a hub holds the data dir, whose control socket is the way then, and
// it is audited as the local admin's.
func TestFirstKeyWithoutAHub(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, HTTPAddr: "127.0.0.1:0", RequireKeys: true}
	if h, err := openHub(t, opts); err == nil {
		h.Close()
		t.Fatal("a hub requiring keys started without one")
	}
	var warn strings.Builder
	key, err := CreateKeyWithoutHub(t.Context(), dir, "", "ci", &warn)
	if err != nil || !strings.HasPrefix(key, store.APIKeyPrefix) || warn.Len() != 0 {
		t.Fatalf("the first key without a hub: %q, %v (%s)", key, err, warn.String())
	}
	h, err := openHub(t, opts)
	if err != nil {
		t.Fatalf("the hub with its first key: %v", err)
	}
	defer h.Close()
	if name, ok, err := h.ledger.keys.VerifyAPIKey(t.Context(), key); err != nil || !ok || name != "ci" {
		t.Errorf("the key made without a hub: %q %v %v; want it to verify as ci", name, ok, err)
	}
	es, err := h.store.Audit(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range es {
		found = found || e.Action == "key create" && e.Target == "ci" && e.User == LocalAdmin().Name && strings.HasPrefix(e.Outcome, "ok")
	}
	if !found {
		t.Errorf("audit = %+v, want the local admin's key create ci, ok", es)
	}
	// With the hub holding the data dir, nothing is written behind its back.
	if _, err := CreateKeyWithoutHub(t.Context(), dir, "", "other", &warn); err == nil || !strings.Contains(err.Error(), "holds data dir") {
		t.Fatalf("a key made beside a running hub: %v; want it refused", err)
	}
	keys, err := h.store.APIKeys(t.Context())
	if err != nil || len(keys) != 1 {
		t.Errorf("keys after the refusal: %+v, %v; want ci alone", keys, err)
	}
}

// TestFirstKeyWithoutAHubOnPostgreSQL: with the state in PostgreSQL, the
// first key made without a hub goes into that database (where a hub
// started with the same URL finds it), not into a SQLite file in the data
// dir no such hub reads; while a hub runs on the database, even from
// another data dir, nothing is written behind its back.
func TestFirstKeyWithoutAHubOnPostgreSQL(t *testing.T) {
	const password = "s3cret-pw" // the test cluster trusts its socket: any password goes
	url := pgtest.URLWithPassword(t, password)
	dir := t.TempDir()
	// The refusal says how to make the key for this database, and does not
	// repeat the password of the command line it quotes.
	_, err := openHub(t, Options{DataDir: dir, DatabaseURL: url, HTTPAddr: "127.0.0.1:0", RequireKeys: true,
		CommandLine: []string{"serve", "--require-keys", "--database-url", url}})
	if err == nil || !strings.Contains(err.Error(), "FLEET_DATABASE_URL=URL fleet key create NAME --data") || strings.Contains(err.Error(), password) {
		t.Fatalf("a hub requiring keys on a database without one: %v; want told to make one with FLEET_DATABASE_URL, without the password", err)
	}
	var warn strings.Builder
	key, err := CreateKeyWithoutHub(t.Context(), dir, url, "ci", &warn)
	if err != nil || !strings.HasPrefix(key, store.APIKeyPrefix) || warn.Len() != 0 {
		t.Fatalf("the first key without a hub: %q, %v (%s)", key, err, warn.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "fleet.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the key went to a SQLite database in the data dir: %v", err)
	}
	h, err := openHub(t, Options{DataDir: dir, DatabaseURL: url, HTTPAddr: "127.0.0.1:0", RequireKeys: true})
	if err != nil {
		t.Fatalf("a hub requiring keys on the database: %v", err)
	}
	defer h.Close()
	if name, ok, err := h.ledger.keys.VerifyAPIKey(t.Context(), key); err != nil || !ok || name != "ci" {
		t.Errorf("the key made without a hub: %q %v %v; want it to verify as ci", name, ok, err)
	}
	// From a data dir of its own, so that the database's claim, not the
	// data dir's lock, is what refuses it.
	if _, err := CreateKeyWithoutHub(t.Context(), t.TempDir(), url, "other", &warn); !errors.Is(err, store.ErrOtherHub) {
		t.Fatalf("a key made while a hub runs on the database: %v; want it refused", err)
	}
}

// TestSimNodesWithoutSimProfile: a hub opened without Options.SimProfile
// (a test, a program embedding the hub; cmd/fleet always passes one)
// refuses sim nodes, and the node's reason names the option to set rather
// than only saying that no lookup is configured. With the lookup, the same
// node's profile is found.
func TestSimNodesWithoutSimProfile(t *testing.T) {
	node := fleet.Node{Name: "max", Address: "sim:m4max-llamacpp"}
	// The node manager opens a node's transport with the lookup the hub
	// gave it (nodes.Manager.transportOptions).
	_, err := nodes.Open(t.Context(), node, nodes.Options{SimPlatform: simPlatform(nil)})
	if err == nil || !strings.Contains(err.Error(), "node max: ") || !strings.Contains(err.Error(), "opened without hub.Options.SimProfile") {
		t.Fatalf("sim node opened without a lookup: %v; want a refusal that names the node and hub.Options.SimProfile", err)
	}
	if p, err := simPlatform(simProfile)("m4max-llamacpp"); err != nil || p.OS != "darwin" {
		t.Errorf("with the lookup: platform %+v, %v; want the profile's (darwin)", p, err)
	}
}
