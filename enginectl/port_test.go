package enginectl

import (
	"bytes"
	"errors"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"fleet"
)

func TestCheckPortFree(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			owner, err := CheckPort(testCtx(t), v.r, freePort(t), fakeEngine, fast...)
			if err != nil || owner.PID != 0 {
				t.Fatalf("CheckPort on a free port = %+v, %v", owner, err)
			}
		})
	}
}

// A leftover engine from the engine's own binary is stopped, and said so.
func TestCheckPortStopsStaleEngine(t *testing.T) {
	tests := []struct {
		name  string
		group bool // the stale engine leads its own group (as ours do)
	}{
		{"group leader", true},
		{"inside another group", false},
	}
	for _, v := range variants {
		for _, tc := range tests {
			t.Run(v.name+"/"+tc.name, func(t *testing.T) {
				ctx := testCtx(t)
				port := freePort(t)
				decoy := exec.Command(fakeEngine, "--port", strconv.Itoa(port), "-a", "old-model", "--ignore-term")
				if tc.group {
					decoy.SysProcAttr = newGroup()
				}
				if err := decoy.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- decoy.Wait() }()
				t.Cleanup(func() { _ = decoy.Process.Kill() })
				waitListening(t, port)

				var logs bytes.Buffer
				logger := slog.New(slog.NewTextHandler(&logs, nil))
				opts := append([]Option{WithLogger(logger)}, WithPollInterval(50*time.Millisecond), WithStaleGrace(300*time.Millisecond))
				owner, err := CheckPort(ctx, v.r, port, fakeEngine, opts...)
				if err != nil {
					t.Fatalf("CheckPort: %v", err)
				}
				if !owner.Stale || owner.PID != decoy.Process.Pid {
					t.Errorf("owner %+v, want the decoy PID %d marked stale", owner, decoy.Process.Pid)
				}
				want := "fake-engine already answering on port " + strconv.Itoa(port) + " without a process of ours; stopping the stale one"
				if !strings.Contains(owner.Message, want) || !strings.Contains(logs.String(), want) {
					t.Errorf("message %q / log %q; want %q", owner.Message, logs.String(), want)
				}
				select {
				case <-exited:
				case <-ctx.Done():
					t.Fatal("the stale engine still runs")
				}
				if ls, err := listeners(ctx, v.r, port); err != nil || len(ls) != 0 {
					t.Errorf("port still held: %v %v", ls, err)
				}
			})
		}
	}
}

// Anything not from the engine's binary is refused by PID and command and
// left running.
func TestCheckPortRefusesStranger(t *testing.T) {
	decoys := map[string]func(port int) []string{
		"same program, other path": func(port int) []string {
			return []string{strangerBin, "--port", strconv.Itoa(port)}
		},
	}
	if py, err := exec.LookPath("python3"); err == nil {
		decoys["python http.server"] = func(port int) []string {
			return []string{py, "-m", "http.server", "--bind", "127.0.0.1", strconv.Itoa(port)}
		}
	} else {
		t.Log("python3 not found: the http.server decoy case does not run; the other-path decoy still does")
	}
	for _, v := range variants {
		for name, argv := range decoys {
			t.Run(v.name+"/"+name, func(t *testing.T) {
				ctx := testCtx(t)
				port := freePort(t)
				decoy := runDecoy(t, argv(port)...)
				waitListening(t, port)
				owner, err := CheckPort(ctx, v.r, port, fakeEngine, fast...)
				if !errors.Is(err, ErrPortTaken) {
					t.Fatalf("CheckPort = %+v, %v; want ErrPortTaken", owner, err)
				}
				pid := strconv.Itoa(decoy.Process.Pid)
				if !strings.Contains(err.Error(), "PID "+pid) || !strings.Contains(err.Error(), "--port") && !strings.Contains(err.Error(), "http.server") {
					t.Errorf("error %q does not name PID %s and its command", err, pid)
				}
				if alive, _ := Alive(ctx, v.r, decoy.Process.Pid); !alive {
					t.Error("CheckPort killed a process that was not ours")
				}
			})
		}
	}
}

// The seed's bug: a new engine cannot bind because an old one answers; the
// worker must never be reported ready from the old one's answers.
func TestNeverReadyFromDecoy(t *testing.T) {
	tests := []struct {
		name  string
		decoy string   // binary of the server already on the port
		ours  []string // extra args for our engine
		// Our engine cannot bind and exits: depending on when we look, it is
		// seen dead (with its log) or the port seen held by another PID.
		want []error
	}{
		{"stale engine answering, ours exits", fakeEngine, nil, []error{ErrEngineExited, ErrNotOurs}},
		{"stranger answering, ours exits", strangerBin, nil, []error{ErrEngineExited, ErrNotOurs}},
		// Ours is alive but not (yet) listening while the decoy answers
		// /health with 200 and lists the same model.
		{"stranger answering, ours still loading", strangerBin, []string{"--no-listen"}, []error{ErrNotOurs}},
		{"stale engine answering, ours still loading", fakeEngine, []string{"--no-listen"}, []error{ErrNotOurs}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			port := freePort(t)
			decoy := runDecoy(t, tc.decoy, "--port", strconv.Itoa(port), "-a", "qwen3-4b")
			waitListening(t, port)
			p, _ := startEngine(t, LocalRunner{}, testSpec("decoyed", port, t.TempDir(), fakeEngine, tc.ours...))
			err := WaitReady(ctx, LocalRunner{}, port, p, fleet.EngineLlamaCpp, fast...)
			if err == nil {
				t.Fatal("WaitReady reported ready from the decoy's answers")
			}
			matched := false
			for _, want := range tc.want {
				matched = matched || errors.Is(err, want)
			}
			if !matched {
				t.Fatalf("WaitReady = %v; want one of %v", err, tc.want)
			}
			switch {
			case errors.Is(err, ErrEngineExited) && !strings.Contains(err.Error(), "cannot listen"):
				t.Errorf("error lacks the engine's own complaint from its log: %v", err)
			case errors.Is(err, ErrNotOurs) && !strings.Contains(err.Error(), "PID "+strconv.Itoa(decoy.Process.Pid)):
				t.Errorf("error does not name the decoy's PID %d: %v", decoy.Process.Pid, err)
			}
		})
	}
}
