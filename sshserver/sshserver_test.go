package sshserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
	gossh "golang.org/x/crypto/ssh"

	"fleet"
	"fleet/console"
	"fleet/console/consoletest"
)

// users is an in-memory UserStore.
type users struct {
	mu    sync.Mutex
	byFP  map[string]fleet.User
	added []fleet.User
}

func newUsers(us ...fleet.User) *users {
	s := &users{byFP: map[string]fleet.User{}}
	for _, u := range us {
		s.byFP[u.Fingerprint] = u
	}
	return s
}

func (s *users) UserByFingerprint(_ context.Context, fp string) (fleet.User, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.byFP[fp]
	if !ok {
		return fleet.User{}, fmt.Errorf("no user with key %s", fp)
	}
	return u, nil
}

func (s *users) CountUsers(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byFP), nil
}

func (s *users) AddUser(_ context.Context, u fleet.User) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.byFP[u.Fingerprint]; dup {
		return errors.New("duplicate key")
	}
	s.byFP[u.Fingerprint] = u
	s.added = append(s.added, u)
	return nil
}

type identity struct {
	signer gossh.Signer
	user   fleet.User
}

func newIdentity(t *testing.T, name string, role fleet.Role) identity {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pub := signer.PublicKey()
	return identity{signer: signer, user: fleet.User{
		Name: name, Role: role, Fingerprint: gossh.FingerprintSHA256(pub),
		PublicKey: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pub))) + " " + name + "@test",
	}}
}

// execTree is a tiny command tree standing in for the lead's: whoami, cat
// (echoes stdin), fail (exit 1), and anything else is a usage error.
func execTree(_ context.Context, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch args[0] {
	case "whoami":
		fmt.Fprintf(stdout, "%s %s\n", u.Name, u.Role)
		return 0
	case "cat":
		_, _ = io.Copy(stdout, stdin)
		return 0
	case "fail":
		fmt.Fprintln(stderr, "drain needs the operator role; you are viewer")
		return 1
	}
	fmt.Fprintf(stderr, "unknown command %q\n", args[0])
	return 2
}

type testServer struct {
	*Server
	addr   string
	src    *consoletest.Source
	audit  *[]fleet.AuditEntry
	cancel context.CancelFunc
	done   chan error
}

func startServer(t *testing.T, opts Options) *testServer {
	t.Helper()
	src := consoletest.Demo()
	var mu sync.Mutex
	var audit []fleet.AuditEntry
	if opts.Users == nil {
		opts.Users = newUsers()
	}
	if opts.HostKeyPath == "" {
		opts.HostKeyPath = filepath.Join(t.TempDir(), "ssh", "host_ed25519")
	}
	if opts.Source == nil {
		opts.Source = func(fleet.User) console.Source { return src }
	}
	if opts.Exec == nil {
		opts.Exec = execTree
	}
	if opts.Refresh == 0 {
		opts.Refresh = 100 * time.Millisecond
	}
	opts.Audit = func(e fleet.AuditEntry) { mu.Lock(); audit = append(audit, e); mu.Unlock() }
	opts.Addr = "127.0.0.1:0"
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), src: src, audit: &audit, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-ts.done:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop")
		}
	})
	return ts
}

func dial(addr string, auth ...gossh.AuthMethod) (*gossh.Client, error) {
	return gossh.Dial("tcp", addr, &gossh.ClientConfig{
		User: "anyone", Auth: auth, HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second,
	})
}

func run(t *testing.T, addr string, id identity, cmd, stdin string) (stdout, stderr string, code int) {
	t.Helper()
	c, err := dial(addr, gossh.PublicKeys(id.signer))
	if err != nil {
		t.Fatalf("dial as %s: %v", id.user.Name, err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	sess.Stdout, sess.Stderr = &out, &errb
	sess.Stdin = strings.NewReader(stdin)
	err = sess.Run(cmd)
	var exit *gossh.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitStatus()
	default:
		t.Fatalf("run %q: %v", cmd, err)
	}
	return out.String(), errb.String(), code
}

func TestAuthAcceptedAndRefused(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	stranger := newIdentity(t, "mallory", fleet.RoleAdmin)
	ts := startServer(t, Options{Users: newUsers(op.user)})

	out, _, code := run(t, ts.addr, op, "whoami", "")
	if code != 0 || out != "olga operator\n" {
		t.Fatalf("whoami = %q exit %d, want \"olga operator\" exit 0", out, code)
	}

	tests := []struct {
		name string
		auth []gossh.AuthMethod
	}{
		{"unknown key", []gossh.AuthMethod{gossh.PublicKeys(stranger.signer)}},
		{"password", []gossh.AuthMethod{gossh.Password("olga")}},
		{"keyboard-interactive", []gossh.AuthMethod{gossh.KeyboardInteractive(func(string, string, []string, []bool) ([]string, error) {
			return []string{"olga"}, nil
		})}},
		{"none", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dial(ts.addr, tt.auth...)
			if err == nil {
				c.Close()
				t.Fatal("authenticated, want refusal")
			}
			if !strings.Contains(err.Error(), "unable to authenticate") {
				t.Fatalf("err = %v, want an authentication refusal", err)
			}
		})
	}
}

