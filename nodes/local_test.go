package nodes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"fleet"
)

// exitCoder is what enginectl expects of a failed command.
type exitCoder interface{ ExitCode() int }

// runnerCases exercise any transport the same way, so local, sim and ssh
// are held to one behaviour.
func runnerCases(t *testing.T, tr Transport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("stdin to stdout", func(t *testing.T) {
		var out bytes.Buffer
		if err := tr.Run(ctx, []string{"cat"}, strings.NewReader("hello\nworld\n"), &out, nil); err != nil {
			t.Fatal(err)
		}
		if out.String() != "hello\nworld\n" {
			t.Errorf("stdout = %q", out.String())
		}
	})
	t.Run("stderr is separate", func(t *testing.T) {
		var out, errOut bytes.Buffer
		if err := tr.Run(ctx, []string{"sh", "-c", "echo out; echo err >&2"}, nil, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		if out.String() != "out\n" || errOut.String() != "err\n" {
			t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, code := range []int{1, 3, 42} {
			err := tr.Run(ctx, []string{"sh", "-c", "exit \"$1\"", "sh", strconv.Itoa(code)}, nil, nil, nil)
			var ec exitCoder
			if !errors.As(err, &ec) || ec.ExitCode() != code {
				t.Errorf("exit %d: err = %v", code, err)
			}
		}
	})
	t.Run("command not found is 127", func(t *testing.T) {
		err := tr.Run(ctx, []string{"fleet-no-such-command-xyz"}, nil, nil, nil)
		var ec exitCoder
		if !errors.As(err, &ec) || ec.ExitCode() != 127 {
			t.Fatalf("err = %v, want exit status 127", err)
		}
		if !strings.Contains(err.Error(), "command not found") {
			t.Errorf("error does not say what went wrong: %v", err)
		}
	})
	t.Run("hostile argv arrives intact", func(t *testing.T) {
		args := []string{"", "a b", "it's", "$(touch /tmp/fleet-pwned)", "`id`", "*", "a\nb", ";", "|", "&&", "~", "$HOME", `\`, "#x"}
		var out bytes.Buffer
		argv := append([]string{"printf", `%s\0`}, args...)
		if err := tr.Run(ctx, argv, nil, &out, nil); err != nil {
			t.Fatal(err)
		}
		got := strings.Split(strings.TrimSuffix(out.String(), "\x00"), "\x00")
		if len(got) != len(args) {
			t.Fatalf("got %q, want %q", got, args)
		}
		for i := range args {
			if got[i] != args[i] {
				t.Errorf("arg %d: got %q, want %q", i, got[i], args[i])
			}
		}
	})
	t.Run("cancel stops a long command", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		// A shell with a child, so the whole tree must go, not just the top.
		marker := fmt.Sprintf("%d", 700000+time.Now().UnixNano()%100000)
		go func() {
			done <- tr.Run(cctx, []string{"sh", "-c", "sleep $1; echo unreachable", "sh", marker}, nil, nil, nil)
		}()
		waitFor(t, func() bool { return len(processesWithArgs("sleep", marker)) > 0 }, "the command to start")
		ccancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after its context was cancelled")
		}
		// The node is this machine in every transport test, so its process
		// table is ours to read.
		waitFor(t, func() bool { return len(processesWithArgs("sleep", marker)) == 0 }, "the cancelled command to die")
	})
	t.Run("dial a port on the node", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			io.Copy(c, c)
		}()
		conn, err := tr.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("echo = %q, %v", buf, err)
		}
	})
	t.Run("dial a closed port fails", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		if c, err := tr.DialContext(ctx, "tcp", addr); err == nil {
			c.Close()
			t.Fatal("dial to a closed port succeeded")
		}
	})
	t.Run("empty argv", func(t *testing.T) {
		if err := tr.Run(ctx, nil, nil, nil, nil); !errors.Is(err, ErrNoCommand) {
			t.Errorf("err = %v", err)
		}
	})
}

func TestLocalTransport(t *testing.T) {
	tr, err := Open(context.Background(), fleet.Node{Name: "hub", Address: "local"}, Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.Name() != "hub" {
		t.Errorf("Name = %q", tr.Name())
	}
	runnerCases(t, tr)
}

func TestSimTransportRunsLocallyWithItsOwnStateDir(t *testing.T) {
	data := t.TempDir()
	lookup := func(string) (fleet.Platform, error) {
		return fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra"}, nil
	}
	a, err := Open(context.Background(), fleet.Node{Name: "ultra", Address: "sim:m1ultra-llamacpp"}, Options{DataDir: data, SimPlatform: lookup})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(context.Background(), fleet.Node{Name: "max", Address: "sim:m4max-llamacpp"}, Options{DataDir: data, SimPlatform: lookup})
	if err != nil {
		t.Fatal(err)
	}
	type stateDirer interface{ StateDir() string }
	da, db := a.(stateDirer).StateDir(), b.(stateDirer).StateDir()
	if da == db || !strings.HasPrefix(da, data) || !strings.HasPrefix(db, data) {
		t.Errorf("state dirs %q and %q: want distinct folders under %q", da, db, data)
	}
	runnerCases(t, a)
}

func TestOpenRejectsBadAddresses(t *testing.T) {
	tests := []struct {
		node    fleet.Node
		opts    Options
		wantErr string
	}{
		{fleet.Node{Address: "local"}, Options{}, "no name"},
		{fleet.Node{Name: "a"}, Options{}, "has no address"},
		{fleet.Node{Name: "a", Address: "sim:"}, Options{SimPlatform: func(string) (fleet.Platform, error) { return fleet.Platform{}, nil }}, "names no sim profile"},
		{fleet.Node{Name: "a", Address: "sim:x"}, Options{}, "none is configured: set nodes.Options.SimPlatform"},
		{fleet.Node{Name: "a", Address: "ops@"}, Options{HostKeys: &MemoryHostKeys{}}, "no host"},
		{fleet.Node{Name: "a", Address: "@rig"}, Options{HostKeys: &MemoryHostKeys{}}, "empty user"},
		{fleet.Node{Name: "a", Address: "ops@rig:99999"}, Options{HostKeys: &MemoryHostKeys{}}, "between 1 and 65535"},
		{fleet.Node{Name: "a", Address: "ops@rig:ssh"}, Options{HostKeys: &MemoryHostKeys{}}, "not a number"},
		{fleet.Node{Name: "a", Address: "ops@rig"}, Options{}, "no host key store"},
	}
	for _, tt := range tests {
		t.Run(tt.node.Address+"/"+tt.wantErr, func(t *testing.T) {
			_, err := Open(context.Background(), tt.node, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseSSHAddress(t *testing.T) {
	tests := []struct {
		in, user, hostPort string
	}{
		{"ops@rig.lan", "ops", "rig.lan:22"},
		{"ops@rig.lan:2222", "ops", "rig.lan:2222"},
		{"ops@10.0.0.5:22", "ops", "10.0.0.5:22"},
		{"ops@[::1]:2200", "ops", "[::1]:2200"},
		{"ops@[fe80::1]", "ops", "[fe80::1]:22"},
		{"first.last@host", "first.last", "host:22"},
	}
	for _, tt := range tests {
		u, hp, err := ParseSSHAddress(tt.in)
		if err != nil || u != tt.user || hp != tt.hostPort {
			t.Errorf("ParseSSHAddress(%q) = %q, %q, %v; want %q, %q", tt.in, u, hp, err, tt.user, tt.hostPort)
		}
	}
	if u, hp, err := ParseSSHAddress("rig"); err != nil || u == "" || hp != "rig:22" {
		t.Errorf("no user: %q %q %v", u, hp, err)
	}
}

// processesWithArgs lists PIDs whose command line is exactly argv.
func processesWithArgs(argv ...string) []int {
	want := strings.Join(argv, "\x00") + "\x00"
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(raw) == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
