package hub

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
	"fleet/store"
)

// TestLeaderDrainWaitsForEveryLiveHub: on several hubs the leader's drain
// (and so its restart and stop) is over only when every other live hub has
// read the drain and has no request in flight on the worker. A hub that
// has not published since the drain was recorded holds it up, as does one
// with requests in flight; one whose heartbeat is stale (dead, frozen)
// holds nothing up.
func TestLeaderDrainWaitsForEveryLiveHub(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.cluster.renew(ctx)
	if !h.cluster.stillLeading() {
		t.Fatal("the only hub does not lead after its first renewal")
	}
	const worker = "rig/qwen3-4b"
	other := openPGStore(t, url)
	if err := other.RegisterHub(ctx, store.HubInfo{Name: "b", Instance: "b1", Home: "elsewhere:/b"}); err != nil {
		t.Fatal(err)
	}
	before, err := other.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// b said it had the worker drained, idle, before this drain began.
	if err := other.PublishDrainInFlight(ctx, "b", before, map[string]int{worker: 0}); err != nil {
		t.Fatal(err)
	}
	// held waits a second, which b's rows make it spend in full.
	held := func(want string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := h.cluster.waitIdle(wctx, worker)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), want) {
			t.Fatalf("waitIdle with %s: %v; want it held up, saying %q", want, err, want)
		}
	}
	held("hub b has not said it drained it")

	// publishing has b publish inflight again and again, each time as read
	// at the database's clock then, as a follower does after each reload,
	// until stop: some of them come after the drain began.
	publishing := func(inflight int) (stop func()) {
		done, stopped := make(chan struct{}), make(chan error, 1)
		go func() {
			for {
				now, err := other.Now(ctx)
				if err == nil {
					err = other.PublishDrainInFlight(ctx, "b", now, map[string]int{worker: inflight})
				}
				if err != nil {
					stopped <- err
					return
				}
				select {
				case <-done:
					stopped <- nil
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		return func() {
			close(done)
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
		}
	}
	// b read the workers after the drain began: 2 in flight hold it.
	stop := publishing(2)
	held("hub b has 2 in flight")
	stop()

	// b's requests end: the wait is over.
	waitWithB := func(inflight int) error {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		defer publishing(inflight)()
		return h.cluster.waitIdle(wctx, worker)
	}
	if err := waitWithB(0); err != nil {
		t.Fatalf("waitIdle once b has none in flight: %v", err)
	}

	// b stops heartbeating with 3 in flight: once its heartbeat is stale it
	// holds nothing up.
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `UPDATE hubs SET heartbeat_at = heartbeat_at - $1 WHERE name = 'b'`, int64(store.HubStaleAfter+time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := waitWithB(3); err != nil {
		t.Fatalf("waitIdle with a stale hub's 3 requests in flight: %v; want it not held up", err)
	}
	// A hub that heartbeats again holds the next drain up until it has
	// published again.
	if err := other.HubHeartbeat(ctx, "b", "b1"); err != nil {
		t.Fatal(err)
	}
	held("hub b has not said it drained it")
}

// TestFollowerRouterFollowsDrains: a follower's router takes no new
// request to a worker the leader drained, or that a `fleet stop` holds, as
// soon as its mirror reads the worker; and takes them again once the drain
// ends (an undrain, a restart done). It publishes the worker's requests in
// flight for the leader's drain to wait for.
func TestFollowerRouterFollowsDrains(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	a, err := openHub(t, Options{DatabaseURL: url, HubName: "a", Demo: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.cluster.renew(ctx)
	if !a.cluster.stillLeading() {
		t.Fatal("the first hub does not lead")
	}
	b, err := openHub(t, Options{DatabaseURL: url, HubName: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.cluster.renew(ctx)
	if role, _ := b.cluster.role(); role != RoleFollower {
		t.Fatalf("the second hub is %s; want a follower", role)
	}
	const name = "rig/qwen3-4b"
	w := fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady, Port: 1, PID: 1, Slots: 4}
	save := func(change func(*fleet.Worker)) {
		t.Helper()
		change(&w)
		if _, err := a.store.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
		b.cluster.reload(ctx)
	}
	draining := func() bool {
		for _, s := range b.router.Stats() {
			if s.Name == name {
				return s.Draining
			}
		}
		t.Fatalf("the follower's router does not serve %s: %+v", name, b.router.Stats())
		return false
	}
	save(func(*fleet.Worker) {})
	if draining() {
		t.Fatal("the follower's router drains a worker nobody drained")
	}
	for _, c := range []struct {
		what string
		set  func(*fleet.Worker, bool)
	}{
		{"drained", func(w *fleet.Worker, on bool) { w.Drained = on }},
		{"held by a stop", func(w *fleet.Worker, on bool) { w.Held = on }},
	} {
		save(func(w *fleet.Worker) { c.set(w, true) })
		if !draining() {
			t.Errorf("%s on the leader: the follower's router still sends it requests", c.what)
		}
		if got := b.drainedInFlight(); len(got) != 1 || got[name] != 0 {
			t.Errorf("%s: the follower would publish %v; want %s with 0 in flight", c.what, got, name)
		}
		save(func(w *fleet.Worker) { c.set(w, false) })
		if draining() {
			t.Errorf("no longer %s on the leader: the follower's router still drains it", c.what)
		}
	}
	// A worker a stop holds that is not ready (stopped, starting) is in
	// no router, and is published with none in flight, so that stopping
	// it again or restarting it does not wait for this hub until the
	// timeout.
	save(func(w *fleet.Worker) { w.State, w.Held = fleet.WorkerStopped, true })
	if got := b.drainedInFlight(); len(got) != 1 || got[name] != 0 {
		t.Errorf("a stopped, held worker: the follower would publish %v; want %s with 0 in flight", got, name)
	}
}
