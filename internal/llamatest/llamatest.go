// Package llamatest finds the real llama-server that .ci/build-llama-server
// builds, writes the tiny test model for it and runs it on loopback. It is
// imported only by _test.go files.
//
// Tests that need the real engine skip, saying how to build it, only when
// no binary is found; CI always builds it first.
package llamatest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"fleet/internal/gguf"
)

// EnvBinary names the llama-server binary; .ci/run sets it from
// .ci/build-llama-server's output.
const EnvBinary = "FLEET_LLAMA_SERVER"

// EnvCache is the build script's cache root (default /var/cache/fleet).
const EnvCache = "FLEET_LLAMA_CACHE"

// Binary returns the llama-server to test against: $FLEET_LLAMA_SERVER, else
// the newest build in the cache. A $FLEET_LLAMA_SERVER that is not an
// executable fails the test: whoever set it meant the tests to run.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvBinary); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			t.Fatalf("%s=%s is not an executable llama-server (%v): run .ci/build-llama-server, which prints the path", EnvBinary, p, err)
		}
		return p
	}
	root := os.Getenv(EnvCache)
	if root == "" {
		root = "/var/cache/fleet"
	}
	found, _ := filepath.Glob(filepath.Join(root, "llama-server-*", "llama-server"))
	sort.Slice(found, func(i, j int) bool { return modTime(found[i]).After(modTime(found[j])) })
	if len(found) == 0 {
		t.Skipf("no llama-server built (neither $%s nor %s/llama-server-*/llama-server): run .ci/build-llama-server (CI does) to test against the real engine", EnvBinary, root)
	}
	return found[0]
}

func modTime(p string) time.Time {
	st, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

// Model writes the tiny random-weight GGUF into dir and returns its path.
func Model(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "fleet-tiny.gguf")
	if err := gguf.WriteTinyLlama(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// ModelOf writes the random-weight GGUF that c shapes into dir and returns
// its path.
func ModelOf(t testing.TB, dir string, c gguf.TinyConfig) string {
	t.Helper()
	p := filepath.Join(dir, fmt.Sprintf("fleet-tiny-%dx%d.gguf", c.Layers, c.Embd))
	if err := gguf.WriteTiny(p, c); err != nil {
		t.Fatal(err)
	}
	return p
}

// Server is a llama-server this test started.
type Server struct {
	URL string
	cmd *exec.Cmd
	log string
}

// Log is the server's output so far, for failure messages.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// Start runs llama-server on a free loopback port with the tiny model and
// args, waits until /health answers 200, and stops it when the test ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	logPath := filepath.Join(dir, "llama-server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"-m", Model(t, dir), "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-t", "1"}, args...)
	cmd := exec.Command(bin, argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, log: logPath}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("llama-server exited before serving (%v):\n%s", err, s.Log())
		case <-ctx.Done():
			t.Fatalf("llama-server not healthy within 60 s:\n%s", s.Log())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// String is the server's address, for logs.
func (s *Server) String() string { return fmt.Sprintf("llama-server at %s", s.URL) }
