package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"fleet"
)

// The hostile viewer of issue 19, all at once: one viewer floods refused
// commands over SSH, types a 50,000-character console filter over a real
// ssh+tmux session, leaves streaming requests unread and sends many 15 MiB
// bodies at the router, while a second viewer account exports the fleet
// and lists its models over and over. Meanwhile an operator drains a
// worker. Each fix of issue 19 has its own test; this one shows they hold
// together: the hub stays under hostileRSSLimit and the operator's drain
// works and is audited.
//
// FLEET_HOSTILE_SERVE_FLAGS adds flags to the hub's serve (the later flag
// wins), to see the test fail with a defence off, e.g.
// FLEET_HOSTILE_SERVE_FLAGS='--write-timeout=-1' or
// '--bodies-in-flight-mib=-1 --key-bodies-in-flight-mib=-1'.

// hostileRSSLimit is the bound on the hub's peak resident memory.
const hostileRSSLimit = 400_000_000

const (
	// hostileBodyKeys API keys each send hostileBodiesPerKey bodies of
	// hostileBodyBytes, held open before their last byte: with the default
	// bounds (128 MiB in all, 32 MiB a key) the first two of each of the
	// first four keys are held (120 MiB), the third of those keys gets 429,
	// and every body of the last two keys 503.
	hostileBodyKeys     = 6
	hostileBodiesPerKey = 3
	hostileBodyBytes    = 15 << 20
	// hostileNeverReaders hold every slot of the fleet's two workers
	// (the instant profile has 4 each) until the write timeout cuts them.
	hostileNeverReaders = 8
	// hostileFilterChars is what the viewer types into the console's filter.
	hostileFilterChars = 50_000
	// hostileMaxRefusals bounds the refusal flood; it also stops when
	// the rest is done.
	hostileMaxRefusals = 1500
	// hostileAliasedModels unplaced models name one 60 KiB model path
	// through a YAML alias: about 0.9 MiB once expanded, just under
	// fleetfile.MaxExpandedBytes, which is what every export writes.
	hostileAliasedModels = 15
)

// hostileFleetFile is two nodes of the sim's instant profile (their engines
// answer as fast as the router takes tokens, so a client that reads nothing
// fills its connection's buffers at once) serving qwen3-4b, and
// hostileAliasedModels models nobody serves that make the stored fleet
// nearly as large as a fleet file may expand to.
func hostileFleetFile() string {
	var b strings.Builder
	b.WriteString(`nodes:
  - name: rig
    address: sim:instant
  - name: ultra
    address: sim:instant
models:
  - id: qwen3-4b
    context: 65536
    memory_gb: 1
    recipes:
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
`)
	for i := range hostileAliasedModels {
		fmt.Fprintf(&b, "  - id: big%d\n    context: 4096\n    recipes:\n      llamacpp:\n", i)
		if i == 0 {
			fmt.Fprintf(&b, "        model: &big /models/%s.gguf\n", strings.Repeat("x", 60<<10))
		} else {
			b.WriteString("        model: *big\n")
		}
	}
	b.WriteString("placements:\n  - model: qwen3-4b\n    nodes: [rig, ultra]\n")
	return b.String()
}

// procStatusBytes reads a "Name:   N kB" line of /proc/PID/status, in bytes.
func procStatusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s line", pid, field)
}

