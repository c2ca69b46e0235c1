package store

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"fleet"
	"fleet/fleetfile"
)

// fleetA and fleetB differ in every table ApplyFleet touches, so a mix of
// the two is always distinguishable from either.
func fleetA() fleet.Fleet {
	return fleet.Fleet{
		Nodes: []fleet.Node{
			{Name: "rig", Address: "sim:rtx3060-vllm"},
			{Name: "ultra", Address: "ops@ultra.lan:22", Identity: "~/.ssh/id_ed25519", Endpoint: "tunnel"},
		},
		Models: []fleet.Model{{
			ID: "qwen3-4b", Aliases: []string{"qwen3"}, Context: 16384, MemoryGB: 3,
			Recipes: map[fleet.EngineKind]fleet.Recipe{
				fleet.EngineVLLM:     {Engine: fleet.EngineVLLM, Model: "Qwen/Qwen3-4B-AWQ", Args: []string{"--tensor-parallel-size", "1"}},
				fleet.EngineLlamaCpp: {Engine: fleet.EngineLlamaCpp, Model: "Qwen3-4B-Q4_K_M.gguf", Args: []string{"-ngl", "99"}, Env: map[string]string{"A": "1"}},
			},
		}},
		Placements: []fleet.Placement{{Model: "qwen3-4b", Node: "rig"}, {Model: "qwen3-4b", Node: "ultra"}},
	}
}

func fleetB() fleet.Fleet {
	return fleet.Fleet{
		Nodes: []fleet.Node{
			{Name: "max", Address: "sim:m4max-llamacpp"},
			{Name: "ultra", Address: "ops@ultra.lan:22", Endpoint: "direct", Ports: fleet.PortRange{Min: 20000, Max: 20099}},
		},
		Models: []fleet.Model{
			{ID: "qwen3-4b", Context: 8192, SpeedTolerance: 0.7, Reasoning: "inline", Reference: "ultra",
				Recipes: map[fleet.EngineKind]fleet.Recipe{
					fleet.EngineLlamaCpp: {Engine: fleet.EngineLlamaCpp, Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M", Bin: "/opt/homebrew/bin/llama-server", ReadyTimeout: 45 * time.Minute},
				}},
			{ID: "gemma", Context: 4096, Recipes: map[fleet.EngineKind]fleet.Recipe{
				fleet.EngineSim: {Engine: fleet.EngineSim, Profile: "m4max-llamacpp"},
			}},
		},
		Placements: []fleet.Placement{
			{Model: "qwen3-4b", Node: "ultra", Engine: fleet.EngineLlamaCpp},
			{Model: "gemma", Node: "max", Context: 2048},
		},
	}
}

// declared strips the runtime columns so a loaded fleet compares with the
// one that was applied.
func declared(f fleet.Fleet) fleet.Fleet {
	out := fleet.Fleet{Models: f.Models, Placements: f.Placements}
	for _, n := range f.Nodes {
		out.Nodes = append(out.Nodes, fleet.Node{Name: n.Name, Address: n.Address, Identity: n.Identity, Endpoint: n.Endpoint, Ports: n.Ports})
	}
	return out
}

func TestOpenCreatesDirectoryAndMigratesOnce(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		for range 2 {
			s, err := db.open(ctx)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			var n, v int
			if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*), MAX(version) FROM schema_migrations`).Scan(&n, &v); err != nil {
				t.Fatal(err)
			}
			if n != len(migrations) || v != SchemaVersion() {
				t.Fatalf("schema_migrations has %d rows up to %d, want %d up to %d", n, v, len(migrations), SchemaVersion())
			}
			if db.name == "sqlite" {
				var mode string
				if err := s.db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
					t.Fatalf("journal_mode = %q (%v), want wal", mode, err)
				}
				var fk int
				if err := s.db.QueryRowContext(ctx, `PRAGMA foreign_keys`).Scan(&fk); err != nil || fk != 1 {
					t.Fatalf("foreign_keys = %d (%v), want 1", fk, err)
				}
			}
			s.Close()
		}
	})
}

// TestOpenMigratesOnceWhenHubsStartTogether: hubs started at once on one
// empty database each find the schema whole, none fails on a table or a
// version row another one created meanwhile.
func TestOpenMigratesOnceWhenHubsStartTogether(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		errs := make(chan error, 4)
		for range cap(errs) {
			go func() {
				s, err := db.open(ctx)
				if err == nil {
					s.Close()
				}
				errs <- err
			}()
		}
		for range cap(errs) {
			if err := <-errs; err != nil {
				t.Errorf("Open alongside other hubs: %v", err)
			}
		}
		s := db.openTest(t)
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != SchemaVersion() {
			t.Fatalf("schema_migrations has %d rows (%v), want %d", n, err, SchemaVersion())
		}
	})
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s, err := db.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.db.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`, SchemaVersion()+6); err != nil {
			t.Fatal(err)
		}
		s.Close()
		_, err = db.open(ctx)
		if !errors.Is(err, ErrSchemaTooNew) {
			t.Fatalf("Open of a newer database: err = %v, want ErrSchemaTooNew", err)
		}
		elsewhere := "upgrade fleet or point --data at another directory"
		if db.name == "postgres" {
			elsewhere = "upgrade fleet or point --database-url at another database"
		}
		for _, want := range []string{fmt.Sprintf("database schema version %d is newer than this fleet binary supports (%d)", SchemaVersion()+6, SchemaVersion()), elsewhere} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	})
}