// forger offers someone else's public key but cannot sign for it.
type forger struct {
	pub   gossh.PublicKey
	other gossh.Signer
}

func (f forger) PublicKey() gossh.PublicKey { return f.pub }
func (f forger) Sign(r io.Reader, data []byte) (*gossh.Signature, error) {
	return f.other.Sign(r, data)
}

func TestOfferedButUnsignedKeyDoesNotAuthenticate(t *testing.T) {
	admin := newIdentity(t, "ada", fleet.RoleAdmin)
	vic := newIdentity(t, "vic", fleet.RoleViewer)
	stranger := newIdentity(t, "mallory", fleet.RoleViewer)
	ts := startServer(t, Options{Users: newUsers(admin.user, vic.user)})

	// The server says yes to the offer of ada's key (it is a user), but the
	// signature is by another key: no entry.
	c, err := dial(ts.addr, gossh.PublicKeys(forger{pub: admin.signer.PublicKey(), other: stranger.signer}))
	if err == nil {
		c.Close()
		t.Fatal("a forged signature for the admin's key authenticated")
	}

	// x/crypto's server drops the connection on a bad signature, so the
	// forger cannot go on to sign with a key of its own in the same
	// connection; a fresh connection with vic's own key is vic, whatever was
	// offered before, because identify reads the verified key.
	if _, err := dial(ts.addr, gossh.PublicKeys(forger{pub: admin.signer.PublicKey(), other: vic.signer}, vic.signer)); err == nil {
		t.Fatal("a connection that forged the admin's signature went on to authenticate")
	}
	out, _, code := run(t, ts.addr, vic, "whoami", "")
	if code != 0 || out != "vic viewer\n" {
		t.Fatalf("whoami = %q exit %d, want \"vic viewer\"", out, code)
	}
}

func TestExecExitCodesAndStdin(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	ts := startServer(t, Options{Users: newUsers(op.user)})
	tests := []struct {
		cmd, stdin, wantOut, wantErr string
		code                         int
	}{
		{"whoami", "", "olga operator\n", "", 0},
		{"cat", "nodes:\n  - name: rig\n", "nodes:\n  - name: rig\n", "", 0},
		{"fail", "", "", "drain needs the operator role", 1},
		{"frobnicate --json", "", "", `unknown command "frobnicate"`, 2},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			out, errOut, code := run(t, ts.addr, op, tt.cmd, tt.stdin)
			if code != tt.code || out != tt.wantOut || !strings.Contains(errOut, tt.wantErr) {
				t.Fatalf("%q: out %q err %q exit %d; want out %q err ~%q exit %d", tt.cmd, out, errOut, code, tt.wantOut, tt.wantErr, tt.code)
			}
		})
	}
}

func TestNoTerminalNoCommandIsUsageError(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	ts := startServer(t, Options{Users: newUsers(op.user)})
	c, err := dial(ts.addr, gossh.PublicKeys(op.signer))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	sess.Stderr = &errb
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	err = sess.Wait()
	var exit *gossh.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 2 {
		t.Fatalf("shell without a pty: %v, want exit 2", err)
	}
	if !strings.Contains(errb.String(), "needs a terminal (ssh -t)") {
		t.Fatalf("stderr = %q", errb.String())
	}
}

