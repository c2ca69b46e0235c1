package testbin

import (
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

func TestBuild(t *testing.T) {
	bin, err := Build(t.TempDir(), "ok", "./testdata/ok")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin).Output()
	if err != nil || string(out) != "built\n" {
		t.Errorf("the built program printed %q, %v; want \"built\\n\"", out, err)
	}

	_, err = Build(t.TempDir(), "broken", "./testdata/broken")
	if err == nil {
		t.Fatal("building a package that does not compile succeeded")
	}
	if !strings.Contains(err.Error(), "testdata/broken") || !strings.Contains(err.Error(), "cannot use") {
		t.Errorf("the error does not carry the package and the compiler's message: %v", err)
	}
}

// fakeTB records how ForTest ends a test.
type fakeTB struct {
	testing.TB
	dir             string
	failed, skipped string
}

func (f *fakeTB) Helper()         {}
func (f *fakeTB) TempDir() string { return f.dir }
func (f *fakeTB) Fatal(args ...any) {
	f.failed = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fakeTB) Skip(args ...any) {
	f.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, args ...any) { f.Skip(fmt.Sprintf(format, args...)) }
func (f *fakeTB) SkipNow()                         { f.Skip("SkipNow") }

func TestForTestFailsOnABrokenBuild(t *testing.T) {
	f := &fakeTB{dir: t.TempDir()}
	done := make(chan string, 1)
	go func() {
		defer close(done)
		done <- ForTest(f, "broken", "./testdata/broken")
	}()
	if bin, ok := <-done; ok {
		t.Fatalf("ForTest returned %q for a package that does not compile", bin)
	}
	if f.skipped != "" || f.failed == "" {
		t.Errorf("a broken build must fail the test, not skip it: failed %q, skipped %q", f.failed, f.skipped)
	}
}
