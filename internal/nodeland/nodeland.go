// Package nodeland builds, for one test, the userland of a node fleet drives
// over SSH, in a mount namespace of its own on this machine (tests run as
// root): the commands fleet runs on a node then meet what they meet on a
// Mac or a stock Linux box, with the PATH sshd gives them, and real
// processes.
//
// A Mac-like land has what macOS has and lacks what it lacks: sh is bash in
// POSIX mode, stat has no -c (a BSD-like stat stands in), there is no
// setsid, timeout or python3, /proc is hidden, and PATH is macOS sshd's
// /usr/bin:/bin:/usr/sbin:/sbin. Homebrew, when asked for, lives under
// /opt/homebrew (or /usr/local), where only a login shell's profile would
// look. A Linux-like land keeps Debian's userland with sshd's Linux PATH.
// Both may take a captured machine's folder (testdata/machines/<machine>):
// its bin/ comes first on PATH, its proc/ is mounted over /proc, and any
// other folder (usr/…) lies over the machine's own.
//
// The network a node would download from is stood in for too: curl serves
// the uv installer (which, as the real one, writes ~/.local/bin/uv and only
// edits the shell profiles), brew "installs" a formula by copying a test
// engine into its prefix, and uv "installs" a package into a venv the same
// way. Each logs what it installed, so a test can count installs.
package nodeland

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Kind is which machine a land is like.
type Kind int

const (
	// Mac is an Apple Silicon Mac's userland as sshd runs commands there.
	Mac Kind = iota
	// Linux is a stock Linux box's (Debian's), with sshd's PATH.
	Linux
)

// sshd's PATH for a command: macOS's compiled-in default, and Debian's.
const (
	MacPath   = "/usr/bin:/bin:/usr/sbin:/sbin"
	LinuxPath = "/usr/local/bin:/usr/bin:/bin:/usr/games"
)

// Formula is what the fake brew installs for `brew install NAME`: the
// program From copied into the prefix's Cellar and linked as bin/Bin. No
// field may hold a space.
type Formula struct {
	Name, Bin, From string
}

// Package is what the fake uv installs for `uv pip install NAME`: the
// program From copied into the venv's bin as Bin, as an entry point. No
// field may hold a space.
type Package struct {
	Name, Bin, From string
}

// Options shape a land.
type Options struct {
	Kind Kind
	// Machine is a captured machine's folder (testdata/machines/<machine>):
	// its bin/ goes first on PATH, its proc/ over /proc, any other folder
	// (usr/lib/wsl/lib on WSL2) over the machine's own ("": none).
	Machine string
	// BrewPrefix is where Homebrew is: "/opt/homebrew" (Apple Silicon) or
	// "/usr/local" (Intel); "" is no Homebrew.
	BrewPrefix string
	Formulae   []Formula
	// Packages are what uv can install; the uv installer is served to curl
	// at https://astral.sh/uv/install.sh.
	Packages []Package
	// UVInstalled puts uv in ~/.local/bin before the test, as a node where
	// it was installed earlier.
	UVInstalled bool
	// Hide removes these commands from /usr/bin (and so /bin), on top of
	// what the kind lacks: "perl", "gcc", "cc", "sudo"…
	Hide []string
	// BashSh makes sh bash in POSIX mode on a Linux-like land too, as on
	// Fedora and RHEL (a Mac-like land's always is); else it is Debian's
	// dash.
	BashSh bool
}

// Land is a node's userland in a mount namespace. It implements the
// Runner of package enginectl (Run, DialContext).
type Land struct {
	// Home is the node user's home, the same path inside and out.
	Home string
	// Path is the PATH commands get.
	Path   string
	dir    string
	kind   Kind
	holder *exec.Cmd
}

// New builds a land for t and tears it down when t ends. Where the machine
// cannot build one (not root, no unshare or nsenter) it skips t, saying
// why, and fails it under CI=true, where it must run.
func New(t testing.TB, o Options) *Land {
	t.Helper()
	if err := available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	l := &Land{Home: filepath.Join(dir, "home"), dir: dir, kind: o.Kind}
	if err := l.build(o); err != nil {
		t.Fatalf("building the node's userland: %v", err)
	}
	if err := l.enter(); err != nil {
		t.Fatalf("entering the node's userland: %v", err)
	}
	t.Cleanup(l.close)
	return l
}

