package nodes

import (
	"bytes"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

const sshdPath = "/usr/sbin/sshd"

// testSSHD is a real OpenSSH server on loopback, configured from a temp dir
// with throwaway keys, accepting the current user with one key.
type testSSHD struct {
	t        *testing.T
	dir      string
	port     int
	hostKey  string // path of the host private key
	identity string // path of the user's private key
	userKey  ssh.Signer
	cmd      *exec.Cmd
	stderr   *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func writeKey(t *testing.T, path string) ssh.Signer {
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

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// newTestSSHD prepares keys and config; start runs the server.
func newTestSSHD(t *testing.T) *testSSHD {
	t.Helper()
	if _, err := os.Stat(sshdPath); err != nil {
		t.Skipf("OpenSSH server not installed (%s missing): install openssh-server to run the SSH transport tests", sshdPath)
	}
	if os.Geteuid() == 0 {
		// Running as root, sshd insists on its privilege separation
		// directory, which only exists where the sshd service has run.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Skipf("sshd needs /run/sshd when run as root and it cannot be created: %v", err)
		}
	}
	dir := t.TempDir()
	s := &testSSHD{t: t, dir: dir, port: freePort(t)}
	s.hostKey = filepath.Join(dir, "host_ed25519")
	writeKey(t, s.hostKey)
	s.identity = filepath.Join(dir, "id_ed25519")
	s.userKey = writeKey(t, s.identity)
	auth := ssh.MarshalAuthorizedKey(s.userKey.PublicKey())
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), auth, 0o600); err != nil {
		t.Fatal(err)
	}
	s.writeConfig()
	return s
}

func (s *testSSHD) writeConfig() {
	cfg := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
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
LogLevel VERBOSE
`, s.port, s.hostKey, filepath.Join(s.dir, "authorized_keys"), filepath.Join(s.dir, "sshd.pid"))
	if err := os.WriteFile(filepath.Join(s.dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// rotateHostKey gives the next start a different host key, as a reinstalled
// machine would have.
func (s *testSSHD) rotateHostKey() {
	s.hostKey = filepath.Join(s.dir, fmt.Sprintf("host_ed25519_%d", time.Now().UnixNano()))
	writeKey(s.t, s.hostKey)
	s.writeConfig()
}

func (s *testSSHD) start() {
	s.t.Helper()
	s.stderr = &lockedBuffer{}
	s.cmd = exec.Command(sshdPath, "-D", "-e", "-f", filepath.Join(s.dir, "sshd_config"))
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting sshd: %v", err)
	}
	s.t.Cleanup(s.kill)
	log := s.stderr
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.t.Logf("sshd log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("sshd did not listen on %s: %v\nsshd log:\n%s", s.addr(), err, s.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends sshd and every per-connection sshd it forked, so every client
// connection drops at once, as when a node loses its sshd. Those children
// leave its process group, so they are found by parentage. The commands the
// sessions ran are left to notice on their own: killing them mid-way can
// strand lock files of the user's shell start-up (pyenv's rehash lock made
// every later SSH command wait a minute).
func (s *testSSHD) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	pids := []int{s.cmd.Process.Pid}
	for _, pid := range descendants(s.cmd.Process.Pid) {
		if comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); err == nil && strings.HasPrefix(string(comm), "sshd") {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = s.cmd.Wait()
	s.cmd = nil
}

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

func (s *testSSHD) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *testSSHD) address() string {
	u, err := user.Current()
	if err != nil {
		s.t.Fatal(err)
	}
	return u.Username + "@" + s.addr()
}

func parseRawKey(pemBytes []byte) (any, error) { return ssh.ParseRawPrivateKey(pemBytes) }