func hostKeyOf(t *testing.T, addr string, id identity) gossh.PublicKey {
	t.Helper()
	var got gossh.PublicKey
	c, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{
		User: "x", Auth: []gossh.AuthMethod{gossh.PublicKeys(id.signer)}, Timeout: 10 * time.Second,
		HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error { got = key; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	return got
}

func TestHostKeyPersistsAcrossRestarts(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	path := filepath.Join(t.TempDir(), "data", "ssh_host_ed25519")
	first := startServer(t, Options{Users: newUsers(op.user), HostKeyPath: path})
	key1 := hostKeyOf(t, first.addr, op)
	first.cancel()
	<-first.done
	first.done <- nil // let the cleanup see it stopped

	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("host key not written: %v", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		t.Fatalf("host key mode %v lets others read it", info.Mode().Perm())
	}

	second := startServer(t, Options{Users: newUsers(op.user), HostKeyPath: path})
	c, err := gossh.Dial("tcp", second.addr, &gossh.ClientConfig{
		User: "x", Auth: []gossh.AuthMethod{gossh.PublicKeys(op.signer)}, Timeout: 10 * time.Second,
		HostKeyCallback: gossh.FixedHostKey(key1),
	})
	if err != nil {
		t.Fatalf("host key changed after restart: %v", err)
	}
	c.Close()

	other := startServer(t, Options{Users: newUsers(op.user)})
	if bytes.Equal(hostKeyOf(t, other.addr, op).Marshal(), key1.Marshal()) {
		t.Fatal("a fresh data dir reused another server's host key")
	}
}

// The limit counts failed logins, not connections: a console user may
// connect as often as they like, a stranger's failures are told why and
// when to retry, and lock out no console user behind the same address;
// only a flood of them is cut off before the handshake.
func TestRateLimitCountsFailedLogins(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	stranger := newIdentity(t, "mallory", fleet.RoleAdmin) // not a user
	const limit = 3
	ts := startServer(t, Options{Users: newUsers(op.user), MaxConnsPerIPPerMinute: limit})
	for i := range 2 * limit {
		if out, _, code := run(t, ts.addr, op, "whoami", ""); code != 0 || out == "" {
			t.Fatalf("a console user's connection %d in a minute was refused; logins that succeed must not count", i+1)
		}
	}
	// strangerDial logs in with an unknown key and returns the banner it
	// was shown, once the server has counted the failure (it does when
	// the client has hung up, which may be after Dial returns).
	strangerDial := func() (banner string, err error) {
		before, _ := ts.failures.count("127.0.0.1", time.Now())
		defer func() {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if n, _ := ts.failures.count("127.0.0.1", time.Now()); n > before || n == floodFactor*limit {
					return
				}
			}
		}()
		c, err := gossh.Dial("tcp", ts.addr, &gossh.ClientConfig{
			User: "mallory", Auth: []gossh.AuthMethod{gossh.PublicKeys(stranger.signer)},
			HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second,
			BannerCallback: func(msg string) error { banner = msg; return nil },
		})
		if err == nil {
			c.Close()
			return banner, errors.New("a stranger's key logged in")
		}
		return banner, err
	}
	for i := range limit {
		if banner, err := strangerDial(); banner != "" || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("stranger's login %d: banner %q, %v; want refused without a banner under the limit", i+1, banner, err)
		}
	}
	// Over the limit: told why and when to retry.
	banner, err := strangerDial()
	if !strings.Contains(banner, fmt.Sprintf("%d logins from 127.0.0.1 failed in the last minute", limit)) || !strings.Contains(banner, "retry") {
		t.Errorf("a stranger over the limit was shown %q (%v); want why and when to retry", banner, err)
	}
	// The console user behind the same address still gets in.
	if out, _, code := run(t, ts.addr, op, "whoami", ""); code != 0 || out == "" {
		t.Error("a stranger's failed logins locked a console user at the same address out")
	}
	// A flood of failures is cut off before the handshake.
	for range floodFactor*limit - limit - 1 {
		_, _ = strangerDial()
	}
	if c, err := dial(ts.addr, gossh.PublicKeys(op.signer)); err == nil {
		c.Close()
		t.Errorf("after %d failed logins in a minute the address still got a handshake", floodFactor*limit)
	} else if strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("after a flood of failed logins: %v; want the connection closed before the handshake", err)
	}
}