func TestOpenBadPath(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"empty", "", "no path given"},
		{"question mark", filepath.Join(dir, "a?b.db"), "contains '?'"},
		{"parent is a file", filepath.Join(notDir, "fleet.db"), "create directory"},
		{"not sqlite", garbage, "garbage.db"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(context.Background(), tc.path)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) succeeded", tc.path)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open(%q) = %v, want it to mention %q", tc.path, err, tc.want)
			}
		})
	}
}

func TestApplyAndLoadFleet(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		empty, err := s.LoadFleet(ctx)
		if err != nil || len(empty.Nodes)+len(empty.Models)+len(empty.Placements) != 0 {
			t.Fatalf("fresh LoadFleet = %+v, %v", empty, err)
		}
		for _, f := range []fleet.Fleet{fleetA(), fleetB(), fleetA()} {
			if err := s.ApplyFleet(ctx, f); err != nil {
				t.Fatalf("ApplyFleet: %v", err)
			}
			got, err := s.LoadFleet(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(declared(got), f) {
				t.Fatalf("LoadFleet after apply:\n got %+v\nwant %+v", declared(got), f)
			}
		}
	})
}

func TestApplyFleetKeepsRuntimeOfStayingNodes(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		probed := time.Date(2026, 11, 1, 12, 0, 0, 5, time.UTC)
		plat := fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra", MemTotalBytes: 64 << 30}
		for _, n := range []string{"rig", "ultra"} {
			if err := s.SetNodeProbe(ctx, n, plat, probed); err != nil {
				t.Fatal(err)
			}
			if err := s.SetNodeHostKey(ctx, n, "ssh-ed25519 AAAA"+n); err != nil {
				t.Fatal(err)
			}
			if err := s.SetNodeState(ctx, n, fleet.NodeUp, ""); err != nil {
				t.Fatal(err)
			}
			if err := s.SetNodeDrained(ctx, n, true); err != nil {
				t.Fatal(err)
			}
		}
		// ultra stays at the same address; rig moves to a new one.
		f := fleetA()
		f.Nodes[0].Address = "ops@rig.lan"
		f.Nodes[1].Identity = ""
		if err := s.ApplyFleet(ctx, f); err != nil {
			t.Fatal(err)
		}
		ultra, err := s.Node(ctx, "ultra")
		if err != nil {
			t.Fatal(err)
		}
		want := fleet.Node{Name: "ultra", Address: "ops@ultra.lan:22", Endpoint: "tunnel", HostKey: "ssh-ed25519 AAAAultra",
			Platform: &plat, ProbedAt: probed, State: fleet.NodeUp, Drained: true}
		if !reflect.DeepEqual(ultra, want) {
			t.Errorf("staying node:\n got %+v\nwant %+v", ultra, want)
		}
		rig, err := s.Node(ctx, "rig")
		if err != nil {
			t.Fatal(err)
		}
		want = fleet.Node{Name: "rig", Address: "ops@rig.lan", State: fleet.NodeUnknown, Drained: true}
		if !reflect.DeepEqual(rig, want) {
			t.Errorf("moved node:\n got %+v\nwant %+v", rig, want)
		}
	})
}

