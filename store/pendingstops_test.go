package store

import (
	"context"
	"testing"

	"fleet"
)

// Removing a node (or a placement) whose worker has an engine must not
// forget the engine: it is kept as a pending stop, with the node's address
// and pinned key, until the hub stopped it.
func TestApplyFleetKeepsPendingStopsOfRemovedEngines(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		if err := s.SetNodeHostKey(ctx, "ultra", "ssh-ed25519 AAAAultra"); err != nil {
			t.Fatal(err)
		}
		workers := []fleet.Worker{
			{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady, PID: 4242, Port: 18000, LaunchArgv: []string{"vllm", "serve"}},
			{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady, PID: 4343, Port: 18001},
		}
		for _, w := range workers {
			if _, err := s.SaveWorker(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		// fleetB drops rig (node and placement) and keeps ultra's placement.
		if err := s.ApplyFleet(ctx, fleetB()); err != nil {
			t.Fatal(err)
		}
		ps, err := s.PendingStops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 || ps[0].Worker.Name() != "rig/qwen3-4b" || ps[0].Worker.PID != 4242 || ps[0].Worker.LaunchArgv[0] != "vllm" {
			t.Fatalf("pending stops = %+v, want rig/qwen3-4b with PID 4242 and its launch argv", ps)
		}
		if ps[0].Node.Address != "sim:rtx3060-vllm" || ps[0].RecordedAt.IsZero() {
			t.Fatalf("pending stop node = %+v at %v, want rig's address and a time", ps[0].Node, ps[0].RecordedAt)
		}

		// An empty fleet removes ultra too; its pinned key travels with it.
		if err := s.ApplyFleet(ctx, fleet.Fleet{}); err != nil {
			t.Fatal(err)
		}
		if ps, err = s.PendingStops(ctx); err != nil {
			t.Fatal(err)
		}
		if len(ps) != 2 || ps[1].Worker.Name() != "ultra/qwen3-4b" || ps[1].Node.HostKey != "ssh-ed25519 AAAAultra" || ps[1].Node.Address != "ops@ultra.lan:22" {
			t.Fatalf("pending stops = %+v, want rig's and ultra's, ultra with its address and pinned key", ps)
		}

		for _, name := range []string{"rig/qwen3-4b", "ultra/qwen3-4b", "never/recorded"} {
			if err := s.DeletePendingStop(ctx, name); err != nil {
				t.Fatalf("DeletePendingStop(%s): %v", name, err)
			}
		}
		if ps, err = s.PendingStops(ctx); err != nil || len(ps) != 0 {
			t.Fatalf("pending stops after deleting them = %+v, %v; want none", ps, err)
		}
	})
}

// A worker with no engine leaves nothing to stop.
func TestApplyFleetNoPendingStopWithoutEngine(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerStopped}); err != nil {
			t.Fatal(err)
		}
		if err := s.ApplyFleet(ctx, fleet.Fleet{}); err != nil {
			t.Fatal(err)
		}
		if ps, err := s.PendingStops(ctx); err != nil || len(ps) != 0 {
			t.Fatalf("pending stops = %+v, %v; want none", ps, err)
		}
	})
}

func TestSaveWorkerKeepsHeld(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		for _, held := range []bool{true, false} {
			if _, err := s.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerStopped, Held: held}); err != nil {
				t.Fatal(err)
			}
			w, err := s.Worker(ctx, "rig", "qwen3-4b")
			if err != nil {
				t.Fatal(err)
			}
			if w.Held != held {
				t.Fatalf("held = %v after saving %v", w.Held, held)
			}
		}
	})
}
