package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/internal/netnstest"
	"fleet/internal/pgtest"
	"fleet/internal/sshdtest"
	"fleet/internal/vrrptest"
)

// clusterHub is one `fleet serve` of several on one PostgreSQL database,
// in a network namespace of its own on the test's bridge.
type clusterHub struct {
	name string
	ns   *netnstest.Namespace
	data string
	cmd  *exec.Cmd
	log  string
}

// clusterStatus is what `fleet status --json` says about the hubs.
type clusterStatus struct {
	Hub     string `json:"hub"`
	HubRole string `json:"hub_role"`
	Leader  string `json:"leader"`
	Hubs    []struct {
		Name string `json:"name"`
		Role string `json:"role"`
	} `json:"hubs"`
}

// startClusterHub runs `fleet serve` in ns with the router on every
// address of the namespace (the bridge's, and the virtual IP's when
// keepalived gives it this hub) and no SSH console.
func startClusterHub(t *testing.T, ns *netnstest.Namespace, name, data string, port int, dbURL string, flags ...string) *clusterHub {
	t.Helper()
	h := &clusterHub{name: name, ns: ns, data: data}
	h.log = filepath.Join(h.data, "hub.log")
	// Registered before the hub's own cleanup, so it runs after the hub has
	// stopped: the engines outlive every hub.
	t.Cleanup(func() { killSimsOf(h.data) })
	out, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	argv := ns.Command(append([]string{fleetBin, "--data", h.data, "serve", "--http", fmt.Sprintf("0.0.0.0:%d", port), "--ssh=",
		"--database-url", dbURL, "--hub-name", name}, flags...)...)
	h.cmd = exec.Command(argv[0], argv[1:]...)
	h.cmd.Stdout, h.cmd.Stderr = out, out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			// A hub the test left stopped must run to hear SIGTERM.
			h.cmd.Process.Signal(syscall.SIGCONT)
			h.cmd.Process.Signal(syscall.SIGTERM)
			h.cmd.Wait()
		}
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(h.log)
			if len(b) > 20000 {
				b = append([]byte("…"), b[len(b)-20000:]...)
			}
			t.Logf("hub %s log:\n%s", name, b)
		}
	})
	return h
}

// ctl runs a hub command on h's control socket, given up after 5 s (a
// stopped hub accepts the connection and says nothing).
func (h *clusterHub) ctl(args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fleetBin, append([]string{"--data", h.data}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	default:
		return out.String() + err.Error(), -1
	}
}

// status is h's `fleet status --json`; ok is false when it did not answer.
func (h *clusterHub) status(t *testing.T) (clusterStatus, bool) {
	t.Helper()
	out, code := h.ctl("status", "--json")
	if code != 0 {
		return clusterStatus{}, false
	}
	var s clusterStatus
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("hub %s: status --json is not JSON: %v\n%s", h.name, err, out)
	}
	return s, true
}

// workers is h's `fleet workers --json`, nil when it did not answer.
func (h *clusterHub) workers(t *testing.T) []fleet.WorkerView {
	t.Helper()
	out, code := h.ctl("workers", "--json")
	if code != 0 {
		return nil
	}
	var ws []fleet.WorkerView
	if err := json.Unmarshal([]byte(out), &ws); err != nil {
		t.Fatalf("hub %s: workers --json is not JSON: %v\n%s", h.name, err, out)
	}
	return ws
}

// readyPIDs are h's ready workers' engine PIDs by worker, once there are
// n of them (within the deadline).
func (h *clusterHub) readyPIDs(t *testing.T, n int, within time.Duration) map[string]int {
	t.Helper()
	var ws []fleet.WorkerView
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		ws = h.workers(t)
		pids := map[string]int{}
		for _, w := range ws {
			if w.State == fleet.WorkerReady && w.PID > 0 {
				pids[w.Name()] = w.PID
			}
		}
		if len(pids) == n {
			return pids
		}
	}
	t.Fatalf("hub %s does not see %d ready workers within %s: %+v", h.name, n, within, ws)
	return nil
}

// waitStatus waits until h's status is ok and returns how long it took.
func (h *clusterHub) waitStatus(t *testing.T, what string, within time.Duration, ok func(clusterStatus) bool) time.Duration {
	t.Helper()
	start := time.Now()
	var last clusterStatus
	for deadline := start.Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if s, answered := h.status(t); answered {
			last = s
			if ok(s) {
				return time.Since(start)
			}
		}
	}
	t.Fatalf("hub %s: not %s within %s; last status %+v", h.name, what, within, last)
	return 0
}

