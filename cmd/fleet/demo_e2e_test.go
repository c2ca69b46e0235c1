package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	"fleet/internal/testbin"
)

// fleetBin is the fleet binary built once for the end-to-end tests.
var fleetBin string

// e2eParallel is how many end-to-end tests marked t.Parallel run at once
// when -parallel is not given. They spend their minutes waiting on hubs
// and engines, not on the CPU, so Go's default (GOMAXPROCS, 2 on a CI
// machine) would leave the machine idle for most of the package's run.
const e2eParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(e2eParallel))
	}
	os.Exit(testbin.Main(m, "fleet-e2e-bin", func(dir string) (err error) {
		fleetBin, err = testbin.Build(dir, "fleet", ".")
		return err
	}))
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// enginePorts gives each test's hubs engine ports of their own, apart from
// every other test's and from the default 18000-18999 that other packages'
// tests use. The tests run four at once (e2eParallel), every demo hub's
// engines bind the loopback, and with one shared range an engine of one
// test took the port another test's hub had just found free: that hub
// recovers (it launches again on another port), but a test about applying
// a fleet file then waits on a recovery it is not about, for as long as a
// loaded machine takes. The hubs of one test share its range, as the hubs
// of one fleet share its nodes' ports (a restarted hub, a follower taking
// over, adopt the engines where they are). A test about ports sets
// --engine-ports itself.
var enginePorts = struct {
	sync.Mutex
	next int
	of   map[string]fleet.PortRange
}{next: enginePortsFrom, of: map[string]fleet.PortRange{}}

const (
	// enginePortsFrom and enginePortsTo are past the default range, past
	// the 20000-27999 that tests choosing their own --engine-ports draw
	// from (TestEnginePortsFromTheFleetFileAndTheHub), and below Linux's
	// ephemeral ports (32768 up), which freePort and every outgoing
	// connection draw from.
	enginePortsFrom, enginePortsTo = 28000, 32767
	// enginePortsEach is more ports than any test's fleet has engines,
	// with room for a port lost to a process outside the tests.
	enginePortsEach = 20
)

// enginePortsOf is the engine port range of t's hubs: of its top-level
// test, so the hubs its subtests start share it too.
func enginePortsOf(t testing.TB) fleet.PortRange {
	test, _, _ := strings.Cut(t.Name(), "/")
	return enginePortsFor(test)
}

// enginePortsFor is the engine port range of the fleet named key: a
// top-level test's, or one run's of a test whose parallel runs are fleets
// of their own (the crash sweeps), which an engine of another run must not
// take a port from.
func enginePortsFor(key string) fleet.PortRange {
	enginePorts.Lock()
	defer enginePorts.Unlock()
	if r, ok := enginePorts.of[key]; ok {
		return r
	}
	r := fleet.PortRange{Min: enginePorts.next, Max: enginePorts.next + enginePortsEach - 1}
	if r.Max > enginePortsTo {
		// More tests than the space holds (a -count of a few): start
		// again from the bottom, whose tests ended long ago, rather
		// than stray into ephemeral ports.
		r = fleet.PortRange{Min: enginePortsFrom, Max: enginePortsFrom + enginePortsEach - 1}
	}
	enginePorts.next = r.Max + 1
	enginePorts.of[key] = r
	return r
}

// hubProc is a `fleet serve` child process.
type hubProc struct {
	cmd  *exec.Cmd
	data string
	http string
}

// startHub starts `fleet serve --demo` with extra flags.
func startHub(t testing.TB, data string, httpPort int, extra ...string) *hubProc {
	t.Helper()
	return launchHub(t, data, httpPort, append([]string{"--demo"}, extra...)...)
}

// launchHub starts `fleet serve` on data with the router on httpPort; no
// SSH console unless the flags ask for one. Its log is printed if the test fails.
func launchHub(t testing.TB, data string, httpPort int, flags ...string) *hubProc {
	t.Helper()
	return launchHubEnv(t, data, httpPort, nil, flags...)
}

