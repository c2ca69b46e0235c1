package nodeland

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// run runs a shell command in the land and returns its output and exit
// status.
func run(t *testing.T, l *Land, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := l.Run(ctx, []string{"sh", "-c", script}, nil, &out, &out)
	code := 0
	if err != nil {
		var coded interface{ ExitCode() int }
		if !errors.As(err, &coded) {
			t.Fatalf("%s: %v", script, err)
		}
		code = coded.ExitCode()
	}
	return strings.TrimSpace(out.String()), code
}

// A Mac-like land is what the brief of a Mac is, checked from inside.
func TestMacLand(t *testing.T) {
	l := New(t, Options{Kind: Mac, BrewPrefix: "/opt/homebrew"})
	checks := []struct {
		script, want string
		code         int
	}{
		{`echo "$PATH"`, MacPath, 0},
		{`echo "$HOME"`, l.Home, 0},
		// bash in POSIX mode, as macOS's /bin/sh.
		{`[ -n "$BASH_VERSION" ] && set -o | grep -E '^posix[[:space:]]+on' >/dev/null && echo posix`, "posix", 0},
		{`stat -c %Y /etc/hostname >/dev/null 2>&1 || echo refused`, "refused", 0},
		{`stat -f %m /etc/hostname | grep -E '^[0-9]+$' >/dev/null && echo ok`, "ok", 0},
		{`command -v setsid timeout python3 || echo none`, "none", 0},
		{`[ -r /proc/self/stat ] || echo hidden`, "hidden", 0},
		// Homebrew is there, off sshd's PATH.
		{`command -v brew || [ -x /opt/homebrew/bin/brew ] && echo off-path`, "off-path", 0},
		// ps and lsof work without /proc, as a Mac's do.
		{`[ "$(ps -o pid= -p $$ | tr -d ' ')" = $$ ] && echo ok`, "ok", 0},
		{`command -v perl lsof >/dev/null && echo ok`, "ok", 0},
		{`curl -fsSL https://example.com/`, "curl: (6) Could not resolve host: example.com", 6},
	}
	for _, c := range checks {
		got, code := run(t, l, c.script)
		if got != c.want || code != c.code {
			t.Errorf("%s: %q, exit %d; want %q, exit %d", c.script, got, code, c.want, c.code)
		}
	}
	// Nothing of the land leaks onto the machine.
	if _, err := os.Stat("/opt/homebrew/bin/brew"); err == nil {
		t.Errorf("/opt/homebrew/bin/brew exists outside the land")
	}
}

// The uv installer stand-in behaves as the real one: uv lands in
// ~/.local/bin, the profiles source its env script, and the running shell's
// PATH does not change.
func TestUVInstaller(t *testing.T) {
	l := New(t, Options{Kind: Linux})
	got, code := run(t, l, `curl -LsSf https://astral.sh/uv/install.sh | sh >/dev/null; command -v uv || echo "not on PATH"; [ -x "$HOME/.local/bin/uv" ] && echo installed; grep -c 'local/bin/env' "$HOME/.profile"`)
	if want := "not on PATH\ninstalled\n1"; got != want || code != 0 {
		t.Errorf("after the uv installer: %q (exit %d), want %q", got, code, want)
	}
	if got := l.Installs(); len(got) != 1 || got[0] != "uv installer" {
		t.Errorf("installs %q, want the uv installer once", got)
	}
}

// A captured machine's folder: its bin/ first on PATH, its proc/ over
// /proc.
func TestMachineFolder(t *testing.T) {
	m := t.TempDir()
	if err := os.MkdirAll(filepath.Join(m, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m, "bin", "uname"), []byte("#!/bin/sh\necho Darwin\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(m, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m, "proc", "meminfo"), []byte("MemTotal:       65536 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wsl := filepath.Join(m, "usr", "lib", "wsl", "lib")
	if err := os.MkdirAll(wsl, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wsl, "nvidia-smi"), []byte("#!/bin/sh\necho 'NVIDIA GeForce RTX 5080, 16303, 15900'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	l := New(t, Options{Kind: Linux, Machine: m})
	if got, _ := run(t, l, `/usr/lib/wsl/lib/nvidia-smi; [ -x /usr/bin/env ] && echo usr-too`); got != "NVIDIA GeForce RTX 5080, 16303, 15900\nusr-too" {
		t.Errorf("the machine's usr/ does not lie over /usr: %q", got)
	}
	if _, err := os.Stat("/usr/lib/wsl/lib/nvidia-smi"); err == nil {
		t.Errorf("/usr/lib/wsl/lib/nvidia-smi exists outside the land")
	}
	if got, _ := run(t, l, `uname; cat /proc/meminfo; [ -r /proc/self/stat ] || echo no-self`); got != "Darwin\nMemTotal:       65536 kB\nno-self" {
		t.Errorf("the machine's folder is not what the land shows: %q", got)
	}
	os.RemoveAll(filepath.Join(m, "proc"))
	l = New(t, Options{Kind: Linux, Machine: m})
	if got, _ := run(t, l, `[ -e /proc/meminfo ] || echo hidden`); got != "hidden" {
		t.Errorf("a machine without proc/ shows a /proc: %q", got)
	}
}

// A Linux-like land's sh is Debian's dash, or bash in POSIX mode when asked
// (Fedora's, RHEL's).
func TestLinuxSh(t *testing.T) {
	const which = `if [ -n "${BASH_VERSION:-}" ]; then set -o | grep -E '^posix[[:space:]]+on' >/dev/null && echo bash-posix; else echo not-bash; fi`
	for _, c := range []struct {
		bashSh bool
		want   string
	}{{false, "not-bash"}, {true, "bash-posix"}} {
		l := New(t, Options{Kind: Linux, BashSh: c.bashSh})
		if got, _ := run(t, l, which); got != c.want {
			t.Errorf("BashSh %v: sh is %q, want %q", c.bashSh, got, c.want)
		}
	}
}
