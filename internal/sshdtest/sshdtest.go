// Package sshdtest runs a real OpenSSH sshd on loopback for tests that need
// a remote node without a second machine. It is imported only by _test.go
// files (nodes, cmd/fleet); product code must not use it.
//
// The server is /usr/sbin/sshd itself, not an in-process imitation, so the
// tests meet what a real node has: its authentication, its session
// handling, its death. Tests that need it are skipped, with a message that
// says what to install, only where /usr/sbin/sshd does not exist.
package sshdtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"fleet/internal/syncbuf"
)

// Path is where the OpenSSH server must be for a Server to run.
const Path = "/usr/sbin/sshd"

// Server is an sshd on 127.0.0.1 configured from a temp dir with throwaway
// ed25519 keys, accepting the current user with one key. It keeps its port
// across Kill and Start, as a machine keeps its address across a reboot.
type Server struct {
	t        testing.TB
	dir      string
	host     string   // the address sshd listens on
	prefix   []string // runs sshd elsewhere, e.g. in a network namespace
	port     int
	hostKey  string
	identity string
	home     string
	cmd      *exec.Cmd
	log      *syncbuf.Buffer
}

// New prepares a Server's keys, home and config on a free loopback port;
// Start runs it. It skips the test when /usr/sbin/sshd is not installed.
// The test's cleanup kills whatever sshd is then running, after the
// cleanups of everything set up later (clients before their server).
func New(t testing.TB) *Server {
	t.Helper()
	return NewOn(t, "127.0.0.1", nil)
}

// NewOn is New for an sshd listening on host, started through prefix (for
// instance `ip netns exec NAME`, to run it in a network namespace whose
// address host is).
func NewOn(t testing.TB, host string, prefix []string) *Server {
	t.Helper()
	if _, err := os.Stat(Path); err != nil {
		t.Skipf("OpenSSH server not installed (%s missing): install openssh-server to run the tests against a real sshd", Path)
	}
	if os.Geteuid() == 0 {
		// Running as root, sshd insists on its privilege separation
		// directory, which only exists where the sshd service has run.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatalf("sshd run as root needs /run/sshd and it cannot be created: %v; create it (mkdir -p /run/sshd) or run the tests as another user", err)
		}
	}
	dir := t.TempDir()
	s := &Server{t: t, dir: dir, host: host, prefix: prefix, port: FreePort(t)}
	s.home = filepath.Join(dir, "home")
	if err := os.Mkdir(s.home, 0o700); err != nil {
		t.Fatal(err)
	}
	s.hostKey = filepath.Join(dir, "host_ed25519")
	WriteKey(t, s.hostKey)
	s.identity = filepath.Join(dir, "id_ed25519")
	userKey := WriteKey(t, s.identity)
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(userKey.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.writeConfig()
	t.Cleanup(s.Kill)
	return s
}

// writeConfig sets HOME for every session to the server's own home dir: a
// separate machine has its own, and this machine's account would have bash
// source its ~/.bashrc for every command sshd runs (root's runs pyenv, which
// is slow and takes locks that a killed session leaves behind, stalling every
// later command). MaxSessions and MaxStartups are raised because a hub
// multiplexes many sessions over one connection and reconnects in bursts.
func (s *Server) writeConfig() {
	cfg := fmt.Sprintf(`Port %d
ListenAddress %s
HostKey %s
AuthorizedKeysFile %s
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
PidFile %s
StrictModes no
UsePAM no
MaxSessions 64
MaxStartups 64
LogLevel VERBOSE
SetEnv HOME=%s
`, s.port, s.host, s.hostKey, filepath.Join(s.dir, "authorized_keys"), filepath.Join(s.dir, "sshd.pid"), s.home)
	if err := os.WriteFile(filepath.Join(s.dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// RotateHostKey gives the next Start a different host key on the same
// port, as a reinstalled machine would have.
func (s *Server) RotateHostKey() {
	s.t.Helper()
	s.hostKey = filepath.Join(s.dir, fmt.Sprintf("host_ed25519_%d", time.Now().UnixNano()))
	WriteKey(s.t, s.hostKey)
	s.writeConfig()
}

// Start runs sshd in the foreground and returns once it accepts TCP
// connections. If the test fails, this run's sshd log is written to it.
func (s *Server) Start() {
	s.t.Helper()
	s.log = &syncbuf.Buffer{}
	argv := append(append([]string{}, s.prefix...), Path, "-D", "-e", "-f", filepath.Join(s.dir, "sshd_config"))
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Stderr = s.log
	s.cmd.WaitDelay = 5 * time.Second
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting sshd: %v", err)
	}
	log := s.log
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.t.Logf("sshd log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("sshd did not listen on %s: %v\nsshd log:\n%s", s.Addr(), err, s.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends sshd and every process it forked, as a machine losing its sshd
// does: every client connection drops at once and the commands its sessions
// ran end with them. Per-connection children leave sshd's process group, so
// they are found by parentage; they also hold sshd's stderr, so Wait would
// block on any left alive. Engines launched detached were reparented
// away from sshd and survive, as they would on a real node. Killing a
// session's command is safe here because its shell start-up ran in the
// server's own home (see writeConfig). Kill without a running sshd does
// nothing.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	// A client redialling at that moment can make sshd fork a child between
	// the scan and the kill; that child would keep stderr open and Wait
	// would block for ever (seen in a CI-like run). So sshd is stopped
	// first (SIGSTOP: it forks no more, and its children keep their parent
	// for the scan), its descendants are killed until none is left, and
	// WaitDelay bounds Wait whatever still holds the pipe.
	root := s.cmd.Process.Pid
	_ = syscall.Kill(root, syscall.SIGSTOP)
	for range 50 {
		kids := descendants(root)
		if len(kids) == 0 {
			break
		}
		for _, pid := range kids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = syscall.Kill(root, syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// descendants lists every process below root, read from /proc.
func descendants(root int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name in parentheses may itself hold spaces and
		// parentheses; the fields after its last ") " are fixed.
		rest := string(raw)
		if i := strings.LastIndex(rest, ") "); i >= 0 {
			rest = rest[i+2:]
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			out = append(out, c)
			walk(c)
		}
	}
	walk(root)
	return out
}

// Addr is the server's HOST:PORT (127.0.0.1:PORT unless made with NewOn).
func (s *Server) Addr() string { return net.JoinHostPort(s.host, strconv.Itoa(s.port)) }

// Address is the node address a fleet file would give: USER@HOST:PORT for
// the user running the test.
func (s *Server) Address() string {
	s.t.Helper()
	u, err := user.Current()
	if err != nil {
		s.t.Fatal(err)
	}
	return u.Username + "@" + s.Addr()
}

// Identity is the path of the private key the server accepts.
func (s *Server) Identity() string { return s.identity }

// Home is $HOME in the server's sessions: a dir of the test's own, as a
// separate machine would have, so what a node keeps in ~ (~/.fleet) lands
// there rather than in the account running the test.
func (s *Server) Home() string { return s.home }

// Log is what the current (or last) sshd run wrote to stderr.
func (s *Server) Log() string {
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// WriteKey writes a new unencrypted ed25519 private key in OpenSSH format to
// path and returns it as a signer.
func WriteKey(t testing.TB, path string) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
