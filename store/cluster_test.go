package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"fleet"
)

// openFollower opens db without holding the lease, as a hub starts.
func openFollower(t *testing.T, db testDB, opts ...Option) *Store {
	t.Helper()
	open := func(ctx context.Context) (*Store, error) { return Open(ctx, db.target, opts...) }
	if db.name == "postgres" {
		open = func(ctx context.Context) (*Store, error) { return OpenPostgres(ctx, db.target, opts...) }
	}
	s, err := open(context.Background())
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// expireLease makes s's lease (held by holder) expire now, by renewing it
// for a nanosecond, and waits until the database's clock, not the test's,
// says it expired (SQLite's clock has milliseconds).
func expireLease(t *testing.T, s *Store, holder string) {
	t.Helper()
	ctx := context.Background()
	l, err := s.ClaimLease(ctx, holder, time.Nanosecond)
	if err != nil || !l.Leader {
		t.Fatalf("renew %s's lease for 1ns: %+v, %v", holder, l, err)
	}
	for {
		l, err := s.ReadLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l.ValidFor <= 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseTakenOnlyAfterExpiryByTheDatabasesClock: a second hub cannot take
// a live lease, however far its own clock runs ahead; once the database's
// clock says it expired, it takes it with the next epoch and the first hub
// is told it no longer leads.
func TestLeaseTakenOnlyAfterExpiryByTheDatabasesClock(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		a := openFollower(t, db)
		b := openFollower(t, db, WithClock(func() time.Time { return time.Now().Add(24 * time.Hour) }))

		la, err := a.ClaimLease(ctx, "hub-a", time.Hour)
		if err != nil || !la.Leader || la.Holder != "hub-a" || la.Epoch < 1 {
			t.Fatalf("first claim: %+v, %v; want hub-a leading", la, err)
		}
		again, err := a.ClaimLease(ctx, "hub-a", time.Hour)
		if err != nil || !again.Leader || again.Epoch != la.Epoch {
			t.Fatalf("renewal: %+v, %v; want the same epoch %d", again, err, la.Epoch)
		}
		lb, err := b.ClaimLease(ctx, "hub-b", time.Hour)
		if err != nil || lb.Leader || lb.Holder != "hub-a" || lb.Epoch != la.Epoch || lb.ValidFor <= 0 {
			t.Fatalf("claim of a live lease: %+v, %v; want hub-a's lease reported, not taken", lb, err)
		}

		expireLease(t, a, "hub-a")
		lb, err = b.ClaimLease(ctx, "hub-b", time.Hour)
		if err != nil || !lb.Leader || lb.Holder != "hub-b" || lb.Epoch != la.Epoch+1 {
			t.Fatalf("claim of an expired lease: %+v, %v; want hub-b leading at epoch %d", lb, err, la.Epoch+1)
		}
		la, err = a.ClaimLease(ctx, "hub-a", time.Hour)
		if err != nil || la.Leader || la.Holder != "hub-b" {
			t.Fatalf("former leader's renewal: %+v, %v; want hub-b's lease reported", la, err)
		}
		read, err := a.ReadLease(ctx)
		if err != nil || read.Holder != "hub-b" || read.Epoch != lb.Epoch || read.ValidFor <= 0 {
			t.Fatalf("ReadLease: %+v, %v", read, err)
		}

		// A released lease is taken at once, with the next epoch.
		if err := b.ReleaseLease(ctx, "hub-b", lb.Epoch); err != nil {
			t.Fatal(err)
		}
		la, err = a.ClaimLease(ctx, "hub-a", time.Hour)
		if err != nil || !la.Leader || la.Epoch != lb.Epoch+1 {
			t.Fatalf("claim after release: %+v, %v; want hub-a at epoch %d", la, err, lb.Epoch+1)
		}
	})
}

// TestStaleEpochWritesAreRefusedByTheDatabase: once the lease changed hands,
// the former leader's writes about workers, launches and pending stops are
// refused by PostgreSQL itself (fleet_fence), whatever the Go code checks,
// and change nothing. SQLite, one hub, has no fence.
func TestStaleEpochWritesAreRefusedByTheDatabase(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		old := openFollower(t, db)
		leader := openFollower(t, db)
		if err := leader.ApplyFleet(ctx, fleetA()); err != nil && db.name == "sqlite" {
			t.Fatal(err)
		} else if db.name == "postgres" && !errors.Is(err, ErrNotLeader) {
			t.Fatalf("apply at epoch 0 on PostgreSQL: %v; want ErrNotLeader", err)
		}

		lo, err := old.ClaimLease(ctx, "old", time.Hour)
		if err != nil || !lo.Leader {
			t.Fatal(lo, err)
		}
		old.SetEpoch(lo.Epoch)
		if err := old.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatalf("apply by the leader: %v", err)
		}
		w, err := old.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady, PID: 100})
		if err != nil {
			t.Fatalf("save by the leader: %v", err)
		}

		expireLease(t, old, "old")
		ln, err := leader.ClaimLease(ctx, "new", time.Hour)
		if err != nil || !ln.Leader {
			t.Fatal(ln, err)
		}
		leader.SetEpoch(ln.Epoch)

		stale := []struct {
			what  string
			write func() error
		}{
			{"save worker", func() error {
				_, err := old.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerStopped, PID: 0})
				return err
			}},
			{"record launch", func() error {
				_, err := old.RecordLaunch(ctx, fleet.Worker{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerStarting})
				return err
			}},
			{"delete worker", func() error { return old.DeleteWorker(ctx, "rig", "qwen3-4b") }},
			{"delete pending stop", func() error { return old.DeletePendingStop(ctx, "rig/qwen3-4b") }},
			{"apply", func() error { return old.ApplyFleet(ctx, fleetB()) }},
			{"take action", func() error { _, _, err := old.TakeAction(ctx); return err }},
		}
		for _, s := range stale {
			err := s.write()
			if db.name == "sqlite" {
				continue // no fence: SQLite is one hub
			}
			if !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "fleet status") {
				t.Errorf("%s by the former leader: %v; want ErrNotLeader, worded for an operator", s.what, err)
			}
		}
		if db.name == "sqlite" {
			return
		}
		got, err := leader.Worker(ctx, "rig", "qwen3-4b")
		if err != nil || got.PID != w.PID || got.State != fleet.WorkerReady {
			t.Errorf("worker after the refused writes: %+v, %v; want it as the leader saved it", got, err)
		}
		if _, err := leader.Worker(ctx, "ultra", "qwen3-4b"); !errors.Is(err, ErrNotFound) {
			t.Errorf("the refused launch left a worker: %v", err)
		}
		id, err := leader.Identity(ctx)
		if err != nil || id.Launches != 0 {
			t.Errorf("launch serials after the refused launch: %+v, %v; want none given out", id, err)
		}

		// The database refuses it, not only the store's Go: the fence
		// called directly in SQL.
		for _, epoch := range []int64{lo.Epoch, 0, ln.Epoch + 1} {
			_, err := old.db.ExecContext(ctx, `SELECT fleet_fence(?)`, epoch)
			if pgCode(err) != "FL001" || !strings.Contains(err.Error(), "held by new") {
				t.Errorf("fleet_fence(%d) while new holds epoch %d: %v; want SQLSTATE FL001 naming the holder", epoch, ln.Epoch, err)
			}
		}
		if _, err := old.db.ExecContext(ctx, `SELECT fleet_fence(?)`, ln.Epoch); err != nil {
			t.Errorf("fleet_fence of the live epoch: %v", err)
		}
		// A raw write in the former leader's transaction is rolled back with
		// the fence.
		tx, err := old.db.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `SELECT fleet_fence(?)`, lo.Epoch); pgCode(err) != "FL001" {
			t.Errorf("fence in a transaction: %v", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE workers SET pid = 7`); err == nil {
			t.Error("the transaction went on after the fence refused it")
		}
		tx.tx.Rollback()
		// An expired lease refuses its own holder too.
		expireLease(t, leader, "new")
		if _, err := leader.SaveWorker(ctx, w); !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "expired") {
			t.Errorf("save under an expired lease: %v; want ErrNotLeader saying it expired", err)
		}
	})
}

// TestTwoHubsWithOneNameAreRefused: a name whose other instance heartbeats
// is refused, to register and to heartbeat; a dead hub's name is free after
// HubStaleAfter. SQLite's one hub takes its name over always.
func TestTwoHubsWithOneNameAreRefused(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		s := db.openTest(t)
		first := HubInfo{Name: "hub-1", Instance: "i1", HTTPAddr: "10.0.0.1:8080", SSHAddr: "10.0.0.1:2222", Version: "v1", Home: "a:/var/lib/fleet"}
		if err := s.RegisterHub(ctx, first); err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterHub(ctx, first); err != nil {
			t.Fatalf("the same instance registering again: %v", err)
		}
		if err := s.RegisterHub(ctx, HubInfo{Name: "hub-2", Instance: "i2"}); err != nil {
			t.Fatal(err)
		}
		second := HubInfo{Name: "hub-1", Instance: "i3", Home: "b:/var/lib/fleet"}
		err := s.RegisterHub(ctx, second)
		if db.name == "sqlite" {
			if err != nil {
				t.Fatalf("SQLite: %v; want the name taken over", err)
			}
			return
		}
		if !errors.Is(err, ErrHubNameTaken) || !strings.Contains(err.Error(), "--hub-name") || !strings.Contains(err.Error(), "10.0.0.1:8080") {
			t.Fatalf("second hub-1: %v; want ErrHubNameTaken naming the other and the flag", err)
		}
		if err := s.HubHeartbeat(ctx, "hub-1", "i1"); err != nil {
			t.Fatal(err)
		}
		if err := s.HubHeartbeat(ctx, "hub-1", "i3"); !errors.Is(err, ErrHubNameTaken) {
			t.Fatalf("heartbeat of the refused instance: %v", err)
		}
		hubs, err := s.Hubs(ctx)
		if err != nil || len(hubs) != 2 || hubs[0].Name != "hub-1" || hubs[0].Instance != "i1" || hubs[0].SSHAddr != "10.0.0.1:2222" || hubs[1].Name != "hub-2" {
			t.Fatalf("Hubs: %+v, %v", hubs, err)
		}
		if hubs[0].HeartbeatAge < 0 || hubs[0].HeartbeatAge >= HubStaleAfter || hubs[0].StartedAt.IsZero() {
			t.Errorf("hub-1's heartbeat: %+v", hubs[0])
		}
		// hub-1 died: its last heartbeat is older than HubStaleAfter.
		if _, err := s.db.ExecContext(ctx, `UPDATE hubs SET heartbeat_at = heartbeat_at - ? WHERE name = 'hub-1'`, int64(HubStaleAfter+time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterHub(ctx, second); err != nil {
			t.Fatalf("registering a dead hub's name: %v", err)
		}
		if err := s.HubHeartbeat(ctx, "hub-1", "i1"); !errors.Is(err, ErrHubNameTaken) {
			t.Fatalf("heartbeat of the instance whose name was taken: %v", err)
		}
		// Restarted from the same data dir (whose lock it holds): the old
		// instance is dead, however recent its heartbeat.
		if err := s.RegisterHub(ctx, HubInfo{Name: "hub-1", Instance: "i4", Home: "b:/var/lib/fleet"}); err != nil {
			t.Fatalf("registering again from the same home: %v", err)
		}
		if err := s.RegisterHub(ctx, HubInfo{Name: "hub-1", Instance: "i5", Home: "c:/var/lib/fleet"}); !errors.Is(err, ErrHubNameTaken) {
			t.Fatalf("registering from another home: %v", err)
		}
		if err := s.UnregisterHub(ctx, "hub-1", "i4"); err != nil {
			t.Fatal(err)
		}
		if hubs, err := s.Hubs(ctx); err != nil || len(hubs) != 1 {
			t.Fatalf("after unregistering: %+v, %v", hubs, err)
		}
	})
}

// TestListenDeliversAndResyncs: a change written through one store is heard
// on another's Listen; when the listening connection is killed on the
// server, Listen reconnects, says Resync on every channel, and hears the
// next change.
func TestListenDeliversAndResyncs(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		writer := db.openTest(t)
		if err := writer.ApplyFleet(ctx, fleetA()); err != nil {
			t.Fatal(err)
		}
		listener := openFollower(t, db)
		pids := make(chan uint32, 4)
		listener.listening = func(pid uint32) { pids <- pid }
		got, err := listener.Listen(ctx, ChannelWorkers, ChannelKeys)
		if err != nil {
			t.Fatal(err)
		}
		if db.name == "sqlite" {
			if _, err := writer.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady}); err != nil {
				t.Fatal(err)
			}
			cancel()
			for n := range got {
				t.Errorf("SQLite's Listen delivered %+v", n)
			}
			return
		}
		next := func(what string) Notification {
			t.Helper()
			select {
			case n, ok := <-got:
				if !ok {
					t.Fatalf("Listen's channel closed, waiting for %s", what)
				}
				return n
			case <-time.After(30 * time.Second):
				t.Fatalf("no notification for %s", what)
			}
			return Notification{}
		}
		if _, err := writer.SaveWorker(ctx, fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady}); err != nil {
			t.Fatal(err)
		}
		if n := next("a saved worker"); n != (Notification{Channel: ChannelWorkers, Payload: "rig/qwen3-4b"}) {
			t.Fatalf("got %+v; want the worker's name on %s", n, ChannelWorkers)
		}
		if _, err := writer.CreateAPIKey(ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		if n := next("a created key"); n != (Notification{Channel: ChannelKeys, Payload: "ci"}) {
			t.Fatalf("got %+v; want the key's name on %s", n, ChannelKeys)
		}

		pid := <-pids
		var killed bool
		if err := writer.db.QueryRowContext(ctx, `SELECT pg_terminate_backend(?)`, int64(pid)).Scan(&killed); err != nil || !killed {
			t.Fatalf("terminate Listen's connection (PID %d): %v, %v", pid, killed, err)
		}
		resync := map[string]bool{}
		for len(resync) < 2 {
			n := next("a resync after the connection was killed")
			if !n.Resync {
				t.Fatalf("got %+v before the resyncs", n)
			}
			resync[n.Channel] = true
		}
		if !resync[ChannelWorkers] || !resync[ChannelKeys] {
			t.Fatalf("resyncs on %v; want both channels", resync)
		}
		if newPID := <-pids; newPID == pid {
			t.Fatalf("reconnected on the killed connection's PID %d", pid)
		}
		if err := writer.RevokeAPIKey(ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		if n := next("a revoked key after the reconnection"); n != (Notification{Channel: ChannelKeys, Payload: "ci"}) {
			t.Fatalf("got %+v", n)
		}
		cancel()
		for range got {
		}
	})
}

// TestActionQueue: a follower queues, the leader takes and finishes, the
// follower reads the result; a pending action is cancelled, a taken one is
// not; a former leader's unfinished action fails when another leads.
func TestActionQueue(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := context.Background()
		follower := openFollower(t, db)
		leader := openFollower(t, db)
		l, err := leader.ClaimLease(ctx, "leader", time.Hour)
		if err != nil || !l.Leader {
			t.Fatal(l, err)
		}
		leader.SetEpoch(l.Epoch)

		id, err := follower.QueueAction(ctx, Action{Hub: "f", User: "alice", Action: "drain", Target: "rig", Args: `{"on":true}`})
		if err != nil {
			t.Fatal(err)
		}
		id2, err := follower.QueueAction(ctx, Action{Hub: "f", User: "bob", Action: "stop", Target: "rig/m"})
		if err != nil {
			t.Fatal(err)
		}
		if db.name == "postgres" {
			if _, _, err := follower.TakeAction(ctx); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("a follower taking an action: %v; want ErrNotLeader", err)
			}
		}
		a, ok, err := leader.TakeAction(ctx)
		if err != nil || !ok || a.ID != id || a.State != ActionRunning || a.User != "alice" || a.Args != `{"on":true}` || a.Epoch != l.Epoch {
			t.Fatalf("take: %+v, %v, %v", a, ok, err)
		}
		if cancelled, err := follower.CancelAction(ctx, id, "gave up"); err != nil || cancelled {
			t.Fatalf("cancel of a taken action: %v, %v; want not cancelled", cancelled, err)
		}
		if err := leader.FinishAction(ctx, id, false, "drained rig"); err != nil {
			t.Fatal(err)
		}
		if got, err := follower.GetAction(ctx, id); err != nil || got.State != ActionDone || got.Result != "drained rig" || got.DoneAt.IsZero() {
			t.Fatalf("finished action: %+v, %v", got, err)
		}
		if cancelled, err := follower.CancelAction(ctx, id2, "the caller stopped waiting"); err != nil || !cancelled {
			t.Fatalf("cancel of a pending action: %v, %v", cancelled, err)
		}
		if _, ok, err := leader.TakeAction(ctx); err != nil || ok {
			t.Fatalf("take with nothing pending: %v, %v", ok, err)
		}

		id3, err := follower.QueueAction(ctx, Action{Hub: "f", User: "alice", Action: "restart", Target: "rig/m"})
		if err != nil {
			t.Fatal(err)
		}
		if a, ok, err := leader.TakeAction(ctx); err != nil || !ok || a.ID != id3 {
			t.Fatalf("take: %+v, %v, %v", a, ok, err)
		}
		// The leader dies mid-action; another takes the lease.
		expireLease(t, leader, "leader")
		l2, err := follower.ClaimLease(ctx, "f", time.Hour)
		if err != nil || !l2.Leader {
			t.Fatal(l2, err)
		}
		follower.SetEpoch(l2.Epoch)
		if n, err := follower.FailOrphanedActions(ctx); err != nil || n != 1 {
			t.Fatalf("fail orphaned: %d, %v; want 1", n, err)
		}
		got, err := follower.GetAction(ctx, id3)
		if err != nil || got.State != ActionFailed || !strings.Contains(got.Result, "fleet status") || !strings.HasPrefix(got.Result, "restart rig/m: ") {
			t.Fatalf("orphaned action: %+v, %v", got, err)
		}
		if _, err := follower.GetAction(ctx, id3+100); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown action: %v", err)
		}
	})
}