func TestApplyFleetDeletesWorkersWithoutPlacement(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"rig", "ultra"} {
			if _, err := s.SaveWorker(ctx, fleet.Worker{Node: n, Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.ApplyFleet(ctx, fleetB()); err != nil {
			t.Fatal(err)
		}
		ws, err := s.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) != 1 || ws[0].Name() != "ultra/qwen3-4b" {
			t.Fatalf("workers after apply = %+v, want only ultra/qwen3-4b (rig left the fleet)", ws)
		}
	})
}

func TestApplyFleetRefusesBadFleetAndChangesNothing(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		before, err := s.LoadFleet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name   string
			mutate func(*fleet.Fleet)
			want   string
		}{
			{"unknown node", func(f *fleet.Fleet) { f.Placements[0].Node = "nope" }, "names node nope"},
			{"unknown model", func(f *fleet.Fleet) { f.Placements[0].Model = "nope" }, "names model nope"},
			{"duplicate node", func(f *fleet.Fleet) { f.Nodes[0].Name = "ultra" }, "node ultra is declared twice"},
			{"duplicate placement", func(f *fleet.Fleet) { f.Placements[1] = f.Placements[0] }, "placed twice on node ultra"},
			{"zero context", func(f *fleet.Fleet) { f.Models[0].Context = 0 }, "context must be a positive"},
			{"no address", func(f *fleet.Fleet) { f.Nodes[0].Address = "" }, "node max has no address"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := fleetB()
				tc.mutate(&f)
				err := s.ApplyFleet(ctx, f)
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing was changed") {
					t.Fatalf("ApplyFleet = %v, want an error saying %q and that nothing changed", err, tc.want)
				}
				after, err := s.LoadFleet(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(after, before) {
					t.Fatalf("a refused apply changed the fleet:\n got %+v\nwant %+v", after, before)
				}
			})
		}
	})
}

func TestUnknownNamesAreNotFound(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			call func() error
			want string
		}{
			{"Node", func() error { _, err := s.Node(ctx, "ghost"); return err }, `node "ghost"`},
			{"SetNodeProbe", func() error { return s.SetNodeProbe(ctx, "ghost", fleet.Platform{}, time.Now()) }, `node "ghost"`},
			{"SetNodeState", func() error { return s.SetNodeState(ctx, "ghost", fleet.NodeUp, "") }, `node "ghost"`},
			{"SetNodeHostKey", func() error { return s.SetNodeHostKey(ctx, "ghost", "k") }, `node "ghost"`},
			{"SetNodeDrained", func() error { return s.SetNodeDrained(ctx, "ghost", true) }, `node "ghost"`},
			{"Worker", func() error { _, err := s.Worker(ctx, "rig", "ghost"); return err }, "rig/ghost"},
			{"DeleteWorker", func() error { return s.DeleteWorker(ctx, "rig", "qwen3-4b") }, "rig/qwen3-4b"},
			{"SaveWorker unknown node", func() error {
				_, err := s.SaveWorker(ctx, fleet.Worker{Node: "ghost", Model: "qwen3-4b", State: fleet.WorkerPending})
				return err
			}, `node "ghost"`},
			{"RemoveUser", func() error { return s.RemoveUser(ctx, "ghost") }, "user ghost"},
			{"SetUserTheme", func() error { return s.SetUserTheme(ctx, "ghost", "dark") }, "user ghost"},
			{"UserByFingerprint", func() error { _, err := s.UserByFingerprint(ctx, "SHA256:x"); return err }, "SHA256:x"},
			{"RevokeAPIKey", func() error { return s.RevokeAPIKey(ctx, "ghost") }, "API key ghost"},
			{"Reference", func() error { _, err := s.Reference(ctx, "qwen3-4b"); return err }, `model "qwen3-4b"`},
			{"SetReference", func() error { return s.SetReference(ctx, "ghost", Reference{Shape: []byte(`{}`)}) }, `model "ghost"`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.call()
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("err = %v, want ErrNotFound", err)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want it to name %s", err, tc.want)
				}
			})
		}
		if err := s.SetNodeState(ctx, "rig", "sleepy", ""); err == nil || !strings.Contains(err.Error(), `"sleepy" is not a node state`) {
			t.Fatalf("SetNodeState with a bad state = %v", err)
		}
	})
}