func TestLoginFailures(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLoginFailures(2, time.Minute)
	for _, at := range []time.Duration{0, time.Second, 2 * time.Second} {
		l.add("a", t0.Add(at))
	}
	if n, oldest := l.count("a", t0.Add(3*time.Second)); n != 3 || !oldest.Equal(t0) {
		t.Errorf("count = %d, oldest %v; want 3 from %v", n, oldest, t0)
	}
	if n, _ := l.count("b", t0); n != 0 {
		t.Errorf("another address counted %d", n)
	}
	// The window slides: the first failure stops counting a minute on.
	if n, oldest := l.count("a", t0.Add(time.Minute+500*time.Millisecond)); n != 2 || !oldest.Equal(t0.Add(time.Second)) {
		t.Errorf("a minute on: count = %d, oldest %v; want 2 from t0+1s", n, oldest)
	}
	// Past floodFactor times the limit only the newest are kept.
	for i := range 20 {
		l.add("c", t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n, _ := l.count("c", t0.Add(time.Second)); n != floodFactor*2 {
		t.Errorf("kept %d failures; want at most %d", n, floodFactor*2)
	}
	off := newLoginFailures(-1, time.Minute)
	off.add("a", t0)
	if n, _ := off.count("a", t0); n != 0 {
		t.Errorf("a disabled limit counted %d", n)
	}
}

func writePub(t *testing.T, dir, file string, id identity) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(id.user.PublicKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestBootstrapAdmins(t *testing.T) {
	ada := newIdentity(t, "ada", fleet.RoleAdmin)
	bob := newIdentity(t, "bob", fleet.RoleAdmin)
	tests := []struct {
		name      string
		addr      string
		existing  []fleet.User
		adminFile bool
		sshDir    bool
		wantAdded []string
		wantErr   string
	}{
		{"loopback, no users: ~/.ssh keys become admins", "127.0.0.1:2222", nil, false, true, []string{"ada"}, ""},
		{"loopback, users exist: nothing", "127.0.0.1:2222", []fleet.User{bob.user}, false, true, nil, ""},
		{"not loopback: nothing", "0.0.0.0:2222", nil, false, true, nil, ""},
		{"admin keys file", "0.0.0.0:2222", nil, true, false, []string{"bob"}, ""},
		{"admin keys file, already a user", "0.0.0.0:2222", []fleet.User{bob.user}, true, false, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			us := newUsers(tt.existing...)
			var audit []fleet.AuditEntry
			opts := Options{Addr: tt.addr, Users: us, HostKeyPath: filepath.Join(dir, "hk"),
				Source: func(fleet.User) console.Source { return nil }, Audit: func(e fleet.AuditEntry) { audit = append(audit, e) }}
			if tt.sshDir {
				writePub(t, filepath.Join(dir, "home"), "id_ed25519.pub", ada)
				opts.LoopbackBootstrapKeysDir = filepath.Join(dir, "home")
			}
			if tt.adminFile {
				writePub(t, dir, "admins", bob)
				opts.AdminKeysFile = filepath.Join(dir, "admins")
			}
			s, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			err = s.bootstrap(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, u := range us.added {
				if u.Role != fleet.RoleAdmin {
					t.Fatalf("bootstrap added %s as %s, want admin", u.Name, u.Role)
				}
				names = append(names, u.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.wantAdded, ",") {
				t.Fatalf("added %v, want %v", names, tt.wantAdded)
			}
			if len(audit) != len(tt.wantAdded) {
				t.Fatalf("audit has %d entries for %d added users", len(audit), len(tt.wantAdded))
			}
			for _, e := range audit {
				if e.Action != "user add" || e.Outcome != "ok" {
					t.Fatalf("audit entry %+v", e)
				}
			}
		})
	}
}

func TestBadOptionsAreRefused(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := func(fleet.User) console.Source { return nil }
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no users", Options{HostKeyPath: filepath.Join(dir, "k"), Source: src}, "no user store"},
		{"no source", Options{HostKeyPath: filepath.Join(dir, "k"), Users: newUsers()}, "no console source"},
		{"no host key", Options{Users: newUsers(), Source: src}, "no host key path"},
		{"bad addr", Options{Addr: "2222", HostKeyPath: filepath.Join(dir, "k"), Users: newUsers(), Source: src}, "not host:port"},
		{"bad theme", Options{Theme: "neon", HostKeyPath: filepath.Join(dir, "k"), Users: newUsers(), Source: src}, `unknown theme "neon"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want an error about %q", err, tt.want)
			}
		})
	}
	s, err := New(Options{AdminKeysFile: bad, HostKeyPath: filepath.Join(dir, "k"), Users: newUsers(), Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.bootstrap(context.Background()); err == nil || !strings.Contains(err.Error(), "line 1 is not a public key") {
		t.Fatalf("bad admin keys file: %v", err)
	}
}

func TestUserName(t *testing.T) {
	tests := map[string]string{"alice@laptop": "alice", "": "admin", "ops team": "opsteam", "r.o-b_1@x": "r.o-b_1", "@host": "admin"}
	for in, want := range tests {
		if got := userName(in); got != want {
			t.Errorf("userName(%q) = %q, want %q", in, got, want)
		}
	}
}

// ptySession opens an interactive console over SSH with its output fed to a
// terminal emulator, which also answers the program's terminal queries.
type ptySession struct {
	t    *testing.T
	emu  *vt.SafeEmulator
	sess *gossh.Session
	done chan error
}

func openConsole(t *testing.T, addr string, id identity, w, h int) *ptySession {
	t.Helper()
	c, err := dial(addr, gossh.PublicKeys(id.signer))
	if err != nil {
		t.Fatalf("dial as %s: %v", id.user.Name, err)
	}
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	screen := consoletest.NewScreen(w, h)
	emu := screen.Emu
	stdin, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	sess.Stdout = emu
	if err := sess.RequestPty("xterm-256color", h, w, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	screen.Pump(stdin)
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	ps := &ptySession{t: t, emu: emu, sess: sess, done: make(chan error, 1)}
	waited := make(chan struct{})
	go func() { ps.done <- sess.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = sess.Close()
		_ = c.Close()
		// Wait returns once the session's output copy has stopped, so the
		// screen is no longer written to when it closes.
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Error("session did not end")
		}
		screen.Close()
	})
	return ps
}

func (p *ptySession) screen() string { return ansi.Strip(p.emu.Render()) }

func (p *ptySession) waitFor(what string, cond func(string) bool) string {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := p.screen()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s; screen:\n%s", what, s)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (p *ptySession) waitText(texts ...string) string {
	p.t.Helper()
	return p.waitFor(strings.Join(texts, ", "), func(s string) bool {
		for _, x := range texts {
			if !strings.Contains(s, x) {
				return false
			}
		}
		return true
	})
}

func TestConsoleOverSSHRolesAndDrain(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	vic := newIdentity(t, "vic", fleet.RoleViewer)
	ts := startServer(t, Options{Users: newUsers(op.user, vic.user)})

	v := openConsole(t, ts.addr, vic, 150, 30)
	v.waitText("Started with", "vic (viewer)", "8x RTX 3060", "Apple M1 Ultra", "Apple M4 Max")
	v.emu.SendText("d")
	v.waitText("drain needs the operator role; you are viewer")
	v.emu.SendText("y")

	o := openConsole(t, ts.addr, op, 150, 30)
	o.waitText("Started with", "olga (operator)")
	o.emu.SendText("j")
	o.emu.SendText("d")
	o.waitText("Drain ultra/qwen3-4b?", "3 requests in flight")
	o.emu.SendText("y")
	o.waitText("draining ultra/qwen3-4b: 3 in flight")
	acts := ts.src.Actions()
	if len(acts) != 1 || acts[0].Kind != fleet.ActionDrain || acts[0].Targets[0] != "ultra/qwen3-4b" {
		t.Fatalf("hub got %+v, want only olga's drain of ultra", acts)
	}
	// The second session sees the state change.
	v.waitText("draining")

	// Resize reflows over SSH too.
	if err := v.sess.WindowChange(14, 90); err != nil {
		t.Fatal(err)
	}
	v.emu.Resize(90, 14)
	// A 90-column table drops the OS column and keeps the command line's
	// short form.
	v.waitFor("a 90-column layout", func(s string) bool {
		return strings.Contains(s, "ultra") && !strings.Contains(s, "Host") && strings.Contains(s, "Started with") &&
			strings.Contains(s, "vllm serve Qwen")
	})

	o.emu.SendText("q")
	select {
	case err := <-o.done:
		if err != nil {
			t.Fatalf("console session ended with %v, want exit 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("q did not end the session")
	}
}

func TestConsoleIdleTimeout(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	ts := startServer(t, Options{Users: newUsers(op.user), IdleTimeout: 400 * time.Millisecond})
	p := openConsole(t, ts.addr, op, 120, 24)
	p.waitText("Started with")
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("an idle console was not disconnected")
	}
	p.waitText("disconnected after 400ms without input")
}

func TestTwentyConcurrentSessionsGetLiveUpdates(t *testing.T) {
	if testing.Short() {
		t.Skip("20 SSH sessions")
	}
	op := newIdentity(t, "olga", fleet.RoleViewer)
	const n = 20
	ts := startServer(t, Options{Users: newUsers(op.user), MaxSessionsPerUser: n, MaxConsoles: n})
	sessions := make([]*ptySession, n)
	for i := range sessions {
		sessions[i] = openConsole(t, ts.addr, op, 140, 20)
	}
	rigRow := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.Contains(l, "8x RTX 3060") {
				return l
			}
		}
		return ""
	}
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i, p := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(60 * time.Second)
			first := ""
			for time.Now().Before(deadline) {
				row := rigRow(p.screen())
				switch {
				case row == "":
				case first == "":
					first = row
				case row != first:
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			errs <- fmt.Sprintf("session %d saw no change of the rig row (first %q); screen:\n%s", i, first, p.screen())
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestListenAndServeStopsWithContext(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	dir := t.TempDir()
	writePub(t, filepath.Join(dir, "home"), "id_ed25519.pub", op)
	us := newUsers()
	s, err := New(Options{Addr: "127.0.0.1:0", Users: us, HostKeyPath: filepath.Join(dir, "hk"),
		Source:                   func(fleet.User) console.Source { return consoletest.Demo() },
		Exec:                     execTree,
		LoopbackBootstrapKeysDir: filepath.Join(dir, "home")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ListenAndServe(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.Addr() == nil {
		if time.Now().After(deadline) {
			t.Fatal("server never listened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The bootstrap admitted the hub user's key, so it logs in as an admin.
	out, _, code := run(t, s.Addr().String(), op, "whoami", "")
	if code != 0 || !strings.HasSuffix(out, " admin\n") {
		t.Fatalf("whoami = %q exit %d, want the bootstrapped admin", out, code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ListenAndServe after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ListenAndServe did not return after its context ended")
	}
	// A busy address is a clear error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s2, err := New(Options{Addr: ln.Addr().String(), Users: us, HostKeyPath: filepath.Join(dir, "hk"),
		Source: func(fleet.User) console.Source { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.ListenAndServe(context.Background()); err == nil || !strings.Contains(err.Error(), "is another fleet already serving there") {
		t.Fatalf("busy address: %v", err)
	}
}

// consolesOpen is how many console slots the server holds.
func (s *Server) consolesOpen() int {
	s.limits.mu.Lock()
	defer s.limits.mu.Unlock()
	return s.limits.console
}

// A client that closes its console's session channel but keeps the
// connection, as an OpenSSH ControlMaster does when the terminal of the
// session is closed, ends the console: before, the console ran on with its
// window channel closed, resizing to 0x0 in a loop at a core of the hub,
// until the master exited.
func TestConsoleEndsWhenItsChannelClosesOnAnOpenConnection(t *testing.T) {
	op := newIdentity(t, "olga", fleet.RoleOperator)
	ts := startServer(t, Options{Users: newUsers(op.user)})
	c, err := dial(ts.addr, gossh.PublicKeys(op.signer))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	screen := consoletest.NewScreen(120, 30)
	defer screen.Close()
	stdin, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	sess.Stdout = screen.Emu
	if err := sess.RequestPty("xterm-256color", 30, 120, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	screen.Pump(stdin)
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second) // hang guard
	for !strings.Contains(ansi.Strip(screen.Emu.Render()), "Started with") {
		if time.Now().After(deadline) {
			t.Fatalf("the console did not show; screen:\n%s", ansi.Strip(screen.Emu.Render()))
		}
		time.Sleep(25 * time.Millisecond)
	}
	if n := ts.consolesOpen(); n != 1 {
		t.Fatalf("%d consoles open, want 1", n)
	}
	// Close the session channel only; the connection stays.
	if err := sess.Close(); err != nil {
		t.Fatal(err)
	}
	for ts.consolesOpen() != 0 {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("the console still runs after its session channel closed (%d open)", ts.consolesOpen())
		}
		time.Sleep(25 * time.Millisecond)
	}
	ticks := ts.src.Ticks()
	// The connection still serves: a command on it answers.
	s2, err := c.NewSession()
	if err != nil {
		t.Fatalf("the connection no longer opens sessions: %v", err)
	}
	defer s2.Close()
	out, err := s2.Output("whoami")
	if err != nil || !strings.Contains(string(out), "olga") {
		t.Fatalf("whoami on the same connection: %q, %v", out, err)
	}
	// And the ended console reads the hub no more.
	time.Sleep(5 * ts.opts.Refresh)
	if now := ts.src.Ticks(); now != ticks {
		t.Fatalf("the closed console read %d snapshots after it ended", now-ticks)
	}
}
