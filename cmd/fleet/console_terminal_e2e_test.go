package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// needTerminalTools skips a test that drives OpenSSH in tmux where they are
// not installed, except on CI, which installs them.
func needTerminalTools(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"ssh", "ssh-keygen", "tmux"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed; CI must install it (apt-get install -y openssh-client tmux)", bin)
			}
			t.Skipf("%s is not installed (apt-get install -y openssh-client tmux): this test drives the real OpenSSH client inside tmux", bin)
		}
	}
}

// consoleHub starts a demo hub with its console and an admin key, and
// waits for its three workers.
func consoleHub(t *testing.T) (h *hubProc, ssh sshClient, adminKey string) {
	t.Helper()
	data, keys := t.TempDir(), t.TempDir()
	adminKey, adminPub := sshKey(t, keys, "admin")
	adminKeys := filepath.Join(keys, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(adminPub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	httpPort, sshPort := freePort(t), freePort(t)
	h = startHub(t, data, httpPort, "--ssh", fmt.Sprintf("127.0.0.1:%d", sshPort), "--admin-keys", adminKeys, "--ssh-rate=-1")
	waitReady(t, data, 3, 120*time.Second)
	ssh = sshClient{port: sshPort, knownHosts: filepath.Join(keys, "known_hosts")}
	if out, errOut, code := ssh.run(t, adminKey, "accept-new", "whoami"); code != 0 {
		t.Fatalf("admin whoami over ssh: exit %d: %s%s", code, out, errOut)
	}
	return h, ssh, adminKey
}

// printedEscape matches an escape sequence a terminal showed as text
// instead of obeying it: the ESC written out as Go and Sanitize quote it,
// in caret notation, or a colour code that lost its ESC.
var printedEscape = regexp.MustCompile(`\\x1b|\\033|\\u001b|\\e\[|\^\[|\[[0-9;]{1,12}m`)

// checkTerminal fails on a printed escape sequence, and on a screen whose
// title bar is not on its first line (a line too wide wrapped).
func checkTerminal(t *testing.T, what, screen string) {
	t.Helper()
	if m := printedEscape.FindString(screen); m != "" {
		t.Fatalf("%s prints the escape sequence %q as text:\n%s", what, m, screen)
	}
	if first, _, _ := strings.Cut(screen, "\n"); !strings.Contains(first, "fleet") || !strings.Contains(first, "ready") {
		t.Fatalf("%s: the title bar is not on the first line:\n%s", what, screen)
	}
}

// Every panel of the console, as OpenSSH in a real terminal shows it, at
// 80x24 and 200x50: the worker table, the help, a worker's detail, a bench
// and its chart, and the shape diff of two marked workers. None may print
// an escape sequence instead of obeying it (the shape diff printed
// "\x1b[32m\x1b[1mSAME\x1b[0m"), and the 80-column table keeps what an
// operator reads: every figure, the command line's start, ? and q.
func TestConsolePanelsInARealTerminal(t *testing.T) {
	needTerminalTools(t)
	t.Parallel()
	h, ssh, adminKey := consoleHub(t)
	workers := workersJSON(t, h.data)
	tm := newTmux(t)
	for _, size := range []struct{ w, h int }{{80, 24}, {200, 50}} {
		name := fmt.Sprintf("c%dx%d", size.w, size.h)
		tm.openSized(name, size.w, size.h, append([]string{"ssh"}, ssh.args(adminKey, "yes", true)...))
		table := func(s string) bool {
			return strings.Contains(s, "Started with") && strings.Contains(s, "Apple M4 Max") && !strings.Contains(s, "Started with:")
		}
		s := tm.waitFor(name, "the worker table", 20*time.Second, table)
		checkTerminal(t, name+" worker table", s)
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		for _, col := range []string{"Node", "Model", "GPU", "State", "Load", "tok/s", "TTFT", "ITL", "Started with"} {
			if !strings.Contains(lines[1], col) {
				t.Errorf("%s: the header %q lacks %s", name, lines[1], col)
			}
		}
		rows, _ := tableRows(s, "max", "rig", "ultra")
		for node, row := range rows {
			w, _ := workerOn(workers, node)
			// At 80 columns the short form may end right after the
			// binary's name ("llama-server…").
			if !strings.Contains(row, " "+w.Argv[0]) {
				t.Errorf("%s: %s's row lacks the start of its command line %q: %q", name, node, w.Argv[0], row)
			}
		}
		if hints := strings.TrimRight(lines[len(lines)-1], " "); !strings.HasSuffix(hints, "? help  q quit") {
			t.Errorf("%s: the hint line %q does not end with ? help and q quit", name, hints)
		}

		tm.literal(name, "?")
		checkTerminal(t, name+" help", tm.waitFor(name, "the help", 10*time.Second, func(s string) bool { return strings.Contains(s, "Keys  (you are") }))
		tm.keys(name, "Escape")
		tm.waitFor(name, "the worker table", 10*time.Second, table)

		// The first row (max): its detail holds the whole command line.
		tm.keys(name, "Enter")
		s = tm.waitFor(name, "the detail of max", 10*time.Second, func(s string) bool {
			return strings.Contains(s, "max/qwen3-4b") && strings.Contains(s, "Started with:")
		})
		checkTerminal(t, name+" detail", s)
		maxW, _ := workerOn(workers, "max")
		if argv := strings.Join(maxW.Argv, " "); !strings.Contains(strings.Join(strings.Fields(s), " "), argv) {
			t.Errorf("%s: the detail does not show max's whole command line %q:\n%s", name, argv, s)
		}
		// A chat bench of max from its detail, whose chart lands there
		// (and stays: the second size shows the first one's).
		if size.w == 80 {
			tm.literal(name, "b")
			tm.waitFor(name, "the bench question", 10*time.Second, func(s string) bool { return strings.Contains(s, "which split?") })
			tm.literal(name, "c")
		}
		s = tm.waitFor(name, "the bench chart", 180*time.Second, func(s string) bool {
			return strings.Contains(s, "total tok/s by concurrency") && !strings.Contains(s, "benching max")
		})
		checkTerminal(t, name+" bench chart", s)
		tm.keys(name, "Escape")
		tm.waitFor(name, "the worker table", 10*time.Second, table)

		// Mark max and rig, then compare their shapes.
		tm.literal(name, "  ")
		tm.waitFor(name, "two marks", 10*time.Second, func(s string) bool {
			return strings.Contains(s, "•max ") && strings.Contains(s, "•rig ")
		})
		tm.literal(name, "s")
		s = tm.waitFor(name, "the shape diff", 120*time.Second, func(s string) bool { return strings.Contains(s, "Response shape: ") })
		checkTerminal(t, name+" shape diff", s)
		if !regexp.MustCompile(`Response shape: max\S* vs rig\S*: (SAME|DIFFERS)`).MatchString(s) {
			t.Errorf("%s: the shape diff has no verdict:\n%s", name, s)
		}
		tm.keys(name, "Escape")
		tm.waitFor(name, "the worker table", 10*time.Second, table)
		tm.literal(name, "q")
		tm.waitFor(name, "the console's exit", 10*time.Second, func(s string) bool { return strings.Contains(s, "EXIT:0") })
	}
}

// cpuSeconds is the user and system CPU time process pid has used, from
// /proc/PID/stat (fields 14 and 15, in USER_HZ ticks: 100 a second on
// Linux, whatever the kernel's own tick).
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces; the fields after it do not.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return (utime + stime) / 100
}

// A console opened through an OpenSSH ControlMaster (ControlPersist, as
// many ~/.ssh/config files have) whose terminal is closed: the master
// keeps the connection and closes only the session. The hub ended the
// console only when the connection went, and till then spun at a core
// resizing it to 0x0 from its closed window channel. Now the console ends
// with its session, and the hub's CPU over the next seconds is an idle
// hub's.
func TestConsoleBehindAControlMasterEndsWithItsTerminal(t *testing.T) {
	needTerminalTools(t)
	t.Parallel()
	h, ssh, adminKey := consoleHub(t)
	// A short directory: a unix socket path has ~100 bytes.
	ctlDir, err := os.MkdirTemp("", "fleet-cm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ctlDir)
	ctl := []string{"-o", "ControlPath=" + filepath.Join(ctlDir, "%C")}
	master := append([]string{"ssh", "-o", "ControlMaster=auto", "-o", "ControlPersist=120"}, ctl...)
	defer func() {
		// The master outlives the test otherwise, for ControlPersist.
		_ = exec.Command("ssh", append(append([]string{"-F", "/dev/null", "-p", fmt.Sprint(ssh.port)}, ctl...), "-O", "exit", "127.0.0.1")...).Run()
	}()
	tm := newTmux(t)
	tm.openSized("cm", 120, 30, append(master, ssh.args(adminKey, "yes", true)...))
	tm.waitFor("cm", "the worker table", 20*time.Second, func(s string) bool { return strings.Contains(s, "Started with") })

	// Close the terminal: the ssh in it dies, its master stays.
	tm.tmux("kill-session", "-t", "cm")
	check := exec.Command("ssh", append(append([]string{"-F", "/dev/null", "-p", fmt.Sprint(ssh.port)}, ctl...), "-O", "check", "127.0.0.1")...)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("the ControlMaster is gone, so this run proves nothing: %v: %s", err, out)
	}

	// The hub's CPU from then on: a spin takes a core, so most of the
	// window; an idle demo hub (its engines are processes of their own) a
	// few percent of it.
	pid := h.cmd.Process.Pid
	const window = 5 * time.Second
	before := cpuSeconds(t, pid)
	time.Sleep(window)
	used := cpuSeconds(t, pid) - before
	t.Logf("the hub used %.2f CPU-s in the %s after the console's terminal closed", used, window)
	if used > 0.2*window.Seconds() {
		t.Errorf("the hub used %.2f CPU-s in %s after the console's terminal closed: it spins", used, window)
	}

	// The hub ended the console: its log says so.
	deadline := time.Now().Add(20 * time.Second) // hang guard
	for !strings.Contains(hubLog(t, h.data), "console ended: the client closed its session") {
		if time.Now().After(deadline) {
			t.Fatalf("the hub did not end the console whose terminal closed behind a ControlMaster; its log:\n%s", hubLog(t, h.data))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hubLog is the log of the hubs run on data.
func hubLog(t *testing.T, data string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(data, "hub-*.log"))
	var all strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.String()
}