func TestSaveWorkerUpserts(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		started := time.Date(2026, 11, 2, 8, 0, 0, 123, time.UTC)
		w := fleet.Worker{
			Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerStarting,
			Port: 8081, PID: 4242, PGID: 4242, Argv: []string{"llama-server", "-m", "x.gguf"},
			LaunchArgv: []string{"fleet", "sim", "--mimic", "llamacpp"}, Simulated: true, StartedAt: started,
			Context: 16384, Slots: 4, EngineVersion: "b6000", Restarts: 2,
			// An engine on two of the node's GPUs: a hub restarted adopts it with them.
			GPUs: []int{2, 3},
		}
		first, err := s.SaveWorker(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		if first.ID == 0 {
			t.Fatal("SaveWorker returned no ID")
		}
		w.ID = first.ID
		if !reflect.DeepEqual(first, w) {
			t.Fatalf("saved worker:\n got %+v\nwant %+v", first, w)
		}
		// Its engine stopped: its GPUs are free.
		w.State, w.Reason, w.Drained, w.ID, w.GPUs = fleet.WorkerFailed, "exit status 1", true, 999, nil
		second, err := s.SaveWorker(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		if second.ID != first.ID || second.State != fleet.WorkerFailed || second.Reason != "exit status 1" || !second.Drained || second.GPUs != nil {
			t.Fatalf("upsert = %+v, want the same ID %d with the new state", second, first.ID)
		}
		got, err := s.Worker(ctx, "ultra", "qwen3-4b")
		if err != nil || !reflect.DeepEqual(got, second) {
			t.Fatalf("Worker = %+v, %v; want %+v", got, err, second)
		}
		if err := s.DeleteWorker(ctx, "ultra", "qwen3-4b"); err != nil {
			t.Fatal(err)
		}
		if ws, err := s.Workers(ctx); err != nil || len(ws) != 0 {
			t.Fatalf("Workers after delete = %+v, %v", ws, err)
		}
		if _, err := s.SaveWorker(ctx, fleet.Worker{Model: "qwen3-4b"}); err == nil {
			t.Fatal("SaveWorker without a node succeeded")
		}
	})
}

func TestSamples(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		t0 := time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
		var batch []fleet.Sample
		for i := range 10 {
			batch = append(batch, fleet.Sample{Worker: "rig/qwen3-4b", At: t0.Add(time.Duration(i) * time.Minute), Kind: "request",
				TTFT: time.Duration(i) * time.Millisecond, ITL: 11 * time.Millisecond, E2E: time.Second, OutputTokens: 256, TokPerSec: 80.5})
		}
		batch = append(batch, fleet.Sample{Worker: "max/qwen3-4b", At: t0, Kind: "bench", Detail: "c=4"})
		if err := s.AddSamples(ctx, batch); err != nil {
			t.Fatal(err)
		}
		if err := s.AddSamples(ctx, []fleet.Sample{{Worker: "x", At: t0}, {Worker: ""}}); err == nil {
			t.Fatal("AddSamples accepted a sample without a worker")
		}
		for _, tc := range []struct {
			name      string
			worker    string
			since     time.Time
			limit     int
			wantTTFTs []time.Duration
			wantLen   int
		}{
			{"newest three, oldest first", "rig/qwen3-4b", time.Time{}, 3, []time.Duration{7e6, 8e6, 9e6}, 3},
			{"since", "rig/qwen3-4b", t0.Add(8 * time.Minute), 0, []time.Duration{8e6, 9e6}, 2},
			{"all workers", "", time.Time{}, 0, nil, 11},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.Samples(ctx, tc.worker, tc.since, tc.limit)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != tc.wantLen {
					t.Fatalf("got %d samples, want %d", len(got), tc.wantLen)
				}
				for i, want := range tc.wantTTFTs {
					if got[i].TTFT != want {
						t.Errorf("sample %d TTFT = %v, want %v", i, got[i].TTFT, want)
					}
				}
			})
		}
		got, _ := s.Samples(ctx, "rig/qwen3-4b", time.Time{}, 1)
		want := batch[9]
		if !reflect.DeepEqual(got[0], want) {
			t.Fatalf("sample round trip:\n got %+v\nwant %+v", got[0], want)
		}
	})
}

