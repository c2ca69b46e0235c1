package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/bench/sweep"
)

// TestEverydayCommands runs the demo hub and the fleet binary as an operator
// would: `status` says where everything is, `logs` prints a worker's engine
// log and `logs -f` follows it until the client is interrupted, after which
// no tail is left on the node; bash completes worker names from the hub.
func TestEverydayCommands(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	port := freePort(t)
	startHub(t, data, port)
	waitReady(t, data, 3, 120*time.Second)

	out, code := fleetCmd(t, data, "status", "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d\n%s", code, out)
	}
	var st struct {
		Version string  `json:"version"`
		DataDir string  `json:"data_dir"`
		Uptime  float64 `json:"uptime_s"`
		Router  string  `json:"router"`
		Workers []struct {
			State string `json:"state"`
			Count int    `json:"count"`
		} `json:"workers"`
		Models []struct {
			ID    string `json:"id"`
			Ready int    `json:"ready"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if st.Router != fmt.Sprintf("http://127.0.0.1:%d/v1", port) || st.DataDir != data || st.Uptime <= 0 || !strings.HasPrefix(st.Version, "dev") {
		t.Errorf("status: router %q, data %q, uptime %v, version %q; want the hub's own", st.Router, st.DataDir, st.Uptime, st.Version)
	}
	if len(st.Workers) != 1 || st.Workers[0].State != "ready" || st.Workers[0].Count != 3 || len(st.Models) != 1 || st.Models[0].Ready != 3 {
		t.Errorf("status counts workers %+v and models %+v; want 3 ready workers of qwen3-4b", st.Workers, st.Models)
	}
	if out, code := fleetCmd(t, data, "status"); code != 0 || !strings.Contains(out, "3: 3 ready") {
		t.Errorf("status: exit %d\n%s", code, out)
	}

	// The demo's vLLM worker reports the prompt tokens it reused (its
	// recipe carries --enable-prompt-tokens-details), so a multi-turn bench
	// shows a cache hit, not n/a; a run through the router is kept, and
	// the model's history lists it with its workers' runs.
	bench := exec.Command(fleetBin, "--data", data, "bench", "rig", "--split", "agent", "--turns", "2", "--levels", "1", "--requests", "2", "--tokens", "4", "--json")
	var benchErr strings.Builder
	bench.Stderr = &benchErr
	raw, err := bench.Output()
	var res sweep.Result
	if err != nil || json.Unmarshal(raw, &res) != nil || len(res.Levels) != 1 {
		t.Fatalf("bench rig --json: %v\n%s%s", err, raw, benchErr.String())
	}
	if l := res.Levels[0]; l.Requests != 2 || l.Failed != 0 || l.CacheHit == nil || *l.CacheHit <= 0 {
		t.Errorf("bench rig, one session of 2 turns: %d requests (%d failed), cache hit %v; want 2 and the second turn's reuse", l.Requests, l.Failed, l.CacheHit)
	}
	if out, code := fleetCmd(t, data, "bench", "qwen3", "--levels", "1", "--requests", "1", "--tokens", "4"); code != 0 {
		t.Fatalf("bench qwen3: exit %d\n%s", code, out)
	}
	if out, code := fleetCmd(t, data, "bench", "--history", "qwen3-4b"); code != 0 || !strings.Contains(out, "qwen3 via router") || !strings.Contains(out, "agent, 2 turns") {
		t.Errorf("bench --history qwen3-4b: exit %d, want the run through the router and rig's:\n%s", code, out)
	}

	out, code = fleetCmd(t, data, "logs", "-n", "1", "max/qwen3-4b")
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "sim engine ready") {
		t.Errorf("logs -n 1: exit %d, want the engine's last line:\n%s", code, out)
	}

	// logs -f through the control socket, interrupted as Ctrl-C does, and
	// as a service manager stops it.
	followThenInterrupt(t, data, "max/qwen3-4b", filepath.Join(data, "nodes", "max", "max-qwen3-4b.log"), syscall.SIGINT)
	followThenInterrupt(t, data, "max/qwen3-4b", filepath.Join(data, "nodes", "max", "max-qwen3-4b.log"), syscall.SIGTERM)

	// bash, with the script `fleet completion bash` prints, completes a
	// worker name from the running hub.
	const bashCompletion = "/usr/share/bash-completion/bash_completion"
	if _, err := os.Stat(bashCompletion); err != nil {
		t.Skipf("bash-completion is not installed (%s), which cobra's bash script needs: install it (apt install bash-completion) to test completion in bash", bashCompletion)
	}
	script := filepath.Join(t.TempDir(), "fleet.bash")
	if out, code := fleetCmd(t, data, "completion", "bash"); code != 0 {
		t.Fatalf("completion bash: exit %d\n%s", code, out)
	} else if err := os.WriteFile(script, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	bash := exec.Command("bash", "-c", `source `+bashCompletion+`; source "$1"; COMP_LINE="fleet --data $2 logs max/"; COMP_WORDS=(fleet --data "$2" logs max/); COMP_CWORD=4; COMP_POINT=${#COMP_LINE}; __start_fleet 2>/dev/null; printf '%s\n' "${COMPREPLY[@]}"`, "bash", script, data)
	bash.Env = append(os.Environ(), "PATH="+filepath.Dir(fleetBin)+":"+os.Getenv("PATH"))
	// compopt complains outside a real completion (stderr, silenced above).
	got, err := bash.Output()
	if err != nil || strings.TrimSpace(string(got)) != "max/qwen3-4b" {
		t.Errorf("bash completion of `fleet logs max/`: %v, %q; want max/qwen3-4b", err, got)
	}
}

// TestLogsFollowOnAnSSHNode: `fleet logs -f` of a worker on an SSH node
// (a real sshd) tails the log on the node through the hub's SSH connection,
// and interrupting the client ends that tail on the node.
func TestLogsFollowOnAnSSHNode(t *testing.T) {
	t.Parallel()
	f := startSSHFleet(t, "remote")
	waitWorker(t, f.data, "remote/qwen3-4b", "ready", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
	followThenInterrupt(t, f.data, "remote/qwen3-4b", "remote-qwen3-4b.log", syscall.SIGINT)
}

// followThenInterrupt runs `fleet logs -f WORKER`, checks that it prints and
// that one tail of the log (named by logMark in its command line) runs on
// the node, sends the client sig (SIGINT as Ctrl-C does), checks that it
// ends silently with 128+sig as shells expect (130, 143), and waits for
// that tail to be gone.
func followThenInterrupt(t *testing.T, data, worker, logMark string, sig syscall.Signal) {
	t.Helper()
	follow := exec.Command(fleetBin, "--data", data, "logs", "-f", "-n", "1", worker)
	var stderr strings.Builder
	follow.Stderr = &stderr
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("logs -f printed nothing: %v", err)
	}
	tails := func() []string { return procsWith("tail", logMark) }
	if len(tails()) != 1 {
		t.Fatalf("after logs -f printed %q: tails of %s on the node %q, want one", line, logMark, tails())
	}
	follow.Process.Signal(sig)
	err = follow.Wait()
	if code := follow.ProcessState.ExitCode(); code != 128+int(sig) || stderr.Len() > 0 {
		t.Errorf("logs -f after %v: %v, exit %d, stderr %q; want exit %d and nothing said", sig, err, code, stderr.String(), 128+int(sig))
	}
	interrupted := time.Now()
	deadline := interrupted.Add(30 * time.Second)
	for len(tails()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("30s after logs -f was interrupted, tails still run on the node: %q", tails())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the tail on the node ended %v after the client was interrupted", time.Since(interrupted).Round(100*time.Millisecond))
}

// procsWith lists the command lines of processes named name whose command
// line mentions s.
func procsWith(name, s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, _ := os.ReadFile(filepath.Join(d, "comm"))
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && strings.TrimSpace(string(comm)) == name && strings.Contains(string(b), s) {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}
