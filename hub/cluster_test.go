package hub

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
	"fleet/store"
)

// expireLease renews holder's lease for a nanosecond through st and waits
// until the database's clock says it expired.
func expireLease(t *testing.T, st *store.Store, holder string) {
	t.Helper()
	ctx := t.Context()
	if l, err := st.ClaimLease(ctx, holder, time.Nanosecond); err != nil || !l.Leader {
		t.Fatalf("renew %s's lease for 1ns: %+v, %v", holder, l, err)
	}
	for {
		l, err := st.ReadLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l.ValidFor <= 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func openPGStore(t *testing.T, url string) *store.Store {
	t.Helper()
	st, err := store.OpenPostgres(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestStaleLeaderCannotRecordALaunch: a leader whose lease another hub took
// (after it expired by the database's clock) cannot record a launch, so it
// starts no engine, and its next renewal makes it a follower.
func TestStaleLeaderCannotRecordALaunch(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.cluster.renew(ctx)
	if role, leader := h.cluster.role(); role != RoleLeader || leader != "a" || !h.cluster.stillLeading() {
		t.Fatalf("after its first renewal the only hub is %s (leader %q)", role, leader)
	}
	w := fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerStarting}
	if _, err := h.recordLaunch(ctx, w); err != nil {
		t.Fatalf("the leader records a launch: %v", err)
	}

	other := openPGStore(t, url)
	expireLease(t, other, "a")
	if l, err := other.ClaimLease(ctx, "b", time.Hour); err != nil || !l.Leader {
		t.Fatalf("b takes the expired lease: %+v, %v", l, err)
	}
	before, err := other.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.recordLaunch(ctx, w); !errors.Is(err, store.ErrNotLeader) || !strings.Contains(err.Error(), "nothing was started") {
		t.Fatalf("the stale leader records a launch: %v; want ErrNotLeader, nothing started", err)
	}
	if after, err := other.Identity(ctx); err != nil || after.Launches != before.Launches {
		t.Errorf("launch serials %d after the refused launch, %d before (%v)", after.Launches, before.Launches, err)
	}
	h.cluster.renew(ctx)
	if role, leader := h.cluster.role(); role != RoleFollower || leader != "b" || h.cluster.stillLeading() || h.store.Epoch() != 0 {
		t.Errorf("after its renewal the stale leader is %s (leader %q, epoch %d); want a follower of b", role, leader, h.store.Epoch())
	}
}

// TestLeaderThatCannotRenewStopsLeading: a leader whose renewals do not get
// through (another session holds the lease's row) stops leading once its
// own clock says the lease is near its end, and leads again once they do.
func TestLeaderThatCannotRenewStopsLeading(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a", LeaseTTL: MinLeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.cluster.renew(ctx)
	if !h.cluster.stillLeading() {
		t.Fatal("the only hub does not lead after its first renewal")
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT * FROM lease FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// Each renewal waits its 2 s and gives up; the lease's 5 s less the 2 s
	// margin are over after the second.
	for i := 0; i < 5 && h.cluster.stillLeading(); i++ {
		h.cluster.renew(ctx)
	}
	if role, _ := h.cluster.role(); role != RoleFollower || h.store.Epoch() != 0 {
		t.Fatalf("a leader that cannot renew is %s (epoch %d); want it following", role, h.store.Epoch())
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	h.cluster.renew(ctx)
	if role, _ := h.cluster.role(); role != RoleLeader || !h.cluster.stillLeading() || h.store.Epoch() == 0 {
		t.Errorf("once its renewal gets through the hub is %s (epoch %d); want it leading", role, h.store.Epoch())
	}
}

// TestFollowerActionWithoutLeaderIsRefused: an action on a follower while no
// hub holds the lease is refused at once, says so, is audited once as
// failed, and changes nothing.
func TestFollowerActionWithoutLeaderIsRefused(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const name = "rig/qwen3-4b"
	w := fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady, PID: 42}
	if _, err := h.store.SaveWorker(ctx, w); err != nil { // at the epoch Open took
		t.Fatal(err)
	}
	h.state.mu.Lock()
	h.state.workers[name] = w
	h.state.mu.Unlock()
	expireLease(t, openPGStore(t, url), "a")

	done := make(chan error, 1)
	go func() {
		_, err := h.Act(ctx, LocalAdmin(), fleet.ActionDrain, []string{name})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("drain on a follower without a leader waits instead of being refused")
	}
	if !errors.Is(err, errNoLeader) || !strings.Contains(err.Error(), "nothing was done") {
		t.Fatalf("drain without a leader: %v; want it refused, nothing done", err)
	}
	audit, err := h.store.Audit(ctx, 50)
	if err != nil {
		t.Fatal(err)
	}
	var lines []fleet.AuditEntry
	for _, e := range audit {
		if e.Action == string(fleet.ActionDrain) {
			lines = append(lines, e)
		}
	}
	if len(lines) != 1 || lines[0].Target != name || !strings.Contains(lines[0].Outcome, "no hub holds the leader's lease") {
		t.Errorf("audit of the refused drain: %+v; want one line saying why", lines)
	}
	if got, err := h.store.Worker(ctx, "rig", "qwen3-4b"); err != nil || got.Drained {
		t.Errorf("the worker after the refused drain: %+v, %v; want it not drained", got, err)
	}
	if n := countActions(t, url); n != 0 {
		t.Errorf("%d actions queued; want none", n)
	}
}

func countActions(t *testing.T, url string) int {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM actions`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHealthSaysRoleAndWhetherItCanRoute: /healthz's answer on PostgreSQL
// names the hub and its role; 503 only when the hub knows no ready worker
// and the database has not answered within the lease's time.
func TestHealthSaysRoleAndWhetherItCanRoute(t *testing.T) {
	url := pgtest.URL(t)
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	code, body := h.cluster.health()
	if code != 200 || !strings.Contains(string(body), `"hub":"a"`) || !strings.Contains(string(body), `"role":"follower"`) {
		t.Errorf("health of a hub that reached the database: %d %s", code, body)
	}
	h.cluster.mu.Lock()
	h.cluster.dbSeen = time.Time{} // the database has not answered for long
	h.cluster.mu.Unlock()
	if code, body := h.cluster.health(); code != 503 || !strings.Contains(string(body), "cannot route") {
		t.Errorf("health without a ready worker nor the database: %d %s; want 503", code, body)
	}
	h.state.mu.Lock()
	h.state.workers["rig/qwen3-4b"] = fleet.Worker{Node: "rig", Model: "qwen3-4b", State: fleet.WorkerReady}
	h.state.mu.Unlock()
	if code, body := h.cluster.health(); code != 200 {
		t.Errorf("health with a ready worker known, the database gone: %d %s; want 200 (it still routes)", code, body)
	}
}

// TestBadHubNameOrLeaseTTLIsRefused: a lease too short to renew before the
// leader must stop, or a hub name with control characters, stops the start
// with what to give instead.
func TestBadHubNameOrLeaseTTLIsRefused(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{LeaseTTL: 3 * time.Second}, "--lease-ttl 3s is too short"},
		{Options{HubName: "hub\x1b[2J"}, "--hub-name"},
		{Options{HubName: strings.Repeat("h", 65)}, "at most 64"},
	} {
		_, err := openHub(t, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v): %v; want it refused saying %q", tc.opts, err, tc.want)
		}
	}
}

// TestLocalNodesNeedHubsOnOneMachine: local and simulated nodes run their
// engines on the leading hub's machine, so while a hub on another machine is
// live, a fleet with such nodes is refused (apply and a hub joining),
// saying which nodes and which machines, and an all-SSH fleet is taken.
func TestLocalNodesNeedHubsOnOneMachine(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a"})
	if err != nil {
		t.Fatalf("the first hub with the demo fleet, alone on its machine: %v", err)
	}
	defer h.Close()
	other := openPGStore(t, url)
	if err := other.RegisterHub(ctx, store.HubInfo{Name: "b", Instance: "b1", Home: "elsewhere:/srv/fleet"}); err != nil {
		t.Fatal(err)
	}
	before, err := h.store.LoadFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	demo := "nodes:\n  - name: rig\n    address: sim:rtx3060-vllm\n  - name: desk\n    address: local\n" + sshFleetModel
	_, err = h.apply(ctx, "two.yaml", []byte(demo), false)
	for _, want := range []string{"nodes rig, desk run their engines on the leading hub's own machine", "elsewhere", "b on elsewhere", "SSH address", "nothing was changed"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("applying a fleet with sim and local nodes while hub b runs on another machine: %v; want it refused, saying %q", err, want)
		}
	}
	if after, err := h.store.LoadFleet(ctx); err != nil || len(after.Nodes) != len(before.Nodes) {
		t.Fatalf("the refused apply changed the stored fleet: %d nodes before, %+v after (%v)", len(before.Nodes), after.Nodes, err)
	}
	if _, err := openHub(t, Options{DatabaseURL: url, HubName: "c"}); err == nil || !strings.Contains(err.Error(), "cannot join the fleet") {
		t.Fatalf("a hub joining a fleet of sim nodes while hubs run on two machines: %v; want it refused", err)
	}
	ssh := "nodes:\n  - name: desk\n    address: fleet@192.0.2.7\n" + sshFleetModel
	if _, err := h.apply(ctx, "ssh.yaml", []byte(ssh), false); err != nil {
		t.Fatalf("an all-SSH fleet with hubs on two machines: %v; want it applied", err)
	}
}

const sshFleetModel = `models:
  - id: qwen3-4b
    context: 16384
    memory_gb: 1
    recipes:
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
      sim:
        profile: m4max-llamacpp
`

// TestStatusAnswersWithoutTheDatabase: with PostgreSQL unreachable,
// `status` still answers from the hub's memory (its role, the workers, the
// keys it checks), and says, line by line, what it could not read.
func TestStatusAnswersWithoutTheDatabase(t *testing.T) {
	proxy, proxied, direct := newDBProxy(t)
	ctx := t.Context()
	if _, err := openPGStore(t, direct).CreateAPIKey(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	h, err := openHub(t, Options{DatabaseURL: proxied, Demo: true, HubName: "a", RequireKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.cluster.renew(ctx)
	proxy.down()
	st, err := h.Status(ctx, LocalAdmin())
	if err != nil {
		t.Fatalf("status with the database down: %v", err)
	}
	if st.Hub != "a" || st.HubRole != RoleLeader || st.Keys != 1 || !st.KeysFromMemory || st.KeysError == "" || st.HubsError == "" || len(st.Nodes) == 0 {
		t.Errorf("status with the database down: hub %q %s, %d keys (from memory %v, %q), hubs error %q, nodes %+v; want hub a leading, its 1 key from memory, both reads saying why, the nodes",
			st.Hub, st.HubRole, st.Keys, st.KeysFromMemory, st.KeysError, st.HubsError, st.Nodes)
	}
	var out, errOut strings.Builder
	if code := h.Exec(ctx, LocalAdmin(), []string{"status"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("fleet status with the database down: exit %d: %s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{`(?m)^this hub +a, leader`, `(?m)^hubs +unknown, the database did not answer`,
		`(?m)^router .*\(1 API key as this hub last read them, the database did not answer`, `(?m)^nodes +3: `} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("fleet status with the database down lacks %q:\n%s", want, out.String())
		}
	}
}

// TestStatusSaysGoneOfAHubWhoseHeartbeatLapsed: a hub killed with kill -9
// leaves its row; once its heartbeat is older than HubStaleAfter, status
// lists it as gone, not as a follower.
func TestStatusSaysGoneOfAHubWhoseHeartbeatLapsed(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.cluster.renew(ctx)
	other := openPGStore(t, url)
	for _, name := range []string{"killed", "alive"} {
		if err := other.RegisterHub(ctx, store.HubInfo{Name: name, Instance: name + "-1", Home: "elsewhere:/var/lib/" + name}); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Its last heartbeat, a little more than HubStaleAfter ago by the
	// database's clock.
	if _, err := db.ExecContext(ctx, `UPDATE hubs SET heartbeat_at = heartbeat_at - $1 WHERE name = 'killed'`, int64(store.HubStaleAfter+time.Second)); err != nil {
		t.Fatal(err)
	}
	st, err := h.Status(ctx, LocalAdmin())
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, o := range st.Hubs {
		roles[o.Name] = o.Role
	}
	if want := map[string]string{"a": RoleLeader, "alive": RoleFollower, "killed": RoleGone}; !maps.Equal(roles, want) {
		t.Errorf("status lists the hubs as %v, want %v", roles, want)
	}
}

// TestHubWhoseNameWasTakenIsUnhealthy: a hub that missed its heartbeats
// (frozen) while another instance took its name answers /healthz 503, so
// keepalived sends the clients elsewhere, until it has its name back.
func TestHubWhoseNameWasTakenIsUnhealthy(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	h, err := openHub(t, Options{DatabaseURL: url, Demo: true, HubName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.cluster.renew(ctx)
	if code, body := h.cluster.health(); code != 200 {
		t.Fatalf("health of the only hub: %d %s", code, body)
	}
	// Another instance takes the name, as one started (from a data dir of
	// its own) while this hub was frozen past HubStaleAfter does.
	other := openPGStore(t, url)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `UPDATE hubs SET heartbeat_at = heartbeat_at - $1 WHERE name = 'a'`, int64(store.HubStaleAfter+time.Second)); err != nil {
		t.Fatal(err)
	}
	taker := store.HubInfo{Name: "a", Instance: "taker", Home: "elsewhere:/var/lib/fleet"}
	if err := other.RegisterHub(ctx, taker); err != nil {
		t.Fatal(err)
	}
	h.cluster.renew(ctx)
	if code, body := h.cluster.health(); code != 503 || !strings.Contains(string(body), "another hub runs with this hub's name") {
		t.Errorf("health of a hub whose name another took: %d %s; want 503 saying why", code, body)
	}
	if role, _ := h.cluster.role(); role != RoleFollower {
		t.Errorf("a hub whose name another took is %s, want a follower", role)
	}
	h.cluster.renew(ctx)
	if code, _ := h.cluster.health(); code != 503 {
		t.Errorf("health at the next renewal, the name still taken: %d, want 503", code)
	}
	if err := other.UnregisterHub(ctx, "a", "taker"); err != nil {
		t.Fatal(err)
	}
	h.cluster.renew(ctx)
	if code, body := h.cluster.health(); code != 200 {
		t.Errorf("health once the other left and this hub has its name again: %d %s; want 200", code, body)
	}
}