// launchHubEnv is launchHub with env (KEY=VALUE) added to this hub's
// environment only: tests that set it this way, not with t.Setenv, can run
// in parallel.
func launchHubEnv(t testing.TB, data string, httpPort int, env []string, flags ...string) *hubProc {
	t.Helper()
	h := &hubProc{data: data, http: fmt.Sprintf("127.0.0.1:%d", httpPort)}
	// Registered before the hub's own cleanup, so it runs after the hub has
	// stopped and cannot relaunch what it kills: engines outlive their hub.
	t.Cleanup(func() { killSimsOf(data) })
	args := []string{"--data", data, "serve", "--http", h.http}
	if !slices.ContainsFunc(flags, func(a string) bool { return strings.HasPrefix(a, "--ssh") }) {
		args = append(args, "--ssh=")
	}
	if !slices.ContainsFunc(flags, func(a string) bool { return strings.HasPrefix(a, "--engine-ports") }) {
		args = append(args, "--engine-ports", enginePortsOf(t).String())
	}
	h.cmd = exec.Command(fleetBin, append(args, flags...)...)
	if env != nil {
		h.cmd.Env = append(os.Environ(), env...)
	}
	out, err := os.Create(filepath.Join(data, fmt.Sprintf("hub-%d.log", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	h.cmd.Stdout, h.cmd.Stderr = out, out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			h.cmd.Process.Signal(syscall.SIGTERM)
			h.cmd.Wait()
		}
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("hub log %s:\n%s", filepath.Base(out.Name()), b)
		}
	})
	return h
}

// fleetCmd runs a hub command through the control socket.
func fleetCmd(t testing.TB, data string, args ...string) (string, int) {
	t.Helper()
	return fleetCmdIn(t, data, "", args...)
}

