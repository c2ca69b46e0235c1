package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fleet"
)

// These tests drive the console the way an operator does: the real OpenSSH
// client under a real terminal (tmux), against `fleet serve --demo`. They
// prove what the in-process emulator tests cannot: PTY allocation, TERM and
// key handling by OpenSSH, host-key pinning across a restart, and exit
// statuses as a shell script sees them.

// sshKey makes an ed25519 key pair with ssh-keygen and returns the private
// key's path and the public key line.
func sshKey(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	path := filepath.Join(dir, name)
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen for %s: %v\n%s", name, err, out)
	}
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return path, strings.TrimSpace(string(pub))
}

// sshClient is how the test calls OpenSSH: one port, one known_hosts file.
type sshClient struct {
	port       int
	knownHosts string
}

// args is the ssh command line for key, checking the host key with strict
// ("accept-new" or "yes").
func (c sshClient) args(key, strict string, tty bool) []string {
	a := []string{"-F", "/dev/null"}
	if tty {
		a = append(a, "-tt")
	}
	return append(a, "-p", fmt.Sprint(c.port), "-i", key,
		"-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking="+strict, "-o", "UserKnownHostsFile="+c.knownHosts,
		"-o", "SetEnv=COLORTERM=truecolor", "-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=10", "127.0.0.1")
}

// run runs one remote command (no terminal) and returns its output and the
// exit status of the ssh client.
func (c sshClient) run(t *testing.T, key, strict string, remote ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(c.args(key, strict, false), remote...)...)
	var o, e bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running ssh: %v", err)
	}
	return o.String(), e.String(), code
}

// shellQuote quotes s for the sh -c that tmux runs.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// tmuxServer is a private tmux server (its own socket), so the test never
// touches a user's tmux and two test runs never share one.
type tmuxServer struct {
	t    *testing.T
	sock string
}

func newTmux(t *testing.T) *tmuxServer {
	t.Helper()
	// A socket path of our own (not -L, whose socket tmux leaves behind in
	// /tmp/tmux-UID), short enough for a unix socket address.
	dir, err := os.MkdirTemp("", "fleet-tmux")
	if err != nil {
		t.Fatal(err)
	}
	s := &tmuxServer{t: t, sock: filepath.Join(dir, "sock")}
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-S", s.sock, "kill-server").Run()
		os.RemoveAll(dir)
	})
	return s
}

func (s *tmuxServer) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", s.sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// open starts a 200x50 window running argv; when argv exits the window
// prints its exit status and stays, so a failed login can be read.
func (s *tmuxServer) open(name string, argv []string) {
	s.t.Helper()
	s.openSized(name, 200, 50, argv)
}

// openSized is open with a window of width x height.
func (s *tmuxServer) openSized(name string, width, height int, argv []string) {
	s.t.Helper()
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	s.tmux("new-session", "-d", "-s", name, "-x", fmt.Sprint(width), "-y", fmt.Sprint(height),
		strings.Join(quoted, " ")+"; echo EXIT:$?; sleep 600")
	// Esc must reach the console at once, not after tmux's 500 ms wait.
	s.tmux("set", "-s", "escape-time", "0")
}

// keys sends key names (Enter, Escape, …); literal sends text as typed.
func (s *tmuxServer) keys(name string, keys ...string) {
	s.t.Helper()
	s.tmux(append([]string{"send-keys", "-t", name}, keys...)...)
}

func (s *tmuxServer) literal(name, text string) {
	s.t.Helper()
	s.tmux("send-keys", "-t", name, "-l", text)
}

func (s *tmuxServer) screen(name string) string {
	s.t.Helper()
	return s.tmux("capture-pane", "-t", name, "-p")
}

// waitFor polls the screen until ok holds; within is a hang guard.
func (s *tmuxServer) waitFor(name, what string, within time.Duration, ok func(screen string) bool) string {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		scr := s.screen(name)
		if ok(scr) {
			return scr
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("session %s: %s did not show within %s; the screen:\n%s", name, what, within, scr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tableRows maps node name → its row in the worker table on a screen.
func tableRows(screen string, nodes ...string) (map[string]string, []string) {
	rows := map[string]string{}
	var order []string
	for _, line := range strings.Split(screen, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !slices.Contains(nodes, f[0]) {
			continue
		}
		if _, seen := rows[f[0]]; !seen {
			order = append(order, f[0])
		}
		rows[f[0]] = line
	}
	return rows, order
}

// streamOnce is streamChat for goroutines: it returns an error instead of
// failing the test, and the SSE data payloads it read.
func streamOnce(ctx context.Context, base string, maxTokens int) ([]string, error) {
	body := fmt.Sprintf(`{"model":"qwen3-4b","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":"tell me a long story"}]}`, maxTokens)
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, data)
		}
	}
	return events, sc.Err()
}