// available says why no land can be built here, nil when one can.
func available() error {
	if os.Geteuid() != 0 {
		return errors.New("a node's userland is built in a mount namespace, which needs root (CI runs the tests as root)")
	}
	for _, tool := range []string{"unshare", "nsenter", "bash", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("building a node's userland needs %s (util-linux, bash): %w", tool, err)
		}
	}
	return nil
}

// macMissing are the commands a Mac lacks that Debian has (python3 needs
// the Command Line Tools there; timeout and setsid are GNU/util-linux).
var macMissing = []string{"setsid", "timeout", "python3", "python3.11", "python3.12", "python3.13", "gtimeout"}

func (l *Land) build(o Options) error {
	p := func(parts ...string) string { return filepath.Join(append([]string{l.dir}, parts...)...) }
	for _, d := range []string{"orig-usr-bin", "usr-bin", "opt", "usr-local", "logs", "tools", "home"} {
		if err := os.MkdirAll(p(d), 0o755); err != nil {
			return err
		}
	}
	hide := slices.Clone(o.Hide)
	if o.Kind == Mac {
		hide = append(hide, macMissing...)
	}
	entries, err := os.ReadDir("/usr/bin")
	if err != nil {
		return err
	}
	orig := p("orig-usr-bin")
	for _, e := range entries {
		if slices.Contains(hide, e.Name()) {
			continue
		}
		if err := os.Symlink(filepath.Join(orig, e.Name()), p("usr-bin", e.Name())); err != nil {
			return err
		}
	}
	// Replacements, over the links just made.
	replace := map[string]string{"curl": fakeCurl}
	hiddenProc := o.Kind == Mac || o.Machine != ""
	if o.Kind == Mac {
		replace["stat"] = bsdStat
	}
	if hiddenProc {
		// ps and lsof read /proc; a Mac's read the kernel. They run in a
		// namespace of their own with the real /proc mounted back.
		replace["ps"] = withProc
		replace["lsof"] = withProc
	}
	for name, script := range replace {
		if slices.Contains(hide, name) {
			continue
		}
		if err := writeScript(p("usr-bin", name), script, l.dir, name); err != nil {
			return err
		}
	}
	if o.Kind == Mac || o.BashSh {
		// macOS's /bin/sh is bash, which runs in POSIX mode as sh.
		os.Remove(p("usr-bin", "sh"))
		if err := os.Symlink(filepath.Join(orig, "bash"), p("usr-bin", "sh")); err != nil {
			return err
		}
	}
	if err := writeScript(p("tools", "uv-install.sh"), uvInstaller, l.dir, ""); err != nil {
		return err
	}
	if err := writeScript(p("tools", "uv"), fakeUV, l.dir, ""); err != nil {
		return err
	}
	var pkgs strings.Builder
	for _, pk := range o.Packages {
		fmt.Fprintf(&pkgs, "%s %s %s\n", pk.Name, pk.Bin, pk.From)
	}
	if err := os.WriteFile(p("tools", "packages"), []byte(pkgs.String()), 0o644); err != nil {
		return err
	}
	if o.UVInstalled {
		if err := os.MkdirAll(filepath.Join(l.Home, ".local", "bin"), 0o755); err != nil {
			return err
		}
		if err := copyFile(p("tools", "uv"), filepath.Join(l.Home, ".local", "bin", "uv")); err != nil {
			return err
		}
	}
	switch o.BrewPrefix {
	case "":
	case "/opt/homebrew", "/usr/local":
		outside := p("opt", "homebrew")
		if o.BrewPrefix == "/usr/local" {
			outside = p("usr-local")
		}
		if err := os.MkdirAll(filepath.Join(outside, "bin"), 0o755); err != nil {
			return err
		}
		if err := writeScript(filepath.Join(outside, "bin", "brew"), fakeBrew, l.dir, o.BrewPrefix); err != nil {
			return err
		}
		var fs strings.Builder
		for _, f := range o.Formulae {
			fmt.Fprintf(&fs, "%s %s %s\n", f.Name, f.Bin, f.From)
		}
		if err := os.WriteFile(p("tools", "formulae"), []byte(fs.String()), 0o644); err != nil {
			return err
		}
	default:
		return fmt.Errorf("brew prefix %q: Homebrew lives in /opt/homebrew or /usr/local", o.BrewPrefix)
	}

	path := LinuxPath
	if o.Kind == Mac {
		path = MacPath
	}
	mounts := []string{
		"mount --bind /usr/bin " + q(orig),
		"mount --bind " + q(p("usr-bin")) + " /usr/bin",
		"mount --bind " + q(p("opt")) + " /opt",
		"mount --bind " + q(p("usr-local")) + " /usr/local",
	}
	if o.Machine != "" {
		m, err := filepath.Abs(o.Machine)
		if err != nil {
			return err
		}
		if fi, err := os.Stat(filepath.Join(m, "bin")); err == nil && fi.IsDir() {
			path = filepath.Join(m, "bin") + ":" + path
		}
		if fi, err := os.Stat(filepath.Join(m, "proc")); err == nil && fi.IsDir() {
			mounts = append(mounts, "mount --bind "+q(filepath.Join(m, "proc"))+" /proc")
			hiddenProc = false
		}
		// Any other folder lays its files over the machine's own (WSL2's
		// usr/lib/wsl/lib/nvidia-smi), first, under the mounts above.
		entries, err := os.ReadDir(m)
		if err != nil {
			return err
		}
		var overlays []string
		for _, e := range entries {
			if !e.IsDir() || e.Name() == "bin" || e.Name() == "proc" {
				continue
			}
			if fi, err := os.Stat("/" + e.Name()); err != nil || !fi.IsDir() {
				return fmt.Errorf("machine %s: its folder %s has no /%s to lie over", m, e.Name(), e.Name())
			}
			overlays = append(overlays, "mount -t overlay fleet-machine -o lowerdir="+q(filepath.Join(m, e.Name()))+":/"+e.Name()+" /"+e.Name())
		}
		mounts = append(overlays, mounts...)
	}
	if hiddenProc {
		mounts = append(mounts, "mount -t tmpfs -o size=64k,mode=555 fleet-no-proc /proc")
	}
	l.Path = path
	script := "set -e\n" + strings.Join(mounts, "\n") + "\necho ready\nexec " + q(filepath.Join(orig, "sleep")) + " 86400\n"
	return os.WriteFile(p("setup.sh"), []byte(script), 0o755)
}