// fleetCmdIn is fleetCmd with standard input; it returns the combined output
// and the exit status.
func fleetCmdIn(t testing.TB, data string, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(fleetBin, append([]string{"--data", data}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

func workersJSON(t *testing.T, data string) []fleet.WorkerView {
	t.Helper()
	out, code := fleetCmd(t, data, "workers", "--json")
	if code != 0 {
		return nil
	}
	var ws []fleet.WorkerView
	if err := json.Unmarshal([]byte(out), &ws); err != nil {
		t.Fatalf("workers --json is not JSON: %v\n%s", err, out)
	}
	return ws
}

// waitReady waits until n workers are ready and returns them.
func waitReady(t *testing.T, data string, n int, within time.Duration) []fleet.WorkerView {
	t.Helper()
	deadline := time.Now().Add(within)
	var ws []fleet.WorkerView
	for time.Now().Before(deadline) {
		ws = workersJSON(t, data)
		ready := 0
		for _, w := range ws {
			if w.State == fleet.WorkerReady {
				ready++
			}
		}
		if ready == n {
			return ws
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%d workers not ready within %s: %+v", n, within, ws)
	return nil
}

// killSimsOf kills every simulated engine run from data's fleet binary,
// found by its command line. Never by a PID or process group remembered
// from earlier: once an engine is gone its number is reused (pid_max is
// 32768 here), and killing a recycled group could take down anything.
//
// A launch the stopped hub left in flight (its node script runs on) can start
// an engine after one scan; such a straggler held the next test's port in a
// CI-like run. So it scans until three scans in a row, 200 ms apart, find
// nothing (about 5 s at most).
func killSimsOf(data string) {
	for quiet, tries := 0, 0; quiet < 3 && tries < 25; tries++ {
		pids := simsOf(data)
		if len(pids) == 0 {
			quiet++
		} else {
			quiet = 0
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// simsOf lists the PIDs whose command line is `DATA/…/fleet sim …`.
func simsOf(data string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		argv := strings.Split(string(b), "\x00")
		if len(argv) > 1 && strings.HasPrefix(argv[0], data+"/") && argv[1] == "sim" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// streamChat sends a streamed chat completion and returns the SSE data
// payloads with the time each arrived.
func streamChat(t *testing.T, base string, maxTokens int) ([]string, []time.Time) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"qwen3-4b","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: HTTP %d: %s", resp.StatusCode, b)
	}
	var events []string
	var at []time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			events = append(events, data)
			at = append(at, time.Now())
		}
	}
	return events, at
}

func TestDemoServesStreamsAndSurvivesKill9(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	port := freePort(t)
	h := startHub(t, data, port)
	base := "http://" + h.http

	// Within 15 s /v1/models lists the model (the promise for a fresh clone).
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(base + "/v1/models")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.Contains(string(b), `"qwen3-4b"`) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/models did not list qwen3-4b within 15 s (err %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ws := waitReady(t, data, 3, 120*time.Second)
	byNode := map[string]fleet.WorkerView{}
	for _, w := range ws {
		byNode[w.Node] = w
	}
	if byNode["rig"].Engine != fleet.EngineVLLM || byNode["ultra"].Engine != fleet.EngineLlamaCpp || byNode["max"].Engine != fleet.EngineLlamaCpp {
		t.Fatalf("engines not chosen from the platforms: %+v", ws)
	}
	if got := strings.Join(byNode["ultra"].Argv, " "); !strings.HasPrefix(got, "llama-server ") || !strings.Contains(got, "--reasoning-format none") {
		t.Errorf("ultra's command line is not the llama-server one: %s", got)
	}
	if got := strings.Join(byNode["rig"].Argv, " "); !strings.HasPrefix(got, "vllm serve Qwen/Qwen3-4B-AWQ") || !strings.Contains(got, "--max-model-len 16384") {
		t.Errorf("rig's command line is not the vLLM one: %s", got)
	}
	if byNode["max"].GPU != "Apple M4 Max" || byNode["max"].Host != "macOS" || byNode["rig"].GPU != "8x RTX 3060" {
		t.Errorf("platform labels: %+v", byNode)
	}

	// A streamed chat completion arrives chunk by chunk, with a final usage chunk.
	events, at := streamChat(t, base, 24)
	if len(events) < 10 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream: %d events, last %q", len(events), events[len(events)-1])
	}
	if !strings.Contains(events[len(events)-2], `"usage"`) || !strings.Contains(events[len(events)-2], `"choices":[]`) {
		t.Errorf("no final usage chunk: %s", events[len(events)-2])
	}
	if !at[len(at)-1].After(at[0]) {
		t.Errorf("all chunks arrived at once: the stream was buffered")
	}

	// kill -9 the hub: engines keep running.
	pids := map[string]int{}
	for _, w := range ws {
		pids[w.Name()] = w.PID
	}
	h.cmd.Process.Kill()
	h.cmd.Wait()
	for name, pid := range pids {
		if !alive(pid) {
			t.Fatalf("engine %s (PID %d) died with the hub", name, pid)
		}
	}

	// The same command again adopts them: same PIDs, no second engine.
	restartAdopts(t, data, port, pids)
}

// restartAdopts starts the demo hub again on data and checks that it adopts
// the three engines it finds (by PID, none launched again) and serves.
func restartAdopts(t *testing.T, data string, port int, pids map[string]int) {
	t.Helper()
	h := startHub(t, data, port)
	for _, w := range waitReady(t, data, 3, 120*time.Second) {
		if pids[w.Name()] != w.PID {
			t.Errorf("%s: PID %d after restart, was %d: not adopted", w.Name(), w.PID, pids[w.Name()])
		}
	}
	if n := len(simsOf(data)); n != 3 {
		t.Errorf("%d simulated engines running after the restart, want 3", n)
	}
	if events, _ := streamChat(t, "http://"+h.http, 8); len(events) < 3 {
		t.Errorf("router does not serve after adoption")
	}
}

// requestsTo reads the router's request counter for one backend.
func requestsTo(t *testing.T, base, backend string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "fleet_router_requests_total{") && strings.Contains(line, `backend="`+backend+`"`) {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			n += int(v)
		}
	}
	return n
}

func TestDemoEngineDeathLeavesReadySet(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	h := startHub(t, data, freePort(t))
	base := "http://" + h.http
	ws := waitReady(t, data, 3, 120*time.Second)
	var ultra fleet.WorkerView
	for _, w := range ws {
		if w.Node == "ultra" {
			ultra = w
		}
	}
	// kill(-0) and kill(-1) would signal this test's own group or every
	// process there is; a worker that reports either is a failure, not a target.
	if ultra.PGID <= 1 || ultra.PGID == syscall.Getpgrp() {
		t.Fatalf("ultra's worker reports engine group %d, which is not an engine's own: %+v", ultra.PGID, ultra)
	}
	if err := syscall.Kill(-ultra.PGID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing ultra's engine group %d: %v", ultra.PGID, err)
	}
	// Its worker leaves the ready set…
	deadline := time.Now().Add(20 * time.Second)
	for {
		var state fleet.WorkerState
		for _, w := range workersJSON(t, data) {
			if w.Node == "ultra" {
				state = w.State
			}
		}
		if state != fleet.WorkerReady {
			t.Logf("ultra is %s after its engine died", state)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ultra still ready 20 s after its engine was killed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// …and the router stops sending to it: every request succeeds elsewhere.
	before := requestsTo(t, base, ultra.Name())
	for i := 0; i < 6; i++ {
		if events, _ := streamChat(t, base, 4); events[len(events)-1] != "[DONE]" {
			t.Fatalf("request %d did not complete after ultra died", i)
		}
	}
	if after := requestsTo(t, base, ultra.Name()); after != before {
		t.Errorf("router sent %d requests to the dead worker", after-before)
	}
}

func TestApplyRemovesAPlacementAndStopsItsEngine(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	startHub(t, data, freePort(t))
	ws := waitReady(t, data, 3, 120*time.Second)
	var maxPID int
	for _, w := range ws {
		if w.Node == "max" {
			maxPID = w.PID
		}
	}
	exported, code := fleetCmd(t, data, "export")
	if code != 0 {
		t.Fatalf("export: exit %d: %s", code, exported)
	}
	smaller := strings.Replace(exported, "[rig, ultra, max]", "[rig, ultra]", 1)
	if smaller == exported {
		t.Fatalf("export does not list the demo placement as expected:\n%s", exported)
	}
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	os.WriteFile(file, []byte(smaller), 0o600)

	plan, code := fleetCmd(t, data, "apply", "--dry-run", "-f", file)
	if code != 0 || !strings.Contains(plan, "- placement qwen3-4b on max") {
		t.Fatalf("dry run: exit %d:\n%s", code, plan)
	}
	if now := workersJSON(t, data); len(now) != 3 {
		t.Fatalf("a dry run changed the fleet: %d workers", len(now))
	}
	// A broken file names the file and line, and changes nothing.
	bad := filepath.Join(t.TempDir(), "broken.yaml")
	os.WriteFile(bad, []byte(strings.Replace(smaller, "args:", "agrs:", 1)), 0o600)
	if out, code := fleetCmd(t, data, "apply", "-f", bad); code != 1 || !strings.Contains(out, "broken.yaml:") || !strings.Contains(out, "unknown key 'agrs'") {
		t.Fatalf("broken file: exit %d: %s", code, out)
	}
	if out, code := fleetCmd(t, data, "apply", "-f", file); code != 0 {
		t.Fatalf("apply: exit %d: %s", code, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		now := workersJSON(t, data)
		if len(now) == 2 && !alive(maxPID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("max's worker still listed or its engine (PID %d, alive %v) still running: %+v", maxPID, alive(maxPID), now)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, _ := fleetCmd(t, data, "export"); !strings.Contains(out, "[rig, ultra]") {
		t.Errorf("export after apply:\n%s", out)
	}
}

func TestRouterRefusesToOpenWithoutKeysAndChecksThem(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	// Open on the LAN with no key: refused before anything listens.
	out, err := exec.Command(fleetBin, "--data", data, "serve", "--http", "0.0.0.0:0", "--ssh=").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "fleet key create") {
		t.Fatalf("a hub open on the LAN without keys started, or did not say how to make one: %v\n%s", err, out)
	}
	port := freePort(t)
	h := startHub(t, data, port)
	waitReady(t, data, 3, 120*time.Second)
	key, code := fleetCmd(t, data, "key", "create", "ci")
	key = strings.TrimSpace(strings.Split(key, "\n")[0])
	if code != 0 || !strings.HasPrefix(key, "fk-") {
		t.Fatalf("key create: exit %d: %q", code, key)
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	h.cmd.Wait()
	h = startHub(t, data, port, "--require-keys")
	waitReady(t, data, 3, 120*time.Second)
	body := `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		key  string
		want int
	}{{"", 401}, {"fk-wrong", 401}, {key, 200}} {
		req, _ := http.NewRequest("POST", "http://"+h.http+"/v1/chat/completions", strings.NewReader(body))
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("key %q: HTTP %d, want %d: %s", tc.key, resp.StatusCode, tc.want, b)
		}
		if tc.want == 401 && !strings.Contains(string(b), `"error"`) {
			t.Errorf("401 is not OpenAI-shaped: %s", b)
		}
	}
	if out, code := fleetCmd(t, data, "key", "list"); code != 0 || !strings.Contains(out, "ci") || strings.Contains(out, key) {
		t.Errorf("key list (must name the key, never show it): exit %d\n%s", code, out)
	}
}
