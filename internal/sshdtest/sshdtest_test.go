package sshdtest

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// dial logs in as the test's user with the server's identity and reports
// the host key the server showed.
func dial(t *testing.T, s *Server) (*ssh.Client, ssh.PublicKey) {
	t.Helper()
	raw, err := os.ReadFile(s.Identity())
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	var hostKey ssh.PublicKey
	user, _, _ := strings.Cut(s.Address(), "@")
	c, err := ssh.Dial("tcp", s.Addr(), &ssh.ClientConfig{
		User: user,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			hostKey = key
			return nil
		},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatalf("logging in to %s: %v\nsshd log:\n%s", s.Addr(), err, s.Log())
	}
	return c, hostKey
}

func run(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.Output(cmd)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return strings.TrimSpace(string(out))
}

func TestServerSessions(t *testing.T) {
	s := New(t)
	s.Start()
	c, _ := dial(t, s)
	defer c.Close()
	for _, tc := range []struct {
		name, cmd, want string
	}{
		{"HOME is the server's own dir, not the account's", `printf %s "$HOME"`, s.Home()},
		{"the session runs as the test's user", "id -u", strconv.Itoa(os.Geteuid())},
		{"commands see their arguments intact", `printf '%s|' 'a b' "c"`, "a b|c|"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := run(t, c, tc.cmd); got != tc.want {
				t.Errorf("%s = %q, want %q", tc.cmd, got, tc.want)
			}
		})
	}
	if !strings.Contains(s.Log(), "Accepted publickey") {
		t.Errorf("the sshd log does not record the login:\n%s", s.Log())
	}
}

func TestServerRefusesOtherKeys(t *testing.T) {
	s := New(t)
	s.Start()
	other := WriteKey(t, filepath.Join(t.TempDir(), "other"))
	user, _, _ := strings.Cut(s.Address(), "@")
	_, err := ssh.Dial("tcp", s.Addr(), &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(other)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
		Timeout:         10 * time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("login with a key not in authorized_keys: err = %v, want an authentication failure", err)
	}
}

// TestServerKillAndRestart: Kill drops connections and ends the sessions'
// commands; Start after RotateHostKey answers on the same port with
// another key.
func TestServerKillAndRestart(t *testing.T) {
	s := New(t)
	s.Start()
	addr := s.Addr()
	c, firstKey := dial(t, s)
	defer c.Close()

	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	stdout, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start("echo $$; exec sleep 600"); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 32)
	n, err := stdout.Read(line)
	if err != nil {
		t.Fatalf("reading the session's PID: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(line[:n])))
	if err != nil {
		t.Fatalf("session printed %q, not its PID", line[:n])
	}

	s.Kill()
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still accepts connections after Kill", addr)
	}
	waitGone(t, pid)
	s.Kill() // a second Kill finds nothing to do

	s.RotateHostKey()
	s.Start()
	if s.Addr() != addr {
		t.Errorf("restarted on %s, was %s", s.Addr(), addr)
	}
	c2, secondKey := dial(t, s)
	defer c2.Close()
	if bytes.Equal(firstKey.Marshal(), secondKey.Marshal()) {
		t.Errorf("host key unchanged after RotateHostKey: %s", ssh.FingerprintSHA256(secondKey))
	}
}

// waitGone waits (as a hang guard) until pid has exited: gone from /proc or
// a zombie no one reaps, which in a container without an init is all a
// killed orphan becomes.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return
		}
		rest := string(raw)
		if i := strings.LastIndex(rest, ") "); i >= 0 && strings.HasPrefix(rest[i+2:], "Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session's command (PID %d) still runs after Kill: %s", pid, raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
