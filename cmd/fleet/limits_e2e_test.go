package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// soloFleet is a one-node fleet with no placement: a hub serving it starts
// no engine, and it differs from the demo in every line.
const soloFleet = `nodes:
  - name: solo
    address: sim:m4max-llamacpp
models:
  - id: qwen3-4b
    context: 16384
    memory_gb: 1
    recipes:
      sim:
        profile: m4max-llamacpp
`

// waitControl waits until the hub on data answers its control socket.
func waitControl(t testing.TB, data string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, code := fleetCmd(t, data, "whoami")
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hub on %s never answered: %s", data, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runServe runs a `fleet serve` that is expected to refuse to start, and
// returns its output and exit status.
func runServe(t *testing.T, wrap []string, data string, flags ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	argv := append(append([]string{}, wrap...), fleetBin, "--data", data, "serve", "--http", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--ssh=")
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:], flags...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v kept running; want a refusal. Output:\n%s", argv, out.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

// TestSecondServeDemoLeavesTheRunningFleet: `fleet serve --demo` on the data
// dir of a running hub is refused, and the stored fleet is still the running
// hub's (before the fix it held the demo, which a restart then launched).
func TestSecondServeDemoLeavesTheRunningFleet(t *testing.T) {
	data := t.TempDir()
	file := filepath.Join(t.TempDir(), "solo.yaml")
	if err := os.WriteFile(file, []byte(soloFleet), 0o600); err != nil {
		t.Fatal(err)
	}
	launchHub(t, data, freePort(t), "--fleet", file)
	waitControl(t, data)
	before, code := fleetCmd(t, data, "export")
	if code != 0 || !strings.Contains(before, "solo") {
		t.Fatalf("export = %d %q", code, before)
	}

	out, code := runServe(t, nil, data, "--demo")
	if code == 0 {
		t.Fatalf("a second serve --demo on a running hub's data dir started:\n%s", out)
	}
	after, ecode := fleetCmd(t, data, "export")
	if ecode != 0 || after != before {
		t.Fatalf("the refused hub changed the stored fleet:\nbefore:\n%s\nafter (exit %d):\n%s", before, ecode, after)
	}
	if !strings.Contains(out, "another hub") || !strings.Contains(out, "nothing was changed") {
		t.Errorf("second serve --demo: exit %d, output:\n%s\nwant a refusal naming the running hub", code, out)
	}
}

// TestReadOnlyDataDirIsSaidToBeReadOnly: a data dir the hub cannot write is
// refused as read-only, not as "no such file or directory". As root, file
// modes do not stop a write, so the dir is made read-only the way a real
// one is: a read-only bind mount, in a mount namespace of the hub's own.
func TestReadOnlyDataDirIsSaidToBeReadOnly(t *testing.T) {
	data := t.TempDir()
	var wrap []string
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("running as root needs unshare(1) to make a read-only mount")
		}
		script := `mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"`
		wrap = []string{"unshare", "--mount", "sh", "-c", script, "sh", data}
		if out, err := exec.Command("unshare", "--mount", "sh", "-c", `mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"`, "sh", data).CombinedOutput(); err != nil {
			t.Skipf("cannot make a read-only mount here: %v: %s", err, out)
		}
	} else {
		if err := os.Chmod(data, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(data, 0o700) })
	}
	out, code := runServe(t, wrap, data, "--demo")
	if code == 0 || !strings.Contains(out, "read-only") || !strings.Contains(out, data) || strings.Contains(out, "no such file") {
		t.Fatalf("serve on a read-only data dir: exit %d, output:\n%s\nwant a refusal saying %s is read-only", code, out, data)
	}
}

// TestLimitsOverOpenSSH: a fleet file past apply's limit, whose cut would
// still be a fleet file (a list split in two), is refused whole through the
// control socket and over SSH alike; and the real OpenSSH client shows the
// refusal of a session past --ssh-max-sessions-per-user.
func TestLimitsOverOpenSSH(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("the OpenSSH client is not installed (apt-get install -y openssh-client)")
	}
	data, keys := t.TempDir(), t.TempDir()
	adminKey, adminPub := sshKey(t, keys, "admin")
	adminKeys := filepath.Join(keys, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(adminPub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "solo.yaml")
	if err := os.WriteFile(file, []byte(soloFleet), 0o600); err != nil {
		t.Fatal(err)
	}
	sshPort := freePort(t)
	launchHub(t, data, freePort(t), "--fleet", file, "--ssh", fmt.Sprintf("127.0.0.1:%d", sshPort), "--admin-keys", adminKeys, "--ssh-rate=-1",
		"--ssh-max-sessions-per-user=1")
	waitControl(t, data)
	before, _ := fleetCmd(t, data, "export")

	// The second node comes after 4 MiB of comment lines: the cut keeps solo
	// and drops it and the models, which is how a cut removed engines.
	var big strings.Builder
	big.WriteString("nodes:\n  - name: solo\n    address: sim:m4max-llamacpp\n")
	for big.Len() < 4<<20 {
		big.WriteString("# " + strings.Repeat("padding ", 12) + "\n")
	}
	big.WriteString("  - name: second\n    address: sim:m4max-llamacpp\n")
	big.WriteString(soloFleet[strings.Index(soloFleet, "models:"):])
	bigFile := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(bigFile, []byte(big.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	check := func(how, out string, code int) {
		t.Helper()
		if code != 1 || !strings.Contains(out, "limit of 4 MiB") || !strings.Contains(out, "nothing was applied") {
			t.Errorf("apply of %d bytes %s: exit %d, output %q; want exit 1 naming the 4 MiB limit", big.Len(), how, code, out)
		}
		if after, _ := fleetCmd(t, data, "export"); after != before {
			t.Errorf("apply %s changed the fleet:\n%s", how, after)
		}
	}
	out, code := fleetCmd(t, data, "apply", "-f", bigFile)
	check("through the control socket", out, code)

	ssh := sshClient{port: sshPort, knownHosts: filepath.Join(keys, "known_hosts")}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(ssh.args(adminKey, "accept-new", false), "apply")...)
	f, err := os.Open(bigFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sshOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = f, &sshOut, &sshOut
	err = cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	check("over SSH", sshOut.String(), code)

	audit, _ := fleetCmd(t, data, "audit")
	if strings.Contains(audit, "apply") {
		t.Errorf("a refused apply reached the hub's apply:\n%s", audit)
	}

	// One session open (events --follow stays), so the admin's next is refused.
	// The two race for the one slot: a whoami that wins it gets the follow
	// refused, and the follow (which then exits) is started again.
	var follow *exec.Cmd
	var followEnded chan struct{}
	startFollow := func() {
		follow = exec.CommandContext(ctx, "ssh", append(ssh.args(adminKey, "yes", false), "events", "--follow")...)
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		ended, cmd := make(chan struct{}), follow
		go func() { cmd.Wait(); close(ended) }()
		followEnded = ended
	}
	startFollow()
	defer func() { follow.Process.Kill(); <-followEnded }()
	// OpenSSH logs a refused channel at INFO; the first -o given wins.
	whoami := append([]string{"-o", "LogLevel=INFO"}, append(ssh.args(adminKey, "yes", false), "whoami")...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := exec.CommandContext(ctx, "ssh", whoami...).CombinedOutput()
		if strings.Contains(string(out), "open failed: resource shortage: fleet: you already have 1 session open, the limit per user") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with events --follow open, whoami said %q; want the per-user refusal", out)
		}
		select {
		case <-followEnded: // refused while a whoami held the slot
			startFollow()
		default:
		}
		time.Sleep(200 * time.Millisecond)
	}
}
