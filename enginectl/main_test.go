package enginectl

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"fleet"
	"fleet/internal/testbin"
)

// Paths of the helper engine, built once for the whole package.
var (
	fakeEngine   string // testdata/fakeengine
	strangerBin  string // the same program under another path: "another binary"
	launcherMode = os.Getenv("ENGINECTL_TEST_LAUNCHER") != ""
)

func TestMain(m *testing.M) {
	if launcherMode {
		os.Exit(runLauncher())
	}
	os.Exit(testbin.Main(m, "enginectl-test-", func(dir string) (err error) {
		fakeEngine, err = testbin.Build(filepath.Join(dir, "bin"), "fake-engine", "./testdata/fakeengine")
		if err != nil {
			return err
		}
		strangerBin = filepath.Join(dir, "other", "stranger-server")
		return copyFile(fakeEngine, strangerBin)
	}))
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// runLauncher is the test binary re-executed as a short-lived controller:
// it launches an engine, prints its PID and exits, like an SSH session
// that ends right after the launch.
func runLauncher() int {
	port := 0
	fmt.Sscan(os.Getenv("ENGINECTL_TEST_PORT"), &port)
	spec := testSpec("launcher", port, os.Getenv("ENGINECTL_TEST_STATE"), os.Getenv("ENGINECTL_TEST_BIN"))
	cmd, err := BuildCommand(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p, err := Start(context.Background(), LocalRunner{}, spec, cmd)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(p.PID)
	return 0
}

// testSpec is a llamacpp model whose binary is the fake engine.
func testSpec(node string, port int, stateDir, bin string, extraArgs ...string) Spec {
	return Spec{
		Node: fleet.Node{Name: node, Address: "local", Platform: &fleet.Platform{OS: "linux", Arch: "amd64"}},
		Model: fleet.Model{ID: "qwen3-4b", Context: 16384, Recipes: map[fleet.EngineKind]fleet.Recipe{
			fleet.EngineLlamaCpp: {Model: "Qwen3-4B-Q4_K_M.gguf", Bin: bin, Args: append([]string{"-ngl", "99", "--jinja", "--reasoning-format", "none"}, extraArgs...)},
		}},
		Engine:   fleet.EngineLlamaCpp,
		Port:     port,
		StateDir: stateDir,
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// testCtx is a hang guard, not a timing assertion.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var fast = []Option{WithPollInterval(50 * time.Millisecond), WithStaleGrace(5 * time.Second)}

// startEngine launches the fake engine through enginectl and stops it when
// the test ends.
func startEngine(t *testing.T, r Runner, spec Spec) (Process, Command) {
	t.Helper()
	cmd, err := BuildCommand(spec)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(testCtx(t), r, spec, cmd, fast...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Stop(context.Background(), r, p, 2*time.Second, fast...) })
	return p, cmd
}

// runDecoy starts a program straight from the test (not through enginectl),
// in its own process group like a leftover engine would be.
func runDecoy(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdout, c.Stderr = io.Discard, io.Discard
	c.SysProcAttr = newGroup()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = c.Process.Kill()
		<-done
	})
	return c
}

// waitListening waits until something accepts on port.
func waitListening(t *testing.T, port int) {
	t.Helper()
	ctx := testCtx(t)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("nothing listens on port %d", port)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// variants run the node scripts as on a typical Linux box, as on a Linux box
// without setsid(1) (perl detaches, like on macOS), and without /proc (ps
// and lsof, like on macOS).
var variants = []struct {
	name string
	r    Runner
}{
	{"linux", LocalRunner{}},
	{"no-setsid", LocalRunner{Env: []string{"FLEET_ENGINECTL_NO_SETSID=1"}}},
	{"no-proc", LocalRunner{Env: []string{"FLEET_ENGINECTL_NO_PROC=1", "FLEET_ENGINECTL_NO_SETSID=1"}}},
}

func contextWithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