// enter starts the process that holds the namespace, once its mounts are
// made.
func (l *Land) enter() error {
	// unshare(1) makes the mounts private, so none reaches the host.
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "bash", filepath.Join(l.dir, "setup.sh"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 6)
		_, err := io.ReadFull(out, b)
		if err == nil && string(b) != "ready\n" {
			err = fmt.Errorf("unexpected %q", b)
		}
		ready <- err
	}()
	if err := <-ready; err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("the namespace's setup failed: %v: %s", err, stderr.String())
	}
	l.holder = cmd
	return nil
}

func (l *Land) close() {
	if l.holder != nil {
		_ = l.holder.Process.Kill()
		_ = l.holder.Wait()
	}
}

// Env is the environment sshd gives a command on the node.
func (l *Land) Env() []string {
	shell := "/bin/bash"
	if l.kind == Mac {
		shell = "/bin/zsh"
	}
	return []string{"HOME=" + l.Home, "USER=root", "LOGNAME=root", "SHELL=" + shell, "PATH=" + l.Path}
}

// command is argv run in the land, as sshd would run it: in the node's
// home, with the node's environment and nothing of the test's.
func (l *Land) command(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"-t", fmt.Sprint(l.holder.Process.Pid), "-m", "--", "env", "-i"}, l.Env()...)
	cmd := exec.CommandContext(ctx, "nsenter", append(args, argv...)...)
	cmd.Dir = l.Home
	// A detached engine must never hold our pipes open; if one does by
	// mistake, give up on its output rather than hang.
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Run runs argv on the node (enginectl.Runner).
func (l *Land) Run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(argv) == 0 {
		return errors.New("run: empty command line")
	}
	cmd := l.command(ctx, argv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run %s on the node: %w", argv[0], err)
	}
	return nil
}

// DialContext connects to addr: the land shares this machine's network.
func (l *Land) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Installs are the installs the land's fake brew, uv installer and uv made,
// one line each ("brew install llama.cpp", "uv installer", "uv venv DIR",
// "uv pip install vllm"), in order.
func (l *Land) Installs() []string {
	b, err := os.ReadFile(filepath.Join(l.dir, "logs", "installs"))
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// q quotes s for the setup script (the land's own temporary paths).
func q(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// writeScript writes a stand-in with @LAND@ (the land's folder, where its
// logs and tools are) and @ARG@ filled in.
func writeScript(path, text, land, arg string) error {
	text = strings.ReplaceAll(text, "@LAND@", land)
	text = strings.ReplaceAll(text, "@ARG@", arg)
	os.Remove(path)
	return os.WriteFile(path, []byte(text), 0o755)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}
