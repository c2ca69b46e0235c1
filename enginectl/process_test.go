package enginectl

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet"
)

func TestLifecycle(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := testCtx(t)
			state := t.TempDir()
			port := freePort(t)
			spec := testSpec("node-"+v.name, port, state, fakeEngine, "--running", "1", "--slots", "3")
			p, cmd := startEngine(t, v.r, spec)

			if p.PGID != p.PID {
				t.Errorf("PGID %d, want the engine's own group %d", p.PGID, p.PID)
			}
			if want := filepath.Join(state, "node-"+v.name+"-qwen3-4b.log"); p.LogPath != want {
				t.Errorf("log path %q, want %q", p.LogPath, want)
			}
			if b, err := os.ReadFile(p.PIDPath); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(p.PID) {
				t.Errorf("pid file %s holds %q (%v), want %d", p.PIDPath, b, err, p.PID)
			}
			argvFile, err := os.ReadFile(strings.TrimSuffix(p.PIDPath, ".pid") + ".argv")
			if err != nil || string(argvFile) != strings.Join(cmd.LaunchArgv, "\x00")+"\x00" {
				t.Errorf("argv file %q (%v), want the launch argv", argvFile, err)
			}
			if err := WaitReady(ctx, v.r, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
				t.Fatal(err)
			}
			// Own session: the engine does not die with the launcher's.
			if sid, err := sessionOf(p.PID); err != nil || sid != p.PID {
				t.Errorf("engine session %d (%v), want its own (%d)", sid, err, p.PID)
			}
			load, err := Scrape(ctx, v.r, port, fleet.EngineLlamaCpp)
			if err != nil {
				t.Fatal(err)
			}
			if load != (Load{Running: 1, Slots: 3}) {
				t.Errorf("load %+v, want 1 running of 3 slots", load)
			}

			adopted, err := Adopt(ctx, v.r, Process{PID: p.PID, PGID: p.PGID}, cmd.LaunchArgv, fast...)
			if err != nil || !adopted {
				t.Errorf("Adopt with the launch argv = %v, %v; want true", adopted, err)
			}
			other := append([]string{}, cmd.LaunchArgv...)
			other[len(other)-1] = "--reasoning-format=auto"
			if adopted, err := Adopt(ctx, v.r, p, other, fast...); err != nil || adopted {
				t.Errorf("Adopt with a different argv = %v, %v; want false", adopted, err)
			}
			if adopted, err := Adopt(ctx, v.r, Process{PID: p.PID, PGID: p.PGID + 1}, cmd.LaunchArgv, fast...); err != nil || adopted {
				t.Errorf("Adopt with another process group = %v, %v; want false", adopted, err)
			}

			if err := Stop(ctx, v.r, p, 5*time.Second, fast...); err != nil {
				t.Fatal(err)
			}
			if alive, err := Alive(ctx, v.r, p.PID); err != nil || alive {
				t.Errorf("after Stop: alive=%v err=%v", alive, err)
			}
			if adopted, err := Adopt(ctx, v.r, p, cmd.LaunchArgv, fast...); err != nil || adopted {
				t.Errorf("Adopt after Stop = %v, %v; want false", adopted, err)
			}
			if err := Stop(ctx, v.r, p, time.Second, fast...); err != nil {
				t.Errorf("stopping a stopped engine: %v", err)
			}
			log, _ := os.ReadFile(p.LogPath)
			if !bytes.Contains(log, []byte("TERM, shutting down")) {
				t.Errorf("engine log does not show a graceful TERM:\n%s", log)
			}
		})
	}
}