func TestEvents(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		t0 := time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
		var ids []int64
		for i, subj := range []string{"ultra", "ultra/qwen3-4b", "ultra_2", "rig/qwen3-4b", "ultra/gemma"} {
			e, err := s.AddEvent(ctx, fleet.Event{At: t0.Add(time.Duration(i) * time.Second), Subject: subj, Message: "m " + subj})
			if err != nil {
				t.Fatal(err)
			}
			if e.Level != "info" || e.ID == 0 {
				t.Fatalf("AddEvent = %+v, want an ID and level info", e)
			}
			ids = append(ids, e.ID)
		}
		if _, err := s.AddEvent(ctx, fleet.Event{Message: "no subject"}); err == nil {
			t.Fatal("AddEvent without a subject succeeded")
		}
		subjects := func(es []fleet.Event) []string {
			var out []string
			for _, e := range es {
				out = append(out, e.Subject)
			}
			return out
		}
		for _, tc := range []struct {
			name    string
			subject string
			after   int64
			limit   int
			want    []string
		}{
			{"all", "", 0, 0, []string{"ultra", "ultra/qwen3-4b", "ultra_2", "rig/qwen3-4b", "ultra/gemma"}},
			{"node includes its workers", "ultra", 0, 0, []string{"ultra", "ultra/qwen3-4b", "ultra/gemma"}},
			{"worker only", "ultra/qwen3-4b", 0, 0, []string{"ultra/qwen3-4b"}},
			{"newest two", "", 0, 2, []string{"rig/qwen3-4b", "ultra/gemma"}},
			{"after an id", "ultra", ids[1], 0, []string{"ultra/gemma"}},
			{"nothing", "nobody", 0, 0, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.Events(ctx, tc.subject, tc.after, tc.limit)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(subjects(got), tc.want) {
					t.Fatalf("Events(%q, %d, %d) = %v, want %v", tc.subject, tc.after, tc.limit, subjects(got), tc.want)
				}
			})
		}
	})
}

func TestAudit(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		for _, a := range []string{"drain", "restart", "apply"} {
			if err := s.AddAudit(ctx, fleet.AuditEntry{User: "ana", Action: a, Target: "ultra", Outcome: "ok"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddAudit(ctx, fleet.AuditEntry{Action: "drain"}); err == nil {
			t.Fatal("AddAudit without a user succeeded")
		}
		got, err := s.Audit(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Action != "restart" || got[1].Action != "apply" || got[1].At.IsZero() || got[1].User != "ana" {
			t.Fatalf("Audit(2) = %+v, want restart then apply", got)
		}
	})
}

func newPublicKey(t *testing.T, comment string) (string, string) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " " + comment
	return line, ssh.FingerprintSHA256(sp)
}

func TestUsers(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		anaKey, anaFP := newPublicKey(t, "ana@laptop")
		bobKey, _ := newPublicKey(t, "bob@desk")
		if n, err := s.CountUsers(ctx); err != nil || n != 0 {
			t.Fatalf("CountUsers on a fresh store = %d, %v", n, err)
		}
		if err := s.AddUser(ctx, fleet.User{Name: "ana", Role: fleet.RoleAdmin, PublicKey: anaKey + "\n", Fingerprint: "ignored"}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			user fleet.User
			want string
		}{
			{"no name", fleet.User{Role: fleet.RoleViewer, PublicKey: bobKey}, "no name given"},
			{"bad role", fleet.User{Name: "bob", Role: "root", PublicKey: bobKey}, `role "root" is not one of viewer, operator, admin`},
			{"bad key", fleet.User{Name: "bob", Role: fleet.RoleViewer, PublicKey: "ssh-ed25519 not-base64"}, "not an authorized_keys line"},
			{"two keys", fleet.User{Name: "bob", Role: fleet.RoleViewer, PublicKey: bobKey + "\n" + anaKey}, "one public key"},
			{"key of another user", fleet.User{Name: "bob", Role: fleet.RoleViewer, PublicKey: anaKey}, "already belongs to user ana"},
			{"same name", fleet.User{Name: "ana", Role: fleet.RoleViewer, PublicKey: bobKey}, "a user with that name exists"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := s.AddUser(ctx, tc.user)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("AddUser = %v, want %q", err, tc.want)
				}
			})
		}
		if n, _ := s.CountUsers(ctx); n != 1 {
			t.Fatalf("refused users were stored: %d users", n)
		}
		u, err := s.UserByFingerprint(ctx, anaFP)
		if err != nil {
			t.Fatal(err)
		}
		want := fleet.User{Name: "ana", Role: fleet.RoleAdmin, PublicKey: anaKey, Fingerprint: anaFP}
		if !reflect.DeepEqual(u, want) {
			t.Fatalf("UserByFingerprint:\n got %+v\nwant %+v", u, want)
		}
		if err := s.SetUserTheme(ctx, "ana", "light"); err != nil {
			t.Fatal(err)
		}
		if err := s.AddUser(ctx, fleet.User{Name: "bob", Role: fleet.RoleViewer, PublicKey: bobKey}); err != nil {
			t.Fatal(err)
		}
		users, err := s.Users(ctx)
		if err != nil || len(users) != 2 || users[0].Theme != "light" || users[1].Name != "bob" {
			t.Fatalf("Users = %+v, %v", users, err)
		}
		if err := s.RemoveUser(ctx, "ana"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UserByFingerprint(ctx, anaFP); !errors.Is(err, ErrNotFound) {
			t.Fatalf("removed user still found: %v", err)
		}
	})
}

