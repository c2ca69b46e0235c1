package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet/internal/syncbuf"
)

// Cluster is a PostgreSQL server of one test's own: initdb'd into a fresh
// temp dir, listening only on a unix socket there (no TCP port, so it is
// reachable from every network namespace on the machine and from nothing
// else), trusting whoever reaches the socket. Stop and Start take it away
// and bring it back with its data, as an operator restarting the database
// does. It is stopped and deleted when the test ends.
type Cluster struct {
	t      testing.TB
	bindir string
	dir    string // the socket's dir; the data is in dir/data
	cred   *syscall.Credential
	log    *syncbuf.Buffer

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// StartCluster initdbs and starts a cluster for t. PostgreSQL refuses to
// run as root, so as root the server runs as the package's postgres user
// (nobody without it), as .ci/with-postgres does. Without PostgreSQL's
// server binaries the test is skipped with a message saying what to
// install, except in CI (CI=true), where it fails.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bindir, err := serverBinaries()
	if err != nil {
		missing(t, err.Error())
	}
	c := &Cluster{t: t, bindir: bindir, log: &syncbuf.Buffer{}}
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		c.cred, err = serverUser()
		if err != nil {
			t.Fatal(err)
		}
		uid, gid = int(c.cred.Uid), int(c.cred.Gid)
	}
	// Under $TMPDIR when the server's user can reach it (CI's run-wide
	// temp root, where a server a test left behind is found by its working
	// directory); /tmp otherwise.
	base := os.TempDir()
	if !reachable(base, uid, gid) {
		base = "/tmp"
	}
	c.dir, err = os.MkdirTemp(base, "fleet-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.remove)
	if err := os.Chown(c.dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	initdb := []string{"-D", c.dataDir(), "-U", "fleet", "--auth=trust", "--no-sync", "--encoding=UTF8"}
	// Text sorts by English rules where this PostgreSQL can, as in
	// .ci/with-postgres (see there).
	if help, _ := exec.Command(filepath.Join(bindir, "initdb"), "--help").Output(); strings.Contains(string(help), "--locale-provider") {
		initdb = append(initdb, "--locale=C.UTF-8", "--locale-provider=icu", "--icu-locale=en")
	}
	cmd := c.command("initdb", initdb...)
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("initdb a test cluster in %s: %v\n%s", c.dir, err, out.String())
	}
	c.Start()
	return c
}

// URL is the database URL of the cluster's postgres database, on its
// socket.
func (c *Cluster) URL() string {
	return "postgres://fleet@/postgres?host=" + c.dir
}

// Start runs the server and returns once it accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	if c.cmd != nil {
		c.t.Fatal("pgtest: Start on a cluster that is running")
	}
	// fsync off: the cluster lives as long as one test.
	cmd := c.command("postgres", "-D", c.dataDir(), "-k", c.dir, "-c", "listen_addresses=",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off")
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting the test cluster's postgres: %v", err)
	}
	c.cmd, c.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(c.done)
	db, err := sql.Open("pgx", c.URL())
	if err != nil {
		c.t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-c.done:
			c.t.Fatalf("the test cluster's postgres exited at start:\n%s", c.log.String())
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the test cluster's postgres does not accept connections after 60 s: %v\n%s", err, c.log.String())
		}
	}
}

// Stop shuts the server down as `pg_ctl stop` does by default (fast:
// sessions are ended, the data kept) and returns once it has exited.
func (c *Cluster) Stop() {
	c.t.Helper()
	if c.cmd == nil {
		c.t.Fatal("pgtest: Stop on a cluster that is not running")
	}
	c.signal(syscall.SIGINT, 60*time.Second)
}

// signal sends sig to the postmaster and waits for it to exit, killing it
// past within.
func (c *Cluster) signal(sig syscall.Signal, within time.Duration) {
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(within):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.cmd = nil
}

func (c *Cluster) remove() {
	if c.cmd != nil {
		// Immediate: nothing of the data matters any more.
		c.signal(syscall.SIGQUIT, 10*time.Second)
	}
	if c.t.Failed() {
		l := c.log.String()
		if len(l) > 8000 {
			l = "…" + l[len(l)-8000:]
		}
		c.t.Logf("test cluster's postgres log:\n%s", l)
	}
	_ = os.RemoveAll(c.dir)
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) command(program string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bindir, program), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	dieWithParent(cmd.SysProcAttr)
	return cmd
}

// missing skips t, or fails it in CI, for want of PostgreSQL.
func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// serverBinaries finds Debian's PostgreSQL server binaries (the newest
// major version under /usr/lib/postgresql) or initdb on the PATH.
func serverBinaries() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) < majorOf(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real), nil
		}
	}
	return "", errors.New("no PostgreSQL server to start a test cluster with (no initdb under /usr/lib/postgresql/*/bin or on the PATH): install it (apt-get install postgresql; .ci/run does)")
}

func majorOf(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

// serverUser is the account a cluster runs as when the tests run as root.
func serverUser() (*syscall.Credential, error) {
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("PostgreSQL will not run as root and there is neither a postgres nor a nobody user to run it as (%w): install postgresql, whose package makes the postgres user", errors.Join(errs...))
}

// reachable says whether uid (in group gid) may search every directory
// from / down to dir.
func reachable(dir string, uid, gid int) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		mode := fi.Mode().Perm()
		switch {
		case int(st.Uid) == uid:
			if mode&0o100 == 0 {
				return false
			}
		case int(st.Gid) == gid:
			if mode&0o010 == 0 {
				return false
			}
		case mode&0o001 == 0:
			return false
		}
		if p == "/" {
			return true
		}
	}
}
