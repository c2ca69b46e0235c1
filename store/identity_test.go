package store

import (
	"context"
	"testing"

	"fleet"
)

// Each launch is recorded with its worker before its engine starts, under
// a serial no other launch of the fleet gets; the serial survives a reopen,
// and a placement removed while its launch is in doubt (no PID yet) keeps a
// pending stop, so the restarted hub looks for that engine too.
func TestLaunchesAreRecordedWithSerialsBeforeTheStart(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s, err := db.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		id, err := s.Identity(ctx)
		if err != nil || len(id.FleetID) != 32 || id.Launches != 0 {
			t.Fatalf("a new database's identity = %+v, %v; want a 32-hex fleet ID and no launches", id, err)
		}
		rig := fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerStarting, Port: 18000}
		ultra := fleet.Worker{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerStarting, Port: 18001}
		var serials []int64
		for _, w := range []fleet.Worker{rig, ultra, rig} {
			saved, err := s.RecordLaunch(ctx, w)
			if err != nil {
				t.Fatal(err)
			}
			serials = append(serials, saved.Launch)
		}
		if serials[0] != 1 || serials[1] != 2 || serials[2] != 3 {
			t.Errorf("launch serials %v, want 1, 2, 3", serials)
		}
		s.Close()

		s, err = db.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		again, err := s.Identity(ctx)
		if err != nil || again.FleetID != id.FleetID || again.Launches != 3 {
			t.Errorf("after a reopen: %+v, %v; want fleet %s with 3 launches", again, err, id.FleetID)
		}
		w, err := s.Worker(ctx, "rig", "qwen3-4b")
		if err != nil || w.Launch != 3 || w.PID != 0 || w.Port != 18000 {
			t.Errorf("rig as stored: %+v, %v; want launch 3 on port 18000 with no PID yet", w, err)
		}
		// fleetB drops rig: its launch in doubt becomes a pending stop.
		if err := s.ApplyFleet(ctx, fleetB()); err != nil {
			t.Fatal(err)
		}
		ps, err := s.PendingStops(ctx)
		if err != nil || len(ps) != 1 || ps[0].Worker.Name() != "rig/qwen3-4b" || ps[0].Worker.Launch != 3 {
			t.Errorf("pending stops %+v, %v; want rig's launch 3", ps, err)
		}
	})
}

// A copy made a fleet of its own gets a new fleet ID and forgets the
// original fleet's engines (PIDs, launches, pending stops); a restored
// database takes on the newer launches it saw only when told to.
func TestNewFleetAndRestoredLaunches(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		if err := s.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		before, _ := s.Identity(ctx)
		if _, err := s.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerStopped, Held: true, PID: 4242, Launch: 7}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SaveWorker(ctx, fleet.Worker{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady, PID: 4343, Launch: 8}); err != nil {
			t.Fatal(err)
		}
		if err := s.ApplyFleet(ctx, fleetB()); err != nil { // rig's engine becomes a pending stop
			t.Fatal(err)
		}
		if err := s.SawNewerLaunch(ctx, 12); err != nil {
			t.Fatal(err)
		}
		if err := s.SawNewerLaunch(ctx, 10); err != nil {
			t.Fatal(err)
		}
		id, err := s.TakeOnNewerLaunches(ctx)
		if err != nil || id.Launches != 12 || id.NewestSeen != 0 {
			t.Errorf("after taking on newer launches: %+v, %v; want launches 12", id, err)
		}

		id, err = s.NewFleet(ctx, "/srv/copy")
		if err != nil || id.FleetID == before.FleetID || id.Home != "/srv/copy" {
			t.Fatalf("NewFleet = %+v, %v; want a new fleet ID at /srv/copy", id, err)
		}
		ws, err := s.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if w.PID != 0 || w.Launch != 0 || w.State == fleet.WorkerReady {
				t.Errorf("%s after NewFleet: PID %d launch %d %s; want the original fleet's engine forgotten", w.Name(), w.PID, w.Launch, w.State)
			}
		}
		if ps, err := s.PendingStops(ctx); err != nil || len(ps) != 0 {
			t.Errorf("pending stops after NewFleet: %+v, %v; want none: the original fleet's engines are not this one's to stop", ps, err)
		}
	})
}