// TestEngineOutlivesLauncher launches from a separate controller process,
// kills that controller's whole process group the way a dropped SSH session
// would, right after the launch returns, and expects the engine to keep
// serving. On a busy node the engine's process may not have detached yet
// when the launch would print its PID: the slow variants make that window
// wide (a setsid or perl that sleeps before it runs), where before the
// launch returned inside it about once in 40 runs on a loaded machine.
func TestEngineOutlivesLauncher(t *testing.T) {
	slow := slowDetachers(t)
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"setsid", nil},
		{"setsid slow to detach", []string{"PATH=" + slow + string(os.PathListSeparator) + os.Getenv("PATH")}},
		{"perl slow to detach", []string{"PATH=" + slow + string(os.PathListSeparator) + os.Getenv("PATH"), "FLEET_ENGINECTL_NO_SETSID=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			state := t.TempDir()
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			launcher := exec.CommandContext(ctx, self, "-test.run=^$")
			launcher.Env = append(os.Environ(), "ENGINECTL_TEST_LAUNCHER=1", "ENGINECTL_TEST_PORT="+strconv.Itoa(port),
				"ENGINECTL_TEST_STATE="+state, "ENGINECTL_TEST_BIN="+fakeEngine)
			launcher.Env = append(launcher.Env, tc.env...)
			launcher.SysProcAttr = newGroup()
			var out, errb bytes.Buffer
			launcher.Stdout, launcher.Stderr = &out, &errb
			if err := launcher.Run(); err != nil {
				t.Fatalf("launcher: %v\n%s", err, errb.String())
			}
			pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
			if err != nil {
				t.Fatalf("launcher printed %q", out.String())
			}
			p := Process{PID: pid, PGID: pid, LogPath: filepath.Join(state, "launcher-qwen3-4b.log"), ServedName: "qwen3-4b"}
			t.Cleanup(func() { _ = Stop(ctx, LocalRunner{}, p, 2*time.Second, fast...) })
			// Whatever is left of the controller's group goes, as with a hangup.
			_ = syscall.Kill(-launcher.Process.Pid, syscall.SIGHUP)
			_ = syscall.Kill(-launcher.Process.Pid, syscall.SIGKILL)

			if err := WaitReady(ctx, LocalRunner{}, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
				t.Fatalf("engine did not survive its launcher: %v", err)
			}
			if pgid, _ := syscall.Getpgid(pid); pgid == launcher.Process.Pid {
				t.Errorf("engine stayed in the launcher's process group %d", pgid)
			}
		})
	}
}

// slowDetachers is a directory of setsid and perl that wait a second before
// they run the real ones, as a detaching process does that a busy machine
// does not schedule.
func slowDetachers(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"setsid", "perl"} {
		real, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("%s is not installed: %v", name, err)
		}
		script := "#!/bin/sh\nsleep 1\nexec " + real + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestWaitReady(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		served  string
		wantErr error
		logHas  string
	}{
		{name: "503 while loading, then ready", args: []string{"--load-time", "600ms"}},
		{name: "port opens only after loading (vLLM)", args: []string{"--listen-after", "600ms"}},
		{name: "engine crashes while loading", args: []string{"--listen-after", "10s", "--exit-after", "200ms"}, wantErr: ErrEngineExited, logHas: "simulated crash"},
		{name: "served name never listed", args: nil, served: "someone-else", wantErr: errDeadline},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			p, _ := startEngine(t, LocalRunner{}, testSpec("wr", port, t.TempDir(), fakeEngine, tc.args...))
			wctx := ctx
			if tc.served != "" {
				// Serving first, so the deadline below only ever sees the
				// wrong name, however slow the machine is.
				if err := WaitReady(ctx, LocalRunner{}, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
					t.Fatal(err)
				}
				p.ServedName = tc.served
				var cancel func()
				wctx, cancel = contextWithTimeout(ctx, 3*time.Second)
				defer cancel()
			}
			err := WaitReady(wctx, LocalRunner{}, port, p, fleet.EngineLlamaCpp, fast...)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("WaitReady: %v", err)
			case tc.wantErr == errDeadline:
				if err == nil || !strings.Contains(err.Error(), `not "someone-else"`) {
					t.Fatalf("WaitReady = %v, want a timeout that says which names were listed", err)
				}
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("WaitReady = %v, want %v", err, tc.wantErr)
			}
			if tc.logHas != "" && !strings.Contains(err.Error(), tc.logHas) {
				t.Errorf("error does not carry the log tail (%q): %v", tc.logHas, err)
			}
		})
	}
}

var errDeadline = errors.New("deadline")

func TestStopEscalatesToKillForTheWholeGroup(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			p, _ := startEngine(t, v.r, testSpec("stubborn-"+v.name, port, t.TempDir(), fakeEngine, "--ignore-term", "--child"))
			if err := WaitReady(ctx, v.r, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
				t.Fatal(err)
			}
			members, err := groupMembers(ctx, v.r, p.PGID)
			if err != nil || len(members) < 2 {
				t.Fatalf("group %d members %v (%v); want the engine and its child", p.PGID, members, err)
			}
			if err := Stop(ctx, v.r, p, 300*time.Millisecond, fast...); err != nil {
				t.Fatal(err)
			}
			if left, _ := groupMembers(ctx, v.r, p.PGID); len(left) > 0 {
				t.Errorf("group members left after Stop: %v", left)
			}
		})
	}
}