// procCPU is the CPU time a process has used, user and system.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// metricValue sums a counter's series on the router's /metrics whose
// labels contain every one of labels ("bound=\"key\"").
func metricValue(t *testing.T, base, key, name string, labels ...string) float64 {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: HTTP %d: %s", resp.StatusCode, b)
	}
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// neverReadingStream sends a streamed chat request on a raw connection with
// a small receive buffer and never reads the answer. The caller closes it.
func neverReadingStream(addr, key string) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"model":"qwen3-4b","stream":true,"max_tokens":60000,"messages":[{"role":"user","content":"tell me everything"}]}`
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// heldBody is a request body sent but for its last byte; answer gives the
// router's status once that byte has gone (0 if none came).
type heldBody struct {
	conn   net.Conn
	last   []byte
	answer chan int
}

// finish sends the last byte and waits for the answer.
func (hb *heldBody) finish() int {
	defer hb.conn.Close()
	if _, err := hb.conn.Write(hb.last); err != nil {
		return 0
	}
	return <-hb.answer
}

// sendHugeBody sends a chat request of size bytes, all but its last byte,
// and says whether the router took it (read it: the write completes only
// when the router reads, as a connection's buffers hold far less) or
// refused it (answered without reading; its status is returned).
func sendHugeBody(addr, key string, size int) (*heldBody, int, error) {
	const head, tail = `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"`, `"}]}`
	body := bytes.Repeat([]byte{'a'}, size)
	copy(body, head)
	copy(body[size-len(tail):], tail)
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, 0, err
	}
	_ = conn.SetDeadline(time.Now().Add(120 * time.Second)) // hang guard
	answer := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			answer <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answer <- resp.StatusCode
	}()
	_, werr := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", key, size)
	if werr == nil {
		_, werr = conn.Write(body[:size-1])
	}
	if werr == nil {
		select {
		case status := <-answer:
			conn.Close()
			return nil, 0, fmt.Errorf("the router read the body but answered %d before its last byte", status)
		default:
		}
		return &heldBody{conn: conn, last: body[size-1:], answer: answer}, 0, nil
	}
	status := <-answer
	conn.Close()
	if status == 0 {
		return nil, 0, fmt.Errorf("the router neither read the body nor answered: %w", werr)
	}
	return nil, status, nil
}

func TestHostileViewer(t *testing.T) {
	for _, bin := range []string{"ssh", "ssh-keygen", "tmux"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (apt-get install -y openssh-client tmux): this test drives the real OpenSSH client inside tmux", bin)
		}
	}
	data, keys := t.TempDir(), t.TempDir()
	adminKey, adminPub := sshKey(t, keys, "admin")
	opKey, opPub := sshKey(t, keys, "op")
	malloryKey, malloryPub := sshKey(t, keys, "mallory")
	mallory2Key, mallory2Pub := sshKey(t, keys, "mallory2")
	adminKeys := filepath.Join(keys, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(adminPub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fleetFile := filepath.Join(keys, "hostile.yaml")
	if err := os.WriteFile(fleetFile, []byte(hostileFleetFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	httpPort, sshPort := freePort(t), freePort(t)
	flags := []string{"--fleet", fleetFile, "--ssh", fmt.Sprintf("127.0.0.1:%d", sshPort), "--admin-keys", adminKeys,
		// Every client here comes from 127.0.0.1: the per-address rate of
		// new connections would limit the operator with the attacker.
		"--ssh-rate=-1",
		"--require-keys", "--write-timeout", "2s",
		// The held bodies wait for their last byte while the others are
		// sent: on a busy machine that may pass the default 20 s.
		"--body-timeout", "90s"}
	if extra := os.Getenv("FLEET_HOSTILE_SERVE_FLAGS"); extra != "" {
		t.Logf("FLEET_HOSTILE_SERVE_FLAGS: serve also gets %s", extra)
		flags = append(flags, strings.Fields(extra)...)
	}
	// Users and API keys first, on a hub that does not yet require keys
	// (one that does refuses to start without any).
	first := launchHub(t, data, httpPort, "--fleet", fleetFile)
	waitControl(t, data)
	for _, u := range []struct{ name, role, pub string }{{"op", "operator", opPub}, {"mallory", "viewer", malloryPub}, {"mallory2", "viewer", mallory2Pub}} {
		if out, code := fleetCmdIn(t, data, u.pub+"\n", "user", "add", u.name, "--role", u.role); code != 0 {
			t.Fatalf("user add %s: exit %d: %s", u.name, code, out)
		}
	}
	apiKey := func(name string) string {
		out, code := fleetCmd(t, data, "key", "create", name)
		key := strings.TrimSpace(strings.Split(out, "\n")[0])
		if code != 0 || !strings.HasPrefix(key, "fk-") {
			t.Fatalf("key create %s: exit %d: %q", name, code, out)
		}
		return key
	}
	opAPIKey := apiKey("op")
	malloryAPIKeys := make([]string, hostileBodyKeys)
	for i := range malloryAPIKeys {
		malloryAPIKeys[i] = apiKey(fmt.Sprintf("mallory-%d", i))
	}
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()

	h := launchHub(t, data, httpPort, flags...)
	base := "http://" + h.http
	pid := h.cmd.Process.Pid
	waitReady(t, data, 2, 120*time.Second)

	ssh := sshClient{port: sshPort, knownHosts: filepath.Join(keys, "known_hosts")}
	if out, errOut, code := ssh.run(t, adminKey, "accept-new", "whoami"); code != 0 || !strings.Contains(out, "(admin)") {
		t.Fatalf("admin whoami over ssh: exit %d: %s%s", code, out, errOut)
	}
	auditBefore := auditJSON(t, data)
	var lastAuditID int64
	if n := len(auditBefore); n > 0 {
		lastAuditID = auditBefore[n-1].ID
	}

	// Peak resident memory as sampled (VmHWM, read at the end, is the
	// kernel's own peak; the samples show when it was reached).
	var peakSampled atomic.Int64
	// mark logs the hub's resident memory now and its peak so far, so a
	// failure says which step of the attack raised it.
	mark := func(step string) {
		rss, _ := procStatusBytes(pid, "VmRSS")
		hwm, _ := procStatusBytes(pid, "VmHWM")
		t.Logf("%s: hub RSS %.0f MB, peak so far %.0f MB", step, float64(rss)/1e6, float64(hwm)/1e6)
	}
	mark("before the attack")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second) // hang guard
	defer cancel()
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopAll := func() { stopOnce.Do(func() { close(stop) }) }
	var wg sync.WaitGroup
	// Whatever way the test ends, its goroutines and their ssh clients
	// end before the hub is stopped (ctx is cancelled after this).
	defer func() { stopAll(); wg.Wait() }()
	// stopped says whether the attack is over (or the hang guard hit).
	stopped := func() bool {
		select {
		case <-stop:
			return true
		case <-ctx.Done():
			return true
		default:
			return false
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, err := procStatusBytes(pid, "VmRSS"); err == nil && rss > peakSampled.Load() {
				peakSampled.Store(rss)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	// 1. The refusal flood: mallory runs `drain ultra` over and over, four
	// at a time, multiplexed on one SSH connection (OpenSSH's
	// ControlMaster), as a script would.
	muxDir, err := os.MkdirTemp("", "fleet-mux")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(muxDir)
	muxSock := filepath.Join(muxDir, "m")
	master := exec.CommandContext(ctx, "ssh", append([]string{"-M", "-N", "-o", "ControlPath=" + muxSock, "-o", "ControlPersist=no"}, ssh.args(malloryKey, "yes", false)...)...)
	if err := master.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = master.Process.Kill(); _ = master.Wait() }()
	var refused, throttled, floodOther atomic.Int64
	var floodOtherText atomic.Value
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"-o", "ControlPath=" + muxSock, "-o", "ControlMaster=no"}, ssh.args(malloryKey, "yes", false)...)
			args = append(args, "drain", "ultra")
			for !stopped() && refused.Load()+throttled.Load() < hostileMaxRefusals {
				var errOut bytes.Buffer
				cmd := exec.CommandContext(ctx, "ssh", args...)
				cmd.Stderr = &errOut
				err := cmd.Run()
				switch e := errOut.String(); {
				case strings.Contains(e, "too many refused commands"):
					throttled.Add(1)
				case strings.Contains(e, "permission denied"):
					refused.Add(1)
				default:
					floodOther.Add(1)
					floodOtherText.Store(fmt.Sprintf("%v: %s", err, e))
				}
			}
		}()
	}

	// 2. The filter flood: mallory's console, a 50,000-character filter.
	tm := newTmux(t)
	tm.open("mallory", append([]string{"ssh"}, ssh.args(malloryKey, "yes", true)...))
	nodes := []string{"rig", "ultra"}
	tm.waitFor("mallory", "mallory's worker table", 60*time.Second, func(s string) bool {
		rows, _ := tableRows(s, nodes...)
		return len(rows) == 2
	})
	tm.literal("mallory", "/")
	// tmux takes a command of 16 KiB at most: the text goes in pieces, as
	// a paste into a terminal does.
	for sent := 0; sent < hostileFilterChars; sent += 8000 {
		tm.literal("mallory", strings.Repeat("x", min(8000, hostileFilterChars-sent)))
	}

	// 3. Streams nobody reads, holding every slot of the fleet.
	var readers []net.Conn
	defer func() {
		for _, c := range readers {
			c.Close()
		}
	}()
	for range hostileNeverReaders {
		c, err := neverReadingStream(h.http, malloryAPIKeys[0])
		if err != nil {
			t.Fatalf("a never-reading stream: %v", err)
		}
		readers = append(readers, c)
	}

	// 4. Exports and model lists by mallory's second account, three at a
	// time (mallory's own are refused once the flood has her throttled).
	var exports, modelLists atomic.Int64
	var exportErr atomic.Value
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 20 && !stopped(); n++ {
				cmd := []string{"export"}
				if (n+i)%2 == 1 {
					cmd = []string{"models", "--json"}
				}
				var out, errOut bytes.Buffer
				c := exec.CommandContext(ctx, "ssh", append(ssh.args(mallory2Key, "yes", false), cmd...)...)
				c.Stdout, c.Stderr = &out, &errOut
				if err := c.Run(); err != nil || !strings.Contains(out.String(), fmt.Sprintf("big%d", hostileAliasedModels-1)) {
					exportErr.Store(fmt.Sprintf("%s: %v: %.300s %.300s", cmd, err, out.String(), errOut.String()))
					continue
				}
				if cmd[0] == "export" {
					exports.Add(1)
				} else {
					modelLists.Add(1)
				}
			}
		}()
	}

	// 5. Huge bodies, one at a time so the bounds' answers are known: each
	// is held (all but its last byte sent) until every one has been tried.
	var held []*heldBody
	statuses := map[int]int{}
	for k := range hostileBodyKeys {
		for range hostileBodiesPerKey {
			hb, status, err := sendHugeBody(h.http, malloryAPIKeys[k], hostileBodyBytes)
			if err != nil {
				t.Errorf("body %d of key %d: %v", len(held)+statuses[429]+statuses[503]+statuses[413], k, err)
				continue
			}
			if hb != nil {
				held = append(held, hb)
			} else {
				statuses[status]++
			}
		}
	}
	if _, status, err := sendHugeBody(h.http, malloryAPIKeys[hostileBodyKeys-1], 17<<20); err != nil || status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 17 MiB body: status %d, %v; want 413 (over the 16 MiB a body may have)", status, err)
	} else {
		statuses[status]++
	}

	mark(fmt.Sprintf("%d bodies of 15 MiB held", len(held)))

	// 6. The operator drains ultra over SSH in the middle of all this.
	for refused.Load()+throttled.Load() < 100 {
		if ctx.Err() != nil {
			t.Fatalf("the flood met only %d refusals before the hang guard; the last other outcome: %v", refused.Load()+throttled.Load(), floodOtherText.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, errOut, code := ssh.run(t, opKey, "yes", "drain", "ultra")
	if code != 0 {
		t.Errorf("the operator's drain ultra during the attack: exit %d: %s%s", code, out, errOut)
	}

	// Every held body's last byte goes at once, and their answers are read.
	var bodyWG sync.WaitGroup
	heldAnswers := make([]int, len(held))
	for i, hb := range held {
		bodyWG.Add(1)
		go func() {
			defer bodyWG.Done()
			heldAnswers[i] = hb.finish()
		}()
	}
	bodyWG.Wait()
	mark("the held bodies answered")

	// The filter is full at its cap, and the console still answers.
	typed := time.Now()
	scr := tm.waitFor("mallory", "the filter full at 128 characters", 60*time.Second, func(s string) bool {
		return strings.Contains(s, strings.Repeat("x", 128)) && strings.Contains(s, "the filter is full")
	})
	if strings.Contains(scr, strings.Repeat("x", 129)) {
		t.Errorf("the console's filter holds more than 128 characters:\n%s", scr)
	}
	t.Logf("the console showed its filter full %.1f s after the last piece was sent", time.Since(typed).Seconds())
	// Esc waits behind whatever of the 50,000 keys the console has not
	// read yet; on a busy machine one may come while the filter is still
	// being typed into, so it is sent again until the filter is gone (an
	// Esc too many clears nothing more).
	cleared, cpuBefore := time.Now(), procCPU(pid)
	for try := 0; ; try++ {
		tm.keys("mallory", "Escape")
		rows, _ := tableRows(tm.screen("mallory"), nodes...)
		deadline := time.Now().Add(15 * time.Second)
		for len(rows) < 2 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			rows, _ = tableRows(tm.screen("mallory"), nodes...)
		}
		if len(rows) == 2 {
			break
		}
		if try == 5 {
			t.Fatalf("mallory's console still shows no table 90 s after Esc; the screen:\n%s", tm.screen("mallory"))
		}
	}
	t.Logf("mallory's console cleared the filter %.1f s after the first Esc; the hub used %.1f s of CPU meanwhile", time.Since(cleared).Seconds(), (procCPU(pid) - cpuBefore).Seconds())
	tm.waitFor("mallory", "mallory's table with ultra drained", 60*time.Second, func(s string) bool {
		rows, _ := tableRows(s, nodes...)
		return len(rows) == 2 && strings.Contains(rows["ultra"], "drain")
	})

	// The never-read streams are cut and counted.
	deadline := time.Now().Add(60 * time.Second)
	cut := 0.0
	for {
		cut = metricValue(t, base, opAPIKey, "fleet_router_client_write_timeouts_total")
		if cut >= hostileNeverReaders || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if cut < hostileNeverReaders {
		t.Errorf("fleet_router_client_write_timeouts_total = %v after 60 s, want %d: the streams nobody reads were not cut", cut, hostileNeverReaders)
	}

	stopAll()
	wg.Wait()
	mark("the attack over")

	// Another user's request is served (by rig: ultra is drained).
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions",
		strings.NewReader(`{"model":"qwen3-4b","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+opAPIKey)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("the operator's request after the attack: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("the operator's request after the attack: HTTP %d: %s", resp.StatusCode, b)
		}
	}

	// The drain holds, and is audited as the operator's.
	if u, ok := workerOn(workersJSON(t, data), "ultra"); !ok || !u.Drained {
		t.Errorf("ultra after the operator's drain: %+v; want drained", u)
	}
	var fresh []fleet.AuditEntry
	for _, e := range auditJSON(t, data) {
		if e.ID > lastAuditID {
			fresh = append(fresh, e)
		}
	}
	drained, refusalRows, counted := false, 0, 0
	for _, e := range fresh {
		switch {
		case e.User == "op" && e.Action == "drain" && strings.HasPrefix(e.Target, "ultra") && e.Outcome == "ok":
			drained = true
		case e.User == "mallory":
			refusalRows++
			counted += e.Count
		}
	}
	if !drained {
		t.Errorf("the operator's drain has no audit line with outcome ok: %+v", fresh)
	}
	sent := int(refused.Load() + throttled.Load())
	if counted != sent {
		t.Errorf("mallory's audit lines count %d refusals; her ssh clients met %d", counted, sent)
	}
	// One line per user and action a minute; the test runs for about two.
	if refusalRows > 6 || len(fresh) > 20 {
		t.Errorf("the attack wrote %d audit lines (%d of them mallory's) for %d refusals; want a few counted lines:\n%+v", len(fresh), refusalRows, sent, fresh)
	}
	if throttled.Load() == 0 {
		t.Errorf("%d refusals in a row and mallory was never throttled", refused.Load())
	}
	if n := floodOther.Load(); n > 0 {
		t.Logf("%d of the flood's commands ended otherwise; the last: %v", n, floodOtherText.Load())
	}

	// The body bounds answered as they should, and /metrics agrees.
	wantHeld := int((128 << 20) / hostileBodyBytes) // the total bound's share
	if len(held) != wantHeld || statuses[429] != 4 || statuses[503] != hostileBodyKeys*hostileBodiesPerKey-wantHeld-4 || statuses[413] != 1 {
		t.Errorf("of %d bodies of 15 MiB: %d held, answers %v; want %d held, 4×429 (a key's third), %d×503 (past the total), 1×413 (the 17 MiB one)",
			hostileBodyKeys*hostileBodiesPerKey, len(held), statuses, wantHeld, hostileBodyKeys*hostileBodiesPerKey-wantHeld-4)
	}
	if k, tot := metricValue(t, base, opAPIKey, "fleet_router_bodies_refused_total", `bound="key"`), metricValue(t, base, opAPIKey, "fleet_router_bodies_refused_total", `bound="total"`); int(k) != statuses[429] || int(tot) != statuses[503] {
		t.Errorf("fleet_router_bodies_refused_total: key %v, total %v; the clients got %d×429, %d×503", k, tot, statuses[429], statuses[503])
	}
	if exports.Load() == 0 || modelLists.Load() == 0 {
		t.Errorf("mallory2's exports: %d, models --json: %d; the last failure: %v", exports.Load(), modelLists.Load(), exportErr.Load())
	}

	// The peak, read while the hub still runs.
	hwm, err := procStatusBytes(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hub peak RSS (VmHWM) %.0f MB, sampled peak %.0f MB; refusals %d (%d of them throttled) in %d audit lines of mallory's (%d new lines in all); "+
		"streams cut %v; bodies: %d held (answered %v once whole), refused %v; exports %d, models --json %d",
		float64(hwm)/1e6, float64(peakSampled.Load())/1e6, sent, throttled.Load(), refusalRows, len(fresh), cut, len(held), heldAnswers, statuses, exports.Load(), modelLists.Load())
	if hwm >= hostileRSSLimit {
		t.Errorf("the hub's peak RSS was %.0f MB, over the %d MB bound", float64(hwm)/1e6, hostileRSSLimit/1_000_000)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("the attack ran into the 150 s hang guard")
	}
}