func TestAPIKeys(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		key, err := s.CreateAPIKey(ctx, "ci")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(key, "fk-") || len(key) != 3+43 {
			t.Fatalf("key %q is not fk- and 32 random bytes", key)
		}
		var stored []byte
		if err := s.db.QueryRowContext(ctx, `SELECT hash FROM api_keys WHERE name = 'ci'`).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(stored), key[3:]) || len(stored) != 32 {
			t.Fatalf("the database holds %d bytes that are not a SHA-256 of the key", len(stored))
		}
		if _, err := s.CreateAPIKey(ctx, "ci"); err == nil || !strings.Contains(err.Error(), "a key named ci exists") {
			t.Fatalf("second key with the same name: %v", err)
		}
		if _, err := s.CreateAPIKey(ctx, " "); err == nil {
			t.Fatal("CreateAPIKey without a name succeeded")
		}
		other, err := s.CreateAPIKey(ctx, "bench")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			key      string
			wantName string
			wantOK   bool
		}{
			{key, "ci", true},
			{other, "bench", true},
			{key + "x", "", false},
			{"fk-", "", false},
			{"", "", false},
			{"Bearer " + key, "", false},
		} {
			name, ok := liveKey(t, s, tc.key)
			if ok != tc.wantOK || name != tc.wantName {
				t.Errorf("the live key of %q = %q, %v; want %q, %v", tc.key, name, ok, tc.wantName, tc.wantOK)
			}
		}
		if err := s.RevokeAPIKey(ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeAPIKey(ctx, "ci"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoking twice: %v", err)
		}
		if _, ok := liveKey(t, s, key); ok {
			t.Fatal("a revoked key is still live")
		}
		keys, err := s.APIKeys(ctx)
		if err != nil || len(keys) != 2 || keys[1].Name != "ci" || keys[1].Revoked.IsZero() || !keys[0].Revoked.IsZero() || keys[0].Created.IsZero() {
			t.Fatalf("APIKeys = %+v, %v", keys, err)
		}
		again, err := s.CreateAPIKey(ctx, "ci")
		if err != nil {
			t.Fatalf("reusing a revoked key's name: %v", err)
		}
		if name, ok := liveKey(t, s, again); !ok || name != "ci" {
			t.Fatal("the new ci key is not live")
		}
	})
}

// liveKey names the live key whose hash is key's, as the hubs' key caches
// look keys up.
func liveKey(t *testing.T, s *Store, key string) (string, bool) {
	t.Helper()
	keys, err := s.LiveAPIKeyHashes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Hash == HashAPIKey(key) {
			return k.Name, true
		}
	}
	return "", false
}

