package enginectl

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"fleet"
)

// An argument ending in newlines reaches the engine byte for byte: command
// substitution in the node script once stripped them.
func TestStartKeepsTrailingNewlines(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			odd := []string{"ends in a newline\n", "two\n\n", "~/x\n"}
			spec := testSpec("node-"+v.name, port, t.TempDir(), fakeEngine, "--alias-note", odd[0], "--x", odd[1], "--y", odd[2])
			p, cmd := startEngine(t, v.r, spec)
			if err := WaitReady(ctx, v.r, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PID), "cmdline"))
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
			home, _ := os.UserHomeDir()
			want := expandHome(cmd.LaunchArgv, home)
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Errorf("engine argv:\n got %q\nwant %q", got, want)
			}
			if adopted, err := Adopt(ctx, v.r, p, cmd.LaunchArgv, fast...); err != nil || !adopted {
				t.Errorf("Adopt = %v, %v; want the engine recognised", adopted, err)
			}
		})
	}
}

// An engine launched through a wrapper script that execs the real binary
// keeps the PID we launched but shows another executable and argv; it is
// still ours, by the PID and the argv recorded at launch. A PID whose
// records say otherwise is not.
func TestAdoptEngineBehindExecWrapper(t *testing.T) {
	wrapper := filepath.Join(t.TempDir(), "llama-wrapper")
	script := "#!/bin/sh\n# sets up the environment, then becomes the engine\nexec " + fakeEngine + " --from-wrapper \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			spec := testSpec("node-"+v.name, port, t.TempDir(), wrapper)
			p, cmd := startEngine(t, v.r, spec)
			if err := WaitReady(ctx, v.r, port, p, fleet.EngineLlamaCpp, fast...); err != nil {
				t.Fatal(err)
			}
			if exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(p.PID), "exe")); exe != fakeEngine {
				t.Fatalf("the wrapper did not exec the engine: PID %d runs %q", p.PID, exe)
			}
			// As a restarted hub rebuilds it from the store: no file paths.
			restored := Process{PID: p.PID, PGID: p.PGID, StartedAt: p.StartedAt, PIDPath: p.PIDPath}
			if adopted, err := Adopt(ctx, v.r, restored, cmd.LaunchArgv, fast...); err != nil || !adopted {
				t.Errorf("Adopt of the wrapped engine = %v, %v; want it recognised as ours", adopted, err)
			}
			other := append([]string{}, cmd.LaunchArgv...)
			other = append(other, "--another-flag")
			if adopted, err := Adopt(ctx, v.r, restored, other, fast...); err != nil || adopted {
				t.Errorf("Adopt with an argv that was not recorded = %v, %v; want false", adopted, err)
			}
			// The pid file names another PID: this one is not what we started.
			if err := os.WriteFile(p.PIDPath, []byte("4194000\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if adopted, err := Adopt(ctx, v.r, restored, cmd.LaunchArgv, fast...); err != nil || adopted {
				t.Errorf("Adopt when the pid file names another PID = %v, %v; want false", adopted, err)
			}
			// A pid file written after the process started (PID reuse).
			if err := os.WriteFile(p.PIDPath, []byte(strconv.Itoa(p.PID)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if adopted, err := Adopt(ctx, v.r, restored, cmd.LaunchArgv, fast...); err != nil || !adopted {
				t.Errorf("Adopt with the pid file restored = %v, %v; want true", adopted, err)
			}
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(p.PIDPath, old, old); err != nil {
				t.Fatal(err)
			}
			if adopted, err := Adopt(ctx, v.r, restored, cmd.LaunchArgv, fast...); err != nil || adopted {
				t.Errorf("Adopt of a process younger than its pid file = %v, %v; want false (a reused PID)", adopted, err)
			}
		})
	}
}