// enginesOf are the PIDs of the simulated engines run from any of dirs.
func enginesOf(dirs ...string) []int {
	var pids []int
	for _, d := range dirs {
		pids = append(pids, simsOf(d)...)
	}
	slices.Sort(pids)
	return pids
}

// loadResult is one request of the load through the virtual IP.
type loadResult struct {
	sent, done time.Time
	// refused counts the attempts whose connection was refused (nothing
	// was sent), each retried as the OpenAI and Anthropic SDKs retry a
	// connection error by default: up to 2 more times, after 0.5 s, then 1 s.
	refused int
	err     error
}

// vipLoad sends one streamed chat completion through base every 200 ms
// until stop is closed.
type vipLoad struct {
	base, key string
	client    *http.Client
	mu        sync.Mutex
	results   []loadResult
	wg        sync.WaitGroup
}

func (l *vipLoad) run(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second / 5)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			r := l.one(i)
			l.mu.Lock()
			l.results = append(l.results, r)
			l.mu.Unlock()
		}()
	}
}

func (l *vipLoad) one(i int) loadResult {
	r := loadResult{sent: time.Now()}
	backoff := []time.Duration{500 * time.Millisecond, time.Second}
	for {
		r.err = streamedChat(l.client, l.base, l.key, i)
		var op *net.OpError
		if r.err != nil && errors.As(r.err, &op) && op.Op == "dial" && r.refused < len(backoff) {
			time.Sleep(backoff[r.refused])
			r.refused++
			continue
		}
		r.done = time.Now()
		return r
	}
}

// between are the results of requests sent in [from, to).
func (l *vipLoad) between(from, to time.Time) []loadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rs []loadResult
	for _, r := range l.results {
		if !r.sent.Before(from) && r.sent.Before(to) {
			rs = append(rs, r)
		}
	}
	return rs
}

// streamedChat sends a streamed chat completion and reads it to [DONE].
func streamedChat(client *http.Client, base, key string, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"model":"qwen3-4b","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"request %d"}]}`, i)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b.String())
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return nil
		}
		if msg, isErr := openAIError(data); isErr {
			return fmt.Errorf("error in the stream: %s", msg)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the stream ended without [DONE]")
}

// tally counts rs: answered at the first attempt, answered after retrying
// refused connections, failed; inFlight are the failures of requests sent
// before cut that ended after it (streams on a hub that died under them),
// counted apart.
func tally(rs []loadResult, cut time.Time) (first, retried, inFlight int, failed []loadResult) {
	for _, r := range rs {
		switch {
		case r.err == nil && r.refused == 0:
			first++
		case r.err == nil:
			retried++
		case !cut.IsZero() && r.sent.Before(cut) && !r.done.Before(cut):
			inFlight++
		default:
			failed = append(failed, r)
		}
	}
	return first, retried, inFlight, failed
}