func TestStopRefusesNonsense(t *testing.T) {
	ctx := testCtx(t)
	for _, p := range []Process{{PID: 0}, {PID: 1}} {
		if err := Stop(ctx, LocalRunner{}, p, time.Second); err == nil {
			t.Errorf("Stop(%+v) succeeded", p)
		}
	}
	// The script must never signal its own group, whatever the caller
	// passes. It runs here as the leader of a group of its own, so a guard
	// that failed would end only the script, not the test run around it.
	cmd := exec.CommandContext(ctx, "sh", "-c", `exec sh -c "$1" fleet-enginectl signal TERM "$$"`, "sh", nodeScript)
	cmd.SysProcAttr = newGroup()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "controller's own") {
		t.Errorf("signalling the script's own group: %v: %s", err, out)
	}
}

func TestStartFailsClearlyWithoutTheBinary(t *testing.T) {
	spec := testSpec("missing", 18999, t.TempDir(), "/nonexistent/llama-server")
	cmd, err := BuildCommand(spec)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Start(testCtx(t), LocalRunner{}, spec, cmd)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/llama-server: not found on the node") {
		t.Fatalf("Start = %v; want a not-found error naming the binary", err)
	}
}

func TestSimulatedEngineLaunch(t *testing.T) {
	ctx := testCtx(t)
	port := freePort(t)
	spec := testSpec("max", port, t.TempDir(), "")
	spec.Node.Address = "sim:m4max-llamacpp"
	spec.FleetBin = fakeEngine // stands in for `fleet`: it ignores the sim flags and honours the engine's
	p, cmd := startEngine(t, LocalRunner{}, spec)
	if !cmd.Simulated || cmd.Argv[0] != "llama-server" || cmd.Bin != fakeEngine {
		t.Fatalf("command %+v: want a simulated llama-server launched from the fleet binary", cmd)
	}
	if err := WaitReady(ctx, LocalRunner{}, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
		t.Fatal(err)
	}
	if ok, err := Adopt(ctx, LocalRunner{}, p, cmd.LaunchArgv); err != nil || !ok {
		t.Errorf("Adopt = %v, %v", ok, err)
	}
	if ok, err := Adopt(ctx, LocalRunner{}, p, cmd.Argv); err != nil || ok {
		t.Errorf("Adopt against the displayed (not launched) argv = %v, %v; want false", ok, err)
	}
}

// Data reaches the engine byte for byte: env values and arguments with
// spaces, quotes, globs and command substitutions are never run as shell.
func TestHostileDataStaysData(t *testing.T) {
	hostile := []string{"it's a \"test\"", "$(touch /tmp/enginectl-pwned)", "`id`", "*", "a\nb", "", "~user", "; exit 1"}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			spec := testSpec("hostile-"+v.name, port, t.TempDir(), fakeEngine, append([]string{"--note"}, hostile...)...)
			r := spec.Model.Recipes[fleet.EngineLlamaCpp]
			r.Env = map[string]string{"FAKE_ENGINE_NOTE": "$(id) 'q' \"dq\" ${HOME}"}
			spec.Model.Recipes[fleet.EngineLlamaCpp] = r
			p, cmd := startEngine(t, v.r, spec)
			if err := WaitReady(ctx, v.r, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
				t.Fatal(err)
			}
			log, _ := os.ReadFile(p.LogPath)
			if want := fmt.Sprintf("args %q", cmd.LaunchArgv[1:]); !strings.Contains(string(log), want) {
				t.Errorf("engine saw other arguments than we passed:\nlog: %s\nwant %s", log, want)
			}
			if want := fmt.Sprintf("FAKE_ENGINE_NOTE=%q", r.Env["FAKE_ENGINE_NOTE"]); !strings.Contains(string(log), want) {
				t.Errorf("engine saw another env value:\nlog: %s\nwant %s", log, want)
			}
			if _, err := os.Stat("/tmp/enginectl-pwned"); err == nil {
				t.Error("an argument was run as a command")
			}
			if ok, err := Adopt(ctx, v.r, p, cmd.LaunchArgv, fast...); v.name != "no-proc" && (err != nil || !ok) {
				// ps -o args= joins argv with spaces, so the no-/proc path
				// cannot tell "a b" from "a" "b"; exact argv needs /proc.
				t.Errorf("Adopt = %v, %v", ok, err)
			}
		})
	}
}