func TestReferenceShapesAndBenchRuns(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		if err := s.SetReference(ctx, "qwen3-4b", Reference{Shape: []byte(`{"content":"string"}`), Source: "rig/qwen3-4b"}); err != nil {
			t.Fatal(err)
		}
		want := Reference{Shape: []byte(`{"content":"string","reasoning_content":"string"}`), Pinned: true, Source: "ultra/qwen3-4b", Argv: []string{"llama-server", "--jinja"}}
		if err := s.SetReference(ctx, "qwen3-4b", want); err != nil {
			t.Fatal(err)
		}
		if err := s.SetReference(ctx, "qwen3-4b", Reference{Shape: []byte(`{not json`), Pinned: true}); err == nil {
			t.Fatal("SetReference accepted invalid JSON")
		}
		if got, err := s.Reference(ctx, "qwen3-4b"); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("Reference = %+v, %v; want %+v", got, err, want)
		}
		for i := range 3 {
			if err := s.AddBenchRun(ctx, "rig/qwen3-4b", []byte(`{"c":`+string(rune('1'+i))+`}`)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddBenchRun(ctx, "max/qwen3-4b", []byte(`{"c":9}`)); err != nil {
			t.Fatal(err)
		}
		if err := s.AddBenchRun(ctx, "rig/qwen3-4b", []byte(`nope`)); err == nil {
			t.Fatal("AddBenchRun accepted invalid JSON")
		}
		latest, err := s.LatestBenchRuns(ctx)
		if err != nil || len(latest) != 2 || latest[0].Worker != "max/qwen3-4b" || string(latest[0].Run) != `{"c":9}` ||
			latest[1].Worker != "rig/qwen3-4b" || string(latest[1].Run) != `{"c":3}` || latest[1].At.IsZero() {
			t.Fatalf("LatestBenchRuns = %+v, %v; want max's only run and rig's third", latest, err)
		}
		// Each split keeps its own latest run; the history lists them all.
		for _, run := range []string{`{"split":"chat","n":1}`, `{"split":"agent","n":2}`, `{"split":"chat","n":3}`} {
			if err := s.AddBenchRun(ctx, "ultra/qwen3-4b", []byte(run)); err != nil {
				t.Fatal(err)
			}
		}
		latest, err = s.LatestBenchRuns(ctx)
		var ultra []string
		for _, r := range latest {
			if r.Worker == "ultra/qwen3-4b" {
				ultra = append(ultra, string(r.Run))
			}
		}
		if err != nil || !reflect.DeepEqual(ultra, []string{`{"split":"agent","n":2}`, `{"split":"chat","n":3}`}) {
			t.Fatalf("latest runs of ultra by split = %q, %v; want the agent run and the newer chat one", ultra, err)
		}
		hist, err := s.BenchRuns(ctx, "ultra/qwen3-4b", 2)
		if err != nil || len(hist) != 2 || string(hist[0].Run) != `{"split":"chat","n":3}` || string(hist[1].Run) != `{"split":"agent","n":2}` {
			t.Fatalf("BenchRuns(ultra, 2) = %+v, %v; want the two newest, newest first", hist, err)
		}
		// A model leaving the fleet takes its reference shape along.
		if err := s.ApplyFleet(ctx, fleet.Fleet{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reference(ctx, "qwen3-4b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("shape of a removed model: %v", err)
		}
	})
}

// TestConcurrentWriters checks that parallel writers queue rather than
// fail: on SQLite through the busy timeout and immediate transactions
// (no SQLITE_BUSY), on PostgreSQL on the rows they share: two writers of
// one hub's usage rows, given in opposite orders, neither deadlock nor
// lose a count.
func TestConcurrentWriters(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		a, b := db.openTest(t), db.openTest(t)
		a.SetAuditOrigin("hub", "1")
		b.SetAuditOrigin("hub", "1")
		var rows []fleet.Usage
		for i := range 20 {
			rows = append(rows, fleet.Usage{Bucket: time.Unix(60, 0), Key: fmt.Sprint("key", i), Model: "m", Worker: "w", Requests: 1})
		}
		reversed := slices.Clone(rows)
		slices.Reverse(reversed)
		errs := make(chan error, 2)
		for _, w := range []struct {
			s    *Store
			rows []fleet.Usage
		}{{a, rows}, {b, reversed}} {
			go func() {
				for i := range 50 {
					if err := w.s.AddSamples(ctx, []fleet.Sample{{Worker: "w", At: time.Unix(int64(i+1), 0), Kind: "request"}}); err != nil {
						errs <- err
						return
					}
					if err := w.s.AddUsage(ctx, w.rows); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		got, err := a.Samples(ctx, "w", time.Time{}, 0)
		if err != nil || len(got) != 100 {
			t.Fatalf("%d samples after two writers of 50 each (%v)", len(got), err)
		}
		byKey, err := a.Usage(ctx, time.Time{}, UsageByKey)
		if err != nil || len(byKey) != len(rows) {
			t.Fatalf("usage by key: %+v, %v", byKey, err)
		}
		for _, u := range byKey {
			if u.Requests != 100 {
				t.Errorf("key %s: %d requests after two writers of 50 each", u.Key, u.Requests)
			}
		}
	})
}

var (
	_ queryer = (*pool)(nil)
	_ queryer = (*txn)(nil)
)

// TestDemoFleetSurvivesTheDatabase is the contract between fleetfile and
// store: what the demo file declares is exactly what LoadFleet gives back,
// so `fleet export` after `serve --demo` reprints the demo.
func TestDemoFleetSurvivesTheDatabase(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		demo, err := fleetfile.Parse("demo.yaml", fleetfile.Demo)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ApplyFleet(ctx, demo); err != nil {
			t.Fatal(err)
		}
		got, err := s.LoadFleet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(declared(got), demo) {
			t.Fatalf("demo after a database round trip:\n got %+v\nwant %+v", got, demo)
		}
		if p := fleetfile.Diff(got, demo); !p.Empty() {
			t.Fatalf("re-applying the demo would change:\n%s", p)
		}
	})
}