func workerOn(ws []fleet.WorkerView, node string) (fleet.WorkerView, bool) {
	for _, w := range ws {
		if w.Node == node {
			return w, true
		}
	}
	return fleet.WorkerView{}, false
}

func auditJSON(t *testing.T, data string) []fleet.AuditEntry {
	t.Helper()
	out, code := fleetCmd(t, data, "audit", "--json", "--limit", "500")
	if code != 0 {
		t.Fatalf("fleet audit --json: exit %d: %s", code, out)
	}
	var es []fleet.AuditEntry
	if err := json.Unmarshal([]byte(out), &es); err != nil {
		t.Fatalf("audit --json is not JSON: %v\n%s", err, out)
	}
	return es
}

func TestConsoleOverOpenSSH(t *testing.T) {
	for _, bin := range []string{"ssh", "ssh-keygen", "tmux"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (apt-get install -y openssh-client tmux): this test drives the real OpenSSH client inside tmux", bin)
		}
	}
	data := t.TempDir()
	keys := t.TempDir()
	adminKey, adminPub := sshKey(t, keys, "admin")
	operatorKey, operatorPub := sshKey(t, keys, "operator")
	viewerKey, viewerPub := sshKey(t, keys, "viewer")
	strangerKey, _ := sshKey(t, keys, "stranger")
	adminKeys := filepath.Join(keys, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(adminPub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	httpPort, sshPort := freePort(t), freePort(t)
	serveFlags := []string{"--ssh", fmt.Sprintf("127.0.0.1:%d", sshPort), "--admin-keys", adminKeys, "--ssh-rate=-1"}
	h := startHub(t, data, httpPort, serveFlags...)
	base := "http://" + h.http
	ssh := sshClient{port: sshPort, knownHosts: filepath.Join(keys, "known_hosts")}

	waitReady(t, data, 3, 120*time.Second)

	// The first connection records the host key; the admin comes from --admin-keys.
	if out, errOut, code := ssh.run(t, adminKey, "accept-new", "whoami"); code != 0 || !strings.Contains(out, "(admin)") {
		t.Fatalf("admin whoami over ssh: exit %d: %s%s", code, out, errOut)
	}
	// A user's own theme is stored for their next session; a wrong name says which exist.
	if out, errOut, code := ssh.run(t, adminKey, "yes", "theme", "high-contrast"); code != 0 {
		t.Errorf("theme high-contrast: exit %d: %s%s", code, out, errOut)
	}
	if _, errOut, code := ssh.run(t, adminKey, "yes", "theme", "purple"); code != 1 || !strings.Contains(errOut, "light") {
		t.Errorf("theme purple: exit %d, want 1 naming the themes: %s", code, errOut)
	}
	for _, u := range []struct{ name, role, pub string }{{"op", "operator", operatorPub}, {"viewer", "viewer", viewerPub}} {
		if out, code := fleetCmdIn(t, data, u.pub+"\n", "user", "add", u.name, "--role", u.role); code != 0 {
			t.Fatalf("user add %s: exit %d: %s", u.name, code, out)
		}
	}

	// An operator's console shows the three workers with their engines and
	// command lines, sorted max, rig, ultra.
	tm := newTmux(t)
	tm.open("op", append([]string{"ssh"}, ssh.args(operatorKey, "yes", true)...))
	nodes := []string{"max", "rig", "ultra"}
	scr := tm.waitFor("op", "the worker table with max, rig and ultra", 20*time.Second, func(s string) bool {
		rows, _ := tableRows(s, nodes...)
		return len(rows) == 3 && strings.Contains(s, "Started with")
	})
	rows, order := tableRows(scr, nodes...)
	if !slices.Equal(order, nodes) {
		t.Errorf("rows in order %v, want %v:\n%s", order, nodes, scr)
	}
	for node, want := range map[string][]string{
		"rig":   {"vLLM", "8x RTX 3060", "Linux", "vllm serve Qwen/Qwen3-4B-AWQ"},
		"ultra": {"llama.cpp", "Apple M1 Ultra", "macOS", "llama-server "},
		"max":   {"llama.cpp", "Apple M4 Max", "macOS", "llama-server "},
	} {
		for _, s := range want {
			if !strings.Contains(rows[node], s) {
				t.Errorf("%s's row lacks %q: %q", node, s, rows[node])
			}
		}
	}

	// `workers --json` over ssh is the same workers as the table: node
	// names, engines and the command line the table shows (as far as it fits).
	out, errOut, code := ssh.run(t, operatorKey, "yes", "workers", "--json")
	if code != 0 {
		t.Fatalf("ssh workers --json: exit %d: %s%s", code, out, errOut)
	}
	var remote []fleet.WorkerView
	if err := json.Unmarshal([]byte(out), &remote); err != nil {
		t.Fatalf("ssh workers --json is not JSON: %v\n%s", err, out)
	}
	if len(remote) != len(rows) {
		t.Fatalf("workers --json lists %d workers, the table %d", len(remote), len(rows))
	}
	for _, w := range remote {
		row, ok := rows[w.Node]
		if !ok {
			t.Errorf("workers --json has %s, the table does not", w.Name())
			continue
		}
		if !strings.Contains(row, " "+w.Engine.Label()+" ") || !strings.Contains(row, w.GPU) || !strings.Contains(row, string(w.State)) {
			t.Errorf("%s: JSON says %s on %s, %s; the table row is %q", w.Node, w.Engine.Label(), w.GPU, w.State, row)
		}
		argv := strings.Join(w.Argv, " ")
		i := strings.Index(row, w.Argv[0]+" ")
		if i < 0 {
			t.Errorf("%s: the table does not show the command line %q: %q", w.Node, argv, row)
			continue
		}
		shown := strings.TrimRight(row[i:], " …")
		if len(shown) < 24 || !strings.HasPrefix(argv, shown) {
			t.Errorf("%s: the table shows %q, workers --json says %q", w.Node, shown, argv)
		}
	}

	// A viewer's drain fails with exit 1, names the role needed, changes
	// nothing, and leaves exactly one audit line: the refusal.
	auditBefore := auditJSON(t, data)
	lastID := int64(0)
	if n := len(auditBefore); n > 0 {
		lastID = auditBefore[n-1].ID
	}
	out, errOut, code = ssh.run(t, viewerKey, "yes", "drain", "ultra")
	if code != 1 || !strings.Contains(errOut, "operator") || !strings.Contains(errOut, "permission denied") {
		t.Errorf("viewer's drain: exit %d, stdout %q, stderr %q; want exit 1 naming the operator role", code, out, errOut)
	}
	if u, _ := workerOn(workersJSON(t, data), "ultra"); u.Drained || u.State != fleet.WorkerReady {
		t.Errorf("a refused drain changed ultra: drained %v, state %s", u.Drained, u.State)
	}
	var fresh []fleet.AuditEntry
	for _, e := range auditJSON(t, data) {
		if e.ID > lastID {
			fresh = append(fresh, e)
		}
	}
	if len(fresh) != 1 || fresh[0].User != "viewer" || fresh[0].Action != "drain" || fresh[0].Target != "ultra" || !strings.HasPrefix(fresh[0].Outcome, "denied") {
		t.Errorf("the refused drain wrote %d audit lines, want exactly one denial by viewer: %+v", len(fresh), fresh)
	}

	// A key that is no user's is refused by the server: OpenSSH exits 255.
	if out, errOut, code := ssh.run(t, strangerKey, "yes", "whoami"); code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Errorf("unknown key: exit %d, %q %q; want 255 and Permission denied", code, out, errOut)
	}

	// A second session (the viewer's) watches while the operator drains.
	tm.open("watch", append([]string{"ssh"}, ssh.args(viewerKey, "yes", true)...))
	tm.waitFor("watch", "the viewer's worker table", 20*time.Second, func(s string) bool {
		rows, _ := tableRows(s, nodes...)
		return len(rows) == 3 && strings.Contains(rows["ultra"], "ready")
	})
	// Put the operator's cursor on ultra with the filter.
	tm.literal("op", "/ultra")
	tm.keys("op", "Enter")
	tm.waitFor("op", "the table filtered to ultra", 10*time.Second, func(s string) bool {
		rows, _ := tableRows(s, nodes...)
		return len(rows) == 1 && rows["ultra"] != ""
	})

	// Streamed requests in flight, some of them on ultra.
	ultraBefore := requestsTo(t, base, "ultra/qwen3-4b")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // hang guard
	defer cancel()
	const streams = 8
	results := make([][]string, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = streamOnce(ctx, base, 300)
		}()
	}
	var inFlightAtDrain int
	deadline := time.Now().Add(15 * time.Second)
	for {
		if u, _ := workerOn(workersJSON(t, data), "ultra"); u.InFlight > 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatalf("none of %d concurrent streams reached ultra within 15 s: %+v", streams, workersJSON(t, data))
		}
		time.Sleep(50 * time.Millisecond)
	}
	tm.literal("op", "d")
	tm.waitFor("op", "the drain confirmation", 10*time.Second, func(s string) bool { return strings.Contains(s, "Drain ultra/qwen3-4b?") })
	tm.literal("op", "y")
	deadline = time.Now().Add(10 * time.Second)
	for {
		u, _ := workerOn(workersJSON(t, data), "ultra")
		if u.Drained && u.State == fleet.WorkerDraining {
			inFlightAtDrain = u.InFlight
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ultra not drained 10 s after y: %+v", u)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if inFlightAtDrain == 0 {
		t.Errorf("ultra's streams had finished before the drain took effect, so this run proves nothing about in-flight requests")
	}
	// The second session sees it too.
	tm.waitFor("watch", "ultra draining in the second session", 10*time.Second, func(s string) bool {
		rows, _ := tableRows(s, nodes...)
		// "draining" while ultra's streams run, "drained" once they ended.
		return strings.Contains(rows["ultra"], " drain") && strings.Contains(rows["rig"], "ready")
	})

	t.Logf("ultra drained with %d requests in flight", inFlightAtDrain)

	// Every stream completes, ultra's in-flight ones included.
	wg.Wait()
	for i := range streams {
		if errs[i] != nil {
			t.Fatalf("stream %d: %v", i, errs[i])
		}
		if n := len(results[i]); n < 10 || results[i][n-1] != "[DONE]" {
			t.Fatalf("stream %d did not complete: %d events, last %q", i, n, results[i][max(n-1, 0)])
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		if u, _ := workerOn(workersJSON(t, data), "ultra"); u.InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ultra still has requests in flight 10 s after every stream ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ultraAfterStreams := requestsTo(t, base, "ultra/qwen3-4b")
	if got := ultraAfterStreams - ultraBefore; got < max(inFlightAtDrain, 1) {
		t.Errorf("ultra answered %d of the streams, but had %d in flight when drained", got, inFlightAtDrain)
	} else {
		t.Logf("ultra answered %d of the %d streams", got, streams)
	}

	// No new request reaches the drained worker, even under concurrency.
	var wg2 sync.WaitGroup
	newErrs := make([]error, 6)
	for i := range newErrs {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			ev, err := streamOnce(ctx, base, 40)
			if err == nil && (len(ev) == 0 || ev[len(ev)-1] != "[DONE]") {
				err = fmt.Errorf("stream ended without [DONE] after %d events", len(ev))
			}
			newErrs[i] = err
		}()
	}
	wg2.Wait()
	for i, err := range newErrs {
		if err != nil {
			t.Errorf("request %d after the drain: %v", i, err)
		}
	}
	if after := requestsTo(t, base, "ultra/qwen3-4b"); after != ultraAfterStreams {
		t.Errorf("the router sent %d new requests to drained ultra", after-ultraAfterStreams)
	}

	// Restart the hub on the same data dir and port: the host key is the
	// same, so strict host-key checking against the old known_hosts passes.
	tm.tmux("kill-session", "-t", "watch")
	tm.tmux("kill-session", "-t", "op")
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Wait(); err != nil {
		t.Logf("hub exited after SIGTERM: %v", err)
	}
	startHub(t, data, httpPort, serveFlags...)
	deadline = time.Now().Add(20 * time.Second)
	for {
		out, errOut, code := ssh.run(t, operatorKey, "yes", "whoami")
		if code == 0 && strings.Contains(out, "op (operator)") {
			break
		}
		if strings.Contains(errOut, "Host key verification failed") || strings.Contains(errOut, "IDENTIFICATION HAS CHANGED") {
			t.Fatalf("the host key changed across a restart:\n%s", errOut)
		}
		if time.Now().After(deadline) {
			t.Fatalf("ssh after the restart: exit %d: %s%s", code, out, errOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
