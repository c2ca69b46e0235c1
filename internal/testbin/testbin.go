// Package testbin builds the Go programs that tests run as real processes
// (the fake engine, fleet itself, the simulator). A build that fails fails the
// tests: a test that skips when its binary does not build hides the breakage
// it exists to catch.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build runs `go build -o dir/name pkg` and returns the binary's path. pkg is
// an import path or a directory relative to the calling test's package. The
// error carries go's output, so the compiler's message is what the run shows.
func Build(dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building %s for the tests: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// ForTest builds pkg into a temporary directory of t and returns the
// binary's path; a failed build fails t.
func ForTest(t testing.TB, name, pkg string) string {
	t.Helper()
	bin, err := Build(t.TempDir(), name, pkg)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Main is the body of a TestMain whose tests share binaries: it makes a
// temporary directory, calls build with it (build calls Build for each
// binary), runs the tests and removes the directory. A failed build ends
// the run with status 1 before any test starts. Use it as
// os.Exit(testbin.Main(m, "pkg-test-bin", func(dir string) error { ... })).
func Main(m *testing.M, prefix string, build func(dir string) error) int {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