// TestInterruptAudit: a hub started again marks the lines its killed run
// left started as interrupted, and none of its own run's, nor another
// running hub's on PostgreSQL (where lines carry the writer's name); on
// SQLite, one hub at a time, every earlier run's line, also a command's
// that ran without a hub.
func TestInterruptAudit(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := t.Context()
		s := db.openTest(t)
		if _, err := s.InterruptAudit(ctx, "started", "interrupted"); err == nil {
			t.Error("a store that was not told its hub marked lines")
		}
		begin := func(user string) int64 {
			t.Helper()
			id, err := s.BeginAudit(ctx, fleet.AuditEntry{User: user, Action: "stop", Target: "all", Outcome: "started"})
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		begin("no-hub") // a command run without a hub
		s.SetAuditOrigin("a", "run1")
		begin("a-run1")
		done := begin("a-run1-done")
		if err := s.SetAuditOutcome(ctx, done, "ok"); err != nil {
			t.Fatal(err)
		}
		s.SetAuditOrigin("b", "run1")
		begin("b-run1") // another hub, still running
		s.SetAuditOrigin("a", "run2")
		begin("a-run2")

		n, err := s.InterruptAudit(ctx, "started", "interrupted")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"no-hub": "interrupted", "a-run1": "interrupted", "a-run1-done": "ok", "b-run1": "interrupted", "a-run2": "started"}
		if s.Clustered() {
			want["no-hub"], want["b-run1"] = "started", "started"
		}
		es, err := s.Audit(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		marked := 0
		for _, e := range es {
			if e.Outcome != want[e.User] {
				t.Errorf("%s's line says %q, want %q", e.User, e.Outcome, want[e.User])
			}
			if e.Outcome == "interrupted" {
				marked++
			}
		}
		if int64(marked) != n {
			t.Errorf("InterruptAudit says it marked %d lines; %d say interrupted", n, marked)
		}
	})
}

// TestBeginAuditThenOutcome: an action's audit line is written before it
// runs and its outcome recorded after.
func TestBeginAuditThenOutcome(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.openTest(t)
		id, err := s.BeginAudit(t.Context(), fleet.AuditEntry{User: "olga", Action: "drain", Target: "ultra/qwen3-4b", Outcome: "started"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetAuditOutcome(t.Context(), id, "ok"); err != nil {
			t.Fatal(err)
		}
		got, err := s.Audit(t.Context(), 0)
		if err != nil || len(got) != 1 || got[0].ID != id || got[0].Outcome != "ok" || got[0].User != "olga" {
			t.Fatalf("audit = %+v, %v; want olga's entry %d ending ok", got, err, id)
		}
		if err := s.SetAuditOutcome(t.Context(), id+1, "ok"); !errors.Is(err, ErrNotFound) {
			t.Errorf("outcome of a missing entry: %v, want ErrNotFound", err)
		}
		if _, err := s.BeginAudit(t.Context(), fleet.AuditEntry{Action: "drain"}); err == nil {
			t.Error("an entry without a user was written")
		}
	})
}