// TestSeveralHubsFailOver is issue 20's "done when" for several hubs: three
// hubs on one PostgreSQL, each in a network namespace of its own on one
// bridge with keepalived moving a virtual IP to a healthy hub; two nodes,
// each an sshd in its own namespace, with a simulated engine each; the test
// as the client, sending a streamed chat completion through the virtual IP
// five times a second throughout. In turn:
//
//   - kill -9 of the leader, which also holds the virtual IP: at least 99%
//     of the requests sent in the minute around it are answered (a refused
//     connection retried as the SDKs do; streams in flight on the killed hub
//     counted apart), another hub leads, no engine is restarted or launched
//     twice (engine PIDs before = after);
//   - SIGSTOP of the new leader for 30 s, then SIGCONT: another hub leads;
//     the resumed one says it is a follower, and no engine was launched or
//     stopped;
//   - PostgreSQL stopped for 20 s: every hub still answers on its own
//     address, an action is refused with a message that says why and is
//     not carried out later, the usage counted meanwhile is written once
//     the database is back, and the engines are the same;
//   - a key revoked on one hub is refused by the other (the time is
//     logged; the issue asks for within 1 s).
//
// The time to a new leader and the success rates are logged, not asserted:
// they are the figures the issue asks for, on a shared machine.
func TestSeveralHubsFailOver(t *testing.T) {
	vrrptest.Skip(t)
	if _, err := os.Stat(sshdtest.Path); err != nil {
		t.Skipf("OpenSSH server not installed (%s missing): install openssh-server", sshdtest.Path)
	}
	pg := pgtest.StartCluster(t)
	bridge := netnstest.NewBridge(t)

	var file strings.Builder
	file.WriteString("nodes:\n")
	var nodeNames []string
	for _, name := range []string{"rig", "max"} {
		ns := bridge.Join(t)
		s := sshdtest.NewOn(t, ns.IP, ns.Command())
		s.Start()
		fmt.Fprintf(&file, "  - name: %s\n    address: %s\n    identity: %s\n", name, s.Address(), s.Identity())
		nodeNames = append(nodeNames, name)
	}
	file.WriteString(sshFleetModel)
	fmt.Fprintf(&file, "placements:\n  - model: qwen3-4b\n    nodes: [%s]\n    engine: sim\n", strings.Join(nodeNames, ", "))
	fleetFile := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	const port = 8080 // every hub's, in its own namespace, as on machines of their own
	nss := []*netnstest.Namespace{bridge.Join(t), bridge.Join(t), bridge.Join(t)}
	names := []string{"hub1", "hub2", "hub3"}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	// Off loopback a hub requires an API key: made before any hub runs,
	// with the database's URL in the environment.
	keys := map[string]string{}
	for _, k := range []string{"client", "outage"} {
		cmd := exec.Command(fleetBin, "key", "create", k, "--data", dirs[0])
		cmd.Env = append(os.Environ(), "FLEET_DATABASE_URL="+pg.URL())
		out, err := cmd.CombinedOutput()
		key := strings.TrimSpace(strings.Split(string(out), "\n")[0])
		if err != nil || !strings.HasPrefix(key, "fk-") {
			t.Fatalf("key create %s: %v: %s", k, err, out)
		}
		keys[k] = key
	}

	hubs := []*clusterHub{startClusterHub(t, nss[0], names[0], dirs[0], port, pg.URL(), "--fleet", fleetFile)}
	waitControl(t, hubs[0].data)
	hubs[0].waitStatus(t, "the leader", 60*time.Second, func(s clusterStatus) bool { return s.HubRole == "leader" && s.Leader == "hub1" })
	pids := hubs[0].readyPIDs(t, 2, 90*time.Second)
	engines := enginesOf(hubs[0].data)
	if len(engines) != 2 {
		t.Fatalf("%d simulated engines run, want 2 (one per node): %v", len(engines), engines)
	}
	for i := 1; i < 3; i++ {
		hubs = append(hubs, startClusterHub(t, nss[i], names[i], dirs[i], port, pg.URL()))
	}
	for _, h := range hubs[1:] {
		waitControl(t, h.data)
		h.waitStatus(t, "a follower of hub1", 60*time.Second, func(s clusterStatus) bool { return s.HubRole == "follower" && s.Leader == "hub1" })
		if got := h.readyPIDs(t, 2, 60*time.Second); !maps.Equal(got, pids) {
			t.Fatalf("follower %s sees workers %v, the leader %v", h.name, got, pids)
		}
	}

	if s, _ := hubs[0].status(t); len(s.Hubs) != 3 {
		t.Errorf("hub1's status lists the hubs %+v, want hub1, hub2 and hub3", s.Hubs)
	}
	for _, h := range hubs {
		code, body := h.healthz(t, port)
		var said struct{ Role string }
		if role := map[bool]string{true: "leader", false: "follower"}[h == hubs[0]]; code != http.StatusOK || json.Unmarshal([]byte(body), &said) != nil || said.Role != role {
			t.Errorf("hub %s's /healthz: HTTP %d %q, want 200 with role %q", h.name, code, body, role)
		}
	}

	vip := bridge.NewIP()
	members := vrrptest.Members(bridge, vip, nss...)
	for i := range members {
		members[i].HealthURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", port)
	}
	ks := vrrptest.StartGroup(t, nss, members)
	load := &vipLoad{base: "http://" + net.JoinHostPort(vip, strconv.Itoa(port)), key: keys["client"], client: &http.Client{}}
	if err := streamedChat(load.client, load.base, load.key, -1); err != nil {
		t.Fatalf("no answer through the virtual IP: %v", err)
	}
	stopLoad := make(chan struct{})
	go load.run(stopLoad)
	loadStopped := false
	defer func() {
		if !loadStopped {
			close(stopLoad)
			load.wg.Wait()
		}
	}()

	sameEngines := func(when string, leader *clusterHub) {
		t.Helper()
		if got := leader.readyPIDs(t, 2, 60*time.Second); !maps.Equal(got, pids) {
			t.Errorf("%s: workers' engine PIDs %v, were %v: an engine was restarted", when, got, pids)
		}
		if got := enginesOf(dirs...); !slices.Equal(got, engines) {
			t.Errorf("%s: simulated engines %v, were %v: one was launched or stopped", when, got, engines)
		}
	}
	leaderAmong := func(hs []*clusterHub) *clusterHub {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			for _, h := range hs {
				if s, ok := h.status(t); ok && s.HubRole == "leader" && s.Leader == h.name {
					return h
				}
			}
		}
		t.Fatalf("none of %v leads within 60 s", hs)
		return nil
	}

	// kill -9 of the leader holding the virtual IP, 15 s into a minute.
	phase := time.Now()
	time.Sleep(15 * time.Second)
	if hs := vrrptest.Holders(ks); !slices.Equal(hs, []int{0}) {
		t.Fatalf("the virtual IP is on %v, want on hub1 (the leader) alone", hs)
	}
	hubs[0].cmd.Process.Kill()
	killed := time.Now()
	hubs[0].cmd.Wait()
	leader := leaderAmong(hubs[1:])
	newLeaderAfter := time.Since(killed)
	time.Sleep(time.Until(phase.Add(60 * time.Second)))
	rs := load.between(phase, phase.Add(60*time.Second))
	first, retried, inFlight, failed := tally(rs, killed)
	counted := len(rs) - inFlight
	t.Logf("kill -9 of the leader holding the virtual IP: %s leads %s later; %d requests in the minute: %d answered at once, %d after retrying a refused connection (%.1f%% answered), %d in flight on the killed hub, %d failed; the virtual IP is on %v",
		leader.name, newLeaderAfter.Round(10*time.Millisecond), len(rs), first, retried, 100*float64(first+retried)/float64(max(counted, 1)), inFlight, len(failed), vrrptest.Holders(ks))
	if counted == 0 || float64(first+retried) < 0.99*float64(counted) {
		for _, r := range failed {
			t.Logf("failed: sent %s after the kill: %v", r.sent.Sub(killed).Round(time.Millisecond), r.err)
		}
		t.Errorf("%d of %d requests answered through the kill -9 of the leader, want at least 99%%", first+retried, counted)
	}
	sameEngines("after kill -9 of the leader", leader)

	// SIGSTOP of the leader for 30 s, then SIGCONT.
	var other *clusterHub
	for _, h := range hubs[1:] {
		if h != leader {
			other = h
		}
	}
	heldVIP := slices.Equal(vrrptest.Holders(ks), []int{slices.Index(hubs, leader)})
	phase = time.Now()
	if err := leader.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took := other.waitStatus(t, "the leader while "+leader.name+" is stopped", 30*time.Second, func(s clusterStatus) bool { return s.HubRole == "leader" && s.Leader == other.name })
	time.Sleep(time.Until(phase.Add(30 * time.Second)))
	if err := leader.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	leader.waitStatus(t, "a follower once resumed", 30*time.Second, func(s clusterStatus) bool { return s.HubRole == "follower" && s.Leader == other.name })
	time.Sleep(time.Until(resumed.Add(10 * time.Second)))
	rs = load.between(phase, time.Now())
	first, retried, _, failed = tally(rs, time.Time{})
	t.Logf("SIGSTOP of leader %s (holding the virtual IP: %v) for 30 s: %s leads %s later; %d requests meanwhile: %d answered at once, %d after retrying a refused connection, %d failed (a request the stopped hub had accepted waits until the address moves away)",
		leader.name, heldVIP, other.name, took.Round(10*time.Millisecond), len(rs), first, retried, len(failed))
	sameEngines("after SIGSTOP and SIGCONT of the leader", other)
	if s, _ := leader.status(t); s.HubRole != "follower" {
		t.Errorf("the resumed hub %s says it is %q, want follower", leader.name, s.HubRole)
	}
	follower := leader
	leader = other

	// PostgreSQL stopped for 20 s.
	phase = time.Now()
	pg.Stop()
	stopped := time.Now()
	// Past the leader's lease, so no hub leads while the database is away.
	time.Sleep(8 * time.Second)
	direct := &http.Client{}
	const outageRequests = 3
	for _, h := range hubs[1:] {
		for i := range outageRequests {
			if err := streamedChat(direct, "http://"+net.JoinHostPort(h.ns.IP, strconv.Itoa(port)), keys["outage"], i); err != nil {
				t.Errorf("hub %s does not route with the database stopped: %v", h.name, err)
			}
		}
	}
	worker := nodeNames[0] + "/qwen3-4b"
	for _, h := range []*clusterHub{leader, follower} {
		out, code := h.ctl("drain", worker)
		t.Logf("drain on %s with the database stopped: exit %d: %s", h.name, code, strings.TrimSpace(out))
		// Refused either because no hub leads or because the database
		// does not answer; either way the message names what to look at.
		if code == 0 || !(strings.Contains(out, "lease") || strings.Contains(out, "postgres://")) {
			t.Errorf("drain on %s with the database stopped: exit %d, %q; want it refused, naming the lease or the database", h.name, code, out)
		}
	}
	time.Sleep(time.Until(stopped.Add(20 * time.Second)))
	pg.Start()
	back := time.Now()
	leader = leaderAmong(hubs[1:])
	t.Logf("PostgreSQL back: %s leads %s later", leader.name, time.Since(back).Round(10*time.Millisecond))
	time.Sleep(5 * time.Second)
	rs = load.between(phase, time.Now())
	first, retried, _, failed = tally(rs, time.Time{})
	t.Logf("PostgreSQL stopped 20 s: %d requests through the virtual IP: %d answered at once, %d after retrying a refused connection, %d failed",
		len(rs), first, retried, len(failed))
	if len(failed) > 0 {
		for _, r := range failed {
			t.Logf("failed: sent %s after the database stopped: %v", r.sent.Sub(stopped).Round(time.Millisecond), r.err)
		}
		t.Errorf("%d requests through the virtual IP failed while the database was stopped; the hubs must keep routing", len(failed))
	}
	sameEngines("after PostgreSQL stopped 20 s", leader)
	for _, w := range leader.workers(t) {
		if w.Name() == worker && w.State != fleet.WorkerReady {
			t.Errorf("%s is %s after the database returned: the drain refused while it was away was carried out", worker, w.State)
		}
	}
	want := int64(outageRequests * 2)
	var got int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if got = usageOf(t, leader, "outage"); got >= want {
			break
		}
	}
	if got != want {
		t.Errorf("usage of key outage is %d requests after the database returned, want %d (counted while it was away)", got, want)
	}

	// A key revoked on one hub is refused by the others.
	var revoker *clusterHub
	for _, h := range hubs[1:] {
		if h != leader {
			revoker = h
		}
	}
	if out, code := revoker.ctl("key", "revoke", "outage"); code != 0 {
		t.Fatalf("key revoke on %s: exit %d: %s", revoker.name, code, out)
	}
	revoked := time.Now()
	for _, h := range []*clusterHub{revoker, leader} {
		base := "http://" + net.JoinHostPort(h.ns.IP, strconv.Itoa(port))
		for {
			err := streamedChat(direct, base, keys["outage"], 0)
			if err != nil && strings.HasPrefix(err.Error(), "HTTP 401") {
				t.Logf("key outage revoked on %s: refused by %s %s later", revoker.name, h.name, time.Since(revoked).Round(time.Millisecond))
				break
			}
			if time.Since(revoked) > 30*time.Second {
				t.Fatalf("key outage revoked on %s is still not refused by %s 30 s later: %v", revoker.name, h.name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	close(stopLoad)
	load.wg.Wait()
	loadStopped = true
}

// healthz is what GET /healthz on h's own address answers.
func (h *clusterHub) healthz(t *testing.T, port int) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + net.JoinHostPort(h.ns.IP, strconv.Itoa(port)) + "/healthz")
	if err != nil {
		t.Fatalf("hub %s's /healthz: %v", h.name, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// usageOf is the number of requests `fleet usage --by key` counts for key
// in the last hour, as h reads it from the database.
func usageOf(t *testing.T, h *clusterHub, key string) int64 {
	t.Helper()
	out, code := h.ctl("usage", "--by", "key", "--since", "1h", "--json")
	if code != 0 {
		return -1
	}
	var u struct {
		Usage []fleet.Usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &u); err != nil {
		t.Fatalf("usage --json is not JSON: %v\n%s", err, out)
	}
	var n int64
	for _, row := range u.Usage {
		if row.Key == key {
			n += row.Requests
		}
	}
	return n
}
