package enginectl

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// An engine carries its fleet and launch (FLEET_ID, FLEET_LAUNCH): another
// fleet's hub neither adopts it nor stops it as a stale engine on its port,
// and this fleet's hub on a database older than the engine (restored from a
// copy) refuses it with a NewerEngineError, until it is told otherwise.
func TestEnginesAreJudgedByTheirFleet(t *testing.T) {
	const ours, theirs = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			spec := testSpec("node-"+v.name, port, t.TempDir(), fakeEngine)
			spec.Owner = Owner{FleetID: ours, Launch: 7}
			p, cmd := startEngine(t, v.r, spec)
			if err := WaitReady(ctx, v.r, port, p, spec.Engine, fast...); err != nil {
				t.Fatal(err)
			}
			at := func(f Fleet) []Option { return append([]Option{WithFleet(f)}, fast...) }

			if ok, err := Adopt(ctx, v.r, p, cmd.LaunchArgv, at(Fleet{ID: theirs})...); ok || err != nil {
				t.Errorf("another fleet's hub: Adopt = %v, %v; want false, nil", ok, err)
			}
			if _, err := CheckPort(ctx, v.r, port, fakeEngine, at(Fleet{ID: theirs})...); !errors.Is(err, ErrPortTaken) {
				t.Errorf("another fleet's hub: CheckPort = %v; want the port left to its owner (ErrPortTaken)", err)
			}
			if syscall.Kill(p.PID, 0) != nil {
				t.Fatal("another fleet's hub stopped the engine")
			}

			var seen int64
			restored := Fleet{ID: ours, LastLaunch: func() int64 { return 5 }, OnNewer: func(_ int, l int64) { seen = l }}
			var newer *NewerEngineError
			if ok, err := Adopt(ctx, v.r, p, cmd.LaunchArgv, at(restored)...); ok || !errors.As(err, &newer) || newer.Launch != 7 || newer.Last != 5 {
				t.Errorf("a database older than the engine: Adopt = %v, %v; want a NewerEngineError for launch 7 over 5", ok, err)
			}
			if _, err := CheckPort(ctx, v.r, port, fakeEngine, at(restored)...); !errors.As(err, &newer) {
				t.Errorf("a database older than the engine: CheckPort = %v; want a NewerEngineError", err)
			}
			if seen != 7 || syscall.Kill(p.PID, 0) != nil {
				t.Errorf("the newer launch heard of: %d (want 7); engine alive: %v", seen, syscall.Kill(p.PID, 0) == nil)
			}

			own := Fleet{ID: ours, LastLaunch: func() int64 { return 7 }}
			if ok, err := Adopt(ctx, v.r, p, cmd.LaunchArgv, at(own)...); !ok || err != nil {
				t.Errorf("its own fleet's hub: Adopt = %v, %v; want true", ok, err)
			}
			if found, ok, err := FindLaunch(ctx, v.r, p.PIDPath, Owner{FleetID: ours, Launch: 7}, fast...); !ok || err != nil || found.PID != p.PID {
				t.Errorf("FindLaunch of its launch = %+v, %v, %v; want PID %d", found, ok, err, p.PID)
			}
			for _, other := range []Owner{{FleetID: ours, Launch: 8}, {FleetID: theirs, Launch: 7}} {
				if found, ok, err := FindLaunch(ctx, v.r, p.PIDPath, other, fast...); ok || err != nil {
					t.Errorf("FindLaunch of %+v = %+v, %v, %v; want nothing found", other, found, ok, err)
				}
			}
			if err := Stop(ctx, v.r, p, 2*time.Second, fast...); err != nil {
				t.Fatal(err)
			}
			if found, ok, err := FindLaunch(ctx, v.r, p.PIDPath, Owner{FleetID: ours, Launch: 7}, fast...); ok || err != nil {
				t.Errorf("FindLaunch after the engine stopped = %+v, %v, %v; want nothing found", found, ok, err)
			}
		})
	}
}
