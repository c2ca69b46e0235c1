package nodes

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/sshdtest"
	"fleet/internal/syncbuf"
)

// waitForLog waits until b holds s.
func waitForLog(t *testing.T, b *syncbuf.Buffer, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %q in the log output; got:\n%s", s, b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processesWith lists the PIDs of processes whose command line mentions s.
func processesWith(s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, filepath.Base(d)+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func appendLine(t *testing.T, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, line)
	f.Close()
}

// TestTailLogFollowsAndLeavesNothing reads an engine log through the local
// and the SSH transport (a real sshd): the last lines, bounded; a follow
// that sees new lines and the new log after a restart's rename; and, once
// the reader leaves, no tail left running on the node.
func TestTailLogFollowsAndLeavesNothing(t *testing.T) {
	transports := map[string]func(t *testing.T) Transport{
		"local": func(t *testing.T) Transport { return newLocal("box", Options{}) },
		"ssh": func(t *testing.T) Transport {
			s := sshdtest.New(t)
			s.Start()
			tr, err := Open(context.Background(), fleet.Node{Name: "rig", Address: s.Address(), Identity: s.Identity()}, Options{HostKeys: &MemoryHostKeys{}})
			if err != nil {
				t.Fatalf("Open: %v\nsshd log:\n%s", err, s.Log())
			}
			t.Cleanup(func() { tr.Close() })
			return tr
		},
	}
	for name, open := range transports {
		t.Run(name, func(t *testing.T) {
			tr := open(t)
			path := filepath.Join(t.TempDir(), "rig-qwen3-4b.log")
			ctx := context.Background()

			var missing syncbuf.Buffer
			if err := tailLog(ctx, tr, path, 10, false, &missing); err == nil || !strings.Contains(missing.String(), "no log at") {
				t.Errorf("a missing log: err %v, output %q; want an error saying there is no log yet", err, missing.String())
			}

			for i := 1; i <= 5; i++ {
				appendLine(t, path, fmt.Sprintf("line %d", i))
			}
			var last syncbuf.Buffer
			if err := tailLog(ctx, tr, path, 2, false, &last); err != nil {
				t.Fatal(err)
			}
			if got := last.String(); got != "line 4\nline 5\n" {
				t.Errorf("-n 2 gave %q, want the last two lines", got)
			}

			fctx, cancel := context.WithCancel(ctx)
			var out syncbuf.Buffer
			done := make(chan error, 1)
			go func() { done <- tailLog(fctx, tr, path, 1, true, &out) }()
			waitForLog(t, &out, "line 5")
			appendLine(t, path, "line 6")
			waitForLog(t, &out, "line 6")
			// A restart moves the log aside and starts a new one (node.sh).
			if err := os.Rename(path, path+".1"); err != nil {
				t.Fatal(err)
			}
			appendLine(t, path, "after restart")
			waitForLog(t, &out, "after restart")
			if strings.Contains(out.String(), "line 4") {
				t.Errorf("follow with -n 1 printed older lines:\n%s", out.String())
			}
			if len(processesWith(path)) == 0 {
				t.Fatal("no tail process found during the follow; the leak check below would prove nothing")
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("a follow the reader ended returned %v, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the follow did not end 30s after its reader left")
			}
			deadline := time.Now().Add(15 * time.Second)
			for left := processesWith(path); len(left) > 0; left = processesWith(path) {
				if time.Now().After(deadline) {
					t.Fatalf("processes left on the node after the follow ended:\n%s", strings.Join(left, "\n"))
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// TestManagerStreamsAWorkersLog reads a running sim worker's engine log
// through the manager, by worker name, where node.sh put it.
func TestManagerStreamsAWorkersLog(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	w := h.waitReady("max/qwen3-4b")

	var out syncbuf.Buffer
	if err := h.m.StreamWorkerLog(context.Background(), w.Name(), 5, false, &out); err != nil {
		t.Fatalf("StreamWorkerLog: %v (%s)", err, out.String())
	}
	if want := fmt.Sprintf("listening on 127.0.0.1:%d", w.Port); !strings.Contains(out.String(), want) {
		t.Errorf("the worker's log lacks the engine's own %q:\n%s", want, out.String())
	}
	if err := h.m.StreamWorkerLog(context.Background(), "max/nope", 5, false, &out); err == nil || !strings.Contains(err.Error(), "no worker named max/nope") {
		t.Errorf("an unknown worker: %v, want an error naming it", err)
	}
}
