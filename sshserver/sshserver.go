// Package sshserver serves the fleet console over SSH with wish: public-key
// authentication against the user table, one Bubble Tea console per
// interactive session, and the command tree for `ssh host COMMAND`.
package sshserver

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/ssh"
	"charm.land/wish/v2"
	bm "charm.land/wish/v2/bubbletea"
	gossh "golang.org/x/crypto/ssh"

	"fleet"
	"fleet/console"
	"fleet/themes"
)

// UserStore is the user table as the SSH server needs it.
type UserStore interface {
	// UserByFingerprint returns the user whose key has the SHA256
	// fingerprint fp ("SHA256:…"), or an error when there is none.
	UserByFingerprint(ctx context.Context, fp string) (fleet.User, error)
	CountUsers(ctx context.Context) (int, error)
	AddUser(ctx context.Context, u fleet.User) error
}

// ExecFunc runs one command for an authenticated user and returns the exit
// status (0 ok, 1 failed, 2 usage). The command tree implements it.
type ExecFunc func(ctx context.Context, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int

// Options configure the server.
type Options struct {
	// Addr is host:port to listen on (default 127.0.0.1:2222).
	Addr string
	// HostKeyPath is the server's private key; created on first start and
	// reused, so clients never see the host key change.
	HostKeyPath string
	Users       UserStore
	// Audit records who did what; nil drops the entries.
	Audit func(fleet.AuditEntry)
	// Source gives the console of user u its data and actions.
	Source func(u fleet.User) console.Source
	Exec   ExecFunc
	// IdleTimeout disconnects a session with no input for that long
	// (default 30 minutes). The console's own refreshes do not count.
	IdleTimeout time.Duration
	// MaxConnsPerIPPerMinute caps the failed logins (connections that end
	// without authenticating) from one address in a minute (default 30;
	// negative disables the limit). Logins that succeed never count. Past
	// it, the address's connections are told why and when to retry (an SSH
	// banner) and only keys of console users get in, so a stranger behind
	// the same NAT or jump host locks nobody out; past floodFactor times
	// it, they are closed before the handshake.
	MaxConnsPerIPPerMinute int
	Logger                 *slog.Logger
	// AdminKeysFile is an authorized_keys file whose keys become admins on
	// start (users that already exist are left alone).
	AdminKeysFile string
	// LoopbackBootstrapKeysDir is where to find *.pub keys to make the
	// first admins when the server listens on loopback and no user exists
	// (the hub user's ~/.ssh). Empty disables it.
	LoopbackBootstrapKeysDir string
	// Theme is the server-wide theme name ("" picks from each client's
	// background colour); a user's own preference wins over it.
	Theme string
	// Refresh is the console refresh period (default 500ms).
	Refresh time.Duration
	// DrainTimeout is the hub's (serve --drain-timeout), which a console's
	// drain and restart confirmations quote (default the console's).
	DrainTimeout time.Duration
	// MaxSessionsPerConn caps the sessions (consoles and commands) open at
	// once on one connection (default 10, OpenSSH's MaxSessions; negative
	// disables the limit).
	MaxSessionsPerConn int
	// MaxSessionsPerUser caps the sessions one user has open at once over
	// all their connections (default 10; negative disables).
	MaxSessionsPerUser int
	// MaxConsoles caps the interactive consoles open at once on the hub
	// (default 16; negative disables). Each console costs memory (up to
	// about 24 MB at the terminal cap) and a snapshot per refresh;
	// commands are not counted.
	MaxConsoles int
}

const (
	defaultAddr      = "127.0.0.1:2222"
	defaultIdle      = 30 * time.Minute
	defaultRateLimit = 30
	handshakeTimeout = 30 * time.Second
	// floodFactor times the failed-login limit, a minute's failures from
	// one address are a flood: its connections are closed before the key
	// exchange, which would cost the hub CPU for each.
	floodFactor = 4

	defaultSessionsPerConn = 10
	defaultSessionsPerUser = 10
	defaultConsoles        = 16

	// MaxTermWidth and MaxTermHeight cap the terminal a console renders
	// for, whatever size the client asks for: a console costs about 240
	// bytes per cell (the renderer's cell buffers and each frame), so one
	// client asking for 3000×3000 cost the hub 2 GB. At the cap a console
	// is about 24 MB. A 4K screen at an 8×16 font is 480×135; a larger
	// terminal sees the console in its top-left 500×200 cells.
	MaxTermWidth  = 500
	MaxTermHeight = 200

	// MaxCommandBytes bounds a command line over SSH (its arguments joined
	// by spaces): node and worker names are short, and what is typed ends
	// up in logs and the audit.
	MaxCommandBytes = 4096
	// logArgBytes is how much of a command line a log line keeps.
	logArgBytes = 200
)

// Server is the SSH console server.
type Server struct {
	opts Options
	log  *slog.Logger
	srv  *ssh.Server
	// failures counts the failed logins per address (MaxConnsPerIPPerMinute).
	failures *loginFailures
	limits   *sessionLimits

	mu       sync.Mutex
	listener net.Listener
	closed   bool
}

type ctxKey struct{ name string }

var (
	userKey    = &ctxKey{"fleet-user"}
	idleKey    = &ctxKey{"fleet-idle"}
	refusedKey = &ctxKey{"fleet-refused-sessions"}
)

// CheckTheme says whether the console paints a theme of that name ("" is
// the client's background's): the server-wide theme and each user's own
// (fleet theme NAME) are one of these.
func CheckTheme(name string) error {
	if name == "" {
		return nil
	}
	_, err := themes.Named(name)
	return err
}

// New checks the options and prepares the server; ListenAndServe starts it.
func New(opts Options) (*Server, error) {
	if opts.Users == nil {
		return nil, errors.New("sshserver: no user store: the server cannot tell who may log in")
	}
	if opts.Source == nil {
		return nil, errors.New("sshserver: no console source: sessions would have nothing to show")
	}
	if opts.HostKeyPath == "" {
		return nil, errors.New("sshserver: no host key path: set it inside the data dir so the key survives restarts")
	}
	if opts.Addr == "" {
		opts.Addr = defaultAddr
	}
	if _, _, err := net.SplitHostPort(opts.Addr); err != nil {
		return nil, fmt.Errorf("sshserver: listen address %q is not host:port (e.g. 127.0.0.1:2222): %w", opts.Addr, err)
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = defaultIdle
	}
	if opts.MaxConnsPerIPPerMinute == 0 {
		opts.MaxConnsPerIPPerMinute = defaultRateLimit
	}
	opts.MaxSessionsPerConn = cmp.Or(opts.MaxSessionsPerConn, defaultSessionsPerConn)
	opts.MaxSessionsPerUser = cmp.Or(opts.MaxSessionsPerUser, defaultSessionsPerUser)
	opts.MaxConsoles = cmp.Or(opts.MaxConsoles, defaultConsoles)
	if err := CheckTheme(opts.Theme); err != nil {
		return nil, fmt.Errorf("sshserver: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Audit == nil {
		opts.Audit = func(fleet.AuditEntry) {}
	}
	if err := os.MkdirAll(filepath.Dir(opts.HostKeyPath), 0o700); err != nil {
		return nil, fmt.Errorf("sshserver: create the host key directory: %w", err)
	}
	_, statErr := os.Stat(opts.HostKeyPath)
	s := &Server{opts: opts, log: opts.Logger, failures: newLoginFailures(opts.MaxConnsPerIPPerMinute, time.Minute),
		limits: newSessionLimits(opts.MaxSessionsPerConn, opts.MaxSessionsPerUser, opts.MaxConsoles)}
	srv, err := wish.NewServer(
		wish.WithAddress(opts.Addr),
		wish.WithHostKeyPath(opts.HostKeyPath),
		wish.WithPublicKeyAuth(s.publicKeyAllowed),
		// The transport-level timeout catches dead clients and idle exec
		// sessions; the console's own idle watchdog is input-based.
		wish.WithIdleTimeout(opts.IdleTimeout),
		ssh.WrapConn(s.rateLimit),
		wish.WithMiddleware(
			s.runConsole,
			s.dispatch,
			s.identify,
		),
	)
	if err != nil {
		return nil, fmt.Errorf("sshserver: host key %s: %w", opts.HostKeyPath, err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		s.log.Info("created SSH host key", "path", opts.HostKeyPath)
	}
	srv.HandshakeTimeout = handshakeTimeout
	// Public keys only: no password, no keyboard-interactive.
	srv.PasswordHandler = nil
	srv.KeyboardInteractiveHandler = nil
	srv.ConnectionFailedCallback = func(conn net.Conn, err error) {
		s.log.Info("ssh connection refused", "remote", conn.RemoteAddr().String(), "err", err)
		s.failures.add(hostOf(conn.RemoteAddr()), time.Now())
	}
	srv.BannerHandler = s.banner
	// Sessions are the only channel type, as by default; this one counts them.
	srv.ChannelHandlers = map[string]ssh.ChannelHandler{"session": s.sessionChannel}
	s.srv = srv
	return s, nil
}

// publicKeyAllowed answers "is this key a user?" during the handshake. It
// grants nothing: the handshake may ask about keys the client never proves
// it holds, so identity is derived again from the verified key in identify.
func (s *Server) publicKeyAllowed(ctx ssh.Context, key ssh.PublicKey) bool {
	fp := gossh.FingerprintSHA256(key)
	_, err := s.opts.Users.UserByFingerprint(ctx, fp)
	if err != nil {
		s.log.Debug("ssh key refused: no console user has it", "remote", ctx.RemoteAddr().String(), "fingerprint", fp, "err", err)
		return false
	}
	return true
}

// identify re-derives the user from the key the session was authenticated
// with, and refuses the session when there is none.
func (s *Server) identify(next ssh.Handler) ssh.Handler {
	return func(sess ssh.Session) {
		defer func() {
			if r := recover(); r != nil {
				s.log.Error("ssh session panicked", "remote", sess.RemoteAddr().String(), "panic", r)
				_ = sess.Exit(1)
			}
		}()
		key := sess.PublicKey()
		if key == nil {
			wish.Fatalln(sess, "fleet: this server accepts public keys only")
			return
		}
		fp := gossh.FingerprintSHA256(key)
		u, err := s.opts.Users.UserByFingerprint(sess.Context(), fp)
		if err != nil {
			s.log.Warn("ssh session without a user", "remote", sess.RemoteAddr().String(), "fingerprint", fp, "err", err)
			wish.Fatalln(sess, "fleet: your key is not a console user; ask an admin to run `user add`")
			return
		}
		sess.Context().SetValue(userKey, u)
		// Measured raw, before it is split into arguments: splitting takes
		// time quadratic in the length (4 s for 120 KB).
		if raw := sess.RawCommand(); len(raw) > MaxCommandBytes {
			s.log.Log(sess.Context(), refusalLevel(sess.Context()), "ssh command refused: too long (warned once per connection)",
				"user", u.Name, "remote", sess.RemoteAddr().String(), "bytes", len(raw), "what", fleet.Clip(raw, logArgBytes))
			fmt.Fprintf(sess.Stderr(), "fleet: the command is %d bytes long; the limit is %d bytes (names of nodes and workers are short: check what was sent)\n",
				len(raw), MaxCommandBytes)
			_ = sess.Exit(2)
			return
		}
		what := "console"
		if cmd := sess.Command(); len(cmd) > 0 {
			what = fleet.Clip(strings.Join(cmd, " "), logArgBytes)
		}
		s.log.Info("ssh session", "user", u.Name, "role", u.Role, "remote", sess.RemoteAddr().String(), "what", what)
		start := time.Now()
		next(sess)
		s.log.Info("ssh session ended", "user", u.Name, "what", what, "duration", time.Since(start).Round(time.Millisecond))
	}
}

func userFrom(sess ssh.Session) (fleet.User, bool) {
	u, ok := sess.Context().Value(userKey).(fleet.User)
	return u, ok
}

// dispatch sends a command to the command tree; a session with a terminal
// and no command falls through to the console.
func (s *Server) dispatch(next ssh.Handler) ssh.Handler {
	return func(sess ssh.Session) {
		u, ok := userFrom(sess)
		if !ok {
			wish.Fatalln(sess, "fleet: not authenticated")
			return
		}
		if cmd := sess.Command(); len(cmd) > 0 {
			if s.opts.Exec == nil {
				fmt.Fprintln(sess.Stderr(), "fleet: this server runs the console only; commands are not available")
				_ = sess.Exit(1)
				return
			}
			code := s.opts.Exec(sess.Context(), u, cmd, sess, sess, sess.Stderr())
			_ = sess.Exit(code)
			return
		}
		if _, _, hasPty := sess.Pty(); !hasPty {
			fmt.Fprintln(sess.Stderr(), "fleet: the console needs a terminal (ssh -t), or give a command, e.g. `ssh -p 2222 host workers`")
			_ = sess.Exit(2)
			return
		}
		release, ok := s.limits.openConsole()
		if !ok {
			s.log.Log(sess.Context(), refusalLevel(sess.Context()), "ssh console refused: too many consoles (warned once per connection)",
				"user", u.Name, "remote", sess.RemoteAddr().String(), "limit", s.opts.MaxConsoles)
			fmt.Fprintf(sess.Stderr(), "fleet: the hub already serves %s, its limit; try again later, or run a command instead (e.g. `workers`)\n",
				plural(s.opts.MaxConsoles, "console"))
			_ = sess.Exit(1)
			return
		}
		defer release()
		var idle atomic.Bool
		sess.Context().SetValue(idleKey, &idle)
		next(sess)
		if idle.Load() {
			fmt.Fprintf(sess, "fleet: disconnected after %s without input\n", s.opts.IdleTimeout)
		}
	}
}

// runConsole runs the console of an interactive session until the user
// quits, the connection drops, or the session channel closes. It replaces
// wish's bubbletea middleware, whose window-change loop read the session's
// window channel after the channel had closed: a client that closed its
// session but kept the connection (an OpenSSH ControlMaster whose terminal
// was closed) got zero-sized resizes in a loop, a core of the hub each,
// until the master exited.
func (s *Server) runConsole(next ssh.Handler) ssh.Handler {
	return func(sess ssh.Session) {
		p := s.program(sess)
		if p == nil {
			next(sess)
			return
		}
		_, windowChanges, _ := sess.Pty()
		ctx, cancel := context.WithCancel(sess.Context())
		defer cancel()
		go func() {
			for {
				select {
				case <-ctx.Done():
					p.Quit()
					return
				case w, open := <-windowChanges:
					if !open {
						// The client closed the session channel: nothing
						// it shows or types reaches us any more.
						u, _ := userFrom(sess)
						s.log.Info("console ended: the client closed its session", "user", u.Name, "remote", sess.RemoteAddr().String())
						p.Quit()
						return
					}
					p.Send(tea.WindowSizeMsg{Width: w.Width, Height: w.Height})
				}
			}
		}()
		if _, err := p.Run(); err != nil && !errors.Is(err, tea.ErrProgramKilled) {
			s.log.Warn("console ended with an error", "err", err)
		}
		// Kill restores what the program changed if Run ended on a panic.
		p.Kill()
		next(sess)
	}
}

// program builds the console of one interactive session.
func (s *Server) program(sess ssh.Session) *tea.Program {
	u, ok := userFrom(sess)
	if !ok {
		return nil
	}
	pty, _, _ := sess.Pty()
	width, height := capWindow(pty.Window.Width, pty.Window.Height)
	if width != pty.Window.Width || height != pty.Window.Height {
		s.log.Info("terminal size capped", "user", u.Name, "asked", fmt.Sprintf("%dx%d", pty.Window.Width, pty.Window.Height),
			"rendered", fmt.Sprintf("%dx%d", width, height))
	}
	theme := themes.Theme{}
	for _, name := range []string{u.Theme, s.opts.Theme} {
		if name == "" {
			continue
		}
		if t, err := themes.Named(name); err == nil {
			theme = t
			break
		}
		s.log.Warn("ignoring unknown theme", "user", u.Name, "theme", name)
	}
	m := console.New(s.opts.Source(u), console.Options{
		User: u, Theme: theme, Width: width, Height: height,
		Refresh: s.opts.Refresh, Context: sess.Context(), Logger: s.log, DrainTimeout: s.opts.DrainTimeout,
	})
	in := &inputClock{r: sess}
	in.touch()
	opts := append(bm.MakeOptions(sess), tea.WithInput(in),
		// The hub owns SIGINT/SIGTERM; a session must not swallow them.
		tea.WithoutSignalHandler(),
		// Rendered within the cap from the first frame and after every
		// window-change. The filter replaces MakeOptions' own, so it keeps
		// what that one did: a client cannot suspend the hub's program.
		tea.WithWindowSize(width, height),
		tea.WithFilter(func(_ tea.Model, msg tea.Msg) tea.Msg {
			switch m := msg.(type) {
			case tea.WindowSizeMsg:
				m.Width, m.Height = capWindow(m.Width, m.Height)
				return m
			case tea.SuspendMsg:
				return tea.ResumeMsg{}
			}
			return msg
		}))
	p := tea.NewProgram(m, opts...)
	if idle, ok := sess.Context().Value(idleKey).(*atomic.Bool); ok {
		go s.watchIdle(sess, in, p, idle)
	}
	return p
}

// inputClock remembers when the client last typed, because the console
// writes every refresh and so never looks idle to the transport.
type inputClock struct {
	r    io.Reader
	last atomic.Int64
}

func (c *inputClock) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *inputClock) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *inputClock) idleFor() time.Duration {
	return time.Since(time.Unix(0, c.last.Load()))
}

func (s *Server) watchIdle(sess ssh.Session, in *inputClock, p *tea.Program, idle *atomic.Bool) {
	limit := s.opts.IdleTimeout
	if limit <= 0 {
		return
	}
	t := time.NewTicker(min(limit/4, 10*time.Second))
	defer t.Stop()
	for {
		select {
		case <-sess.Context().Done():
			return
		case <-t.C:
			if in.idleFor() >= limit {
				u, _ := userFrom(sess)
				s.log.Info("closing idle console", "user", u.Name, "idle", in.idleFor().Round(time.Second))
				idle.Store(true)
				p.Quit()
				return
			}
		}
	}
}

// hostOf is the address part of a connection's remote address.
func hostOf(addr net.Addr) string {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

// rateLimit closes connections from an address that failed to log in
// floodFactor times the limit in the last minute, before any handshake
// work is spent on them. Below that, an address over the limit still gets
// the handshake: its keys of console users get in, and the banner tells
// the others why they do not (banner).
func (s *Server) rateLimit(ctx ssh.Context, conn net.Conn) net.Conn {
	host := hostOf(conn.RemoteAddr())
	if failed, _ := s.failures.count(host, time.Now()); s.opts.MaxConnsPerIPPerMinute > 0 && failed >= floodFactor*s.opts.MaxConnsPerIPPerMinute {
		s.log.Warn("ssh connection closed before the handshake: a flood of failed logins", "remote", host,
			"failed_last_minute", failed, "limit_per_minute", s.opts.MaxConnsPerIPPerMinute)
		return nil
	}
	ctx.SetValue(refusedKey, new(atomic.Int64))
	return conn
}

// banner is the SSH banner OpenSSH prints before authentication: empty,
// unless the client's address is over its failed-login limit, when it says
// so and when to retry, since only keys of console users get in then.
func (s *Server) banner(ctx ssh.Context) string {
	host := hostOf(ctx.RemoteAddr())
	failed, oldest := s.failures.count(host, time.Now())
	if s.opts.MaxConnsPerIPPerMinute <= 0 || failed < s.opts.MaxConnsPerIPPerMinute {
		return ""
	}
	retry := max(time.Until(oldest.Add(time.Minute)).Round(time.Second), time.Second)
	return fmt.Sprintf("fleet: %d logins from %s failed in the last minute (the limit is %d a minute, serve --ssh-rate). "+
		"A console user's key still gets in; any other is refused, and at %d failures this address is cut off before login. "+
		"The oldest failure stops counting in %s: retry then, with a key an admin has added ('user add').\r\n",
		failed, host, s.opts.MaxConnsPerIPPerMinute, floodFactor*s.opts.MaxConnsPerIPPerMinute, retry)
}

// ListenAndServe admits the first admins if needed, then serves until ctx
// ends or Close is called.
func (s *Server) ListenAndServe(ctx context.Context) error {
	if err := s.bootstrap(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("sshserver: listen on %s: %w (is another fleet already serving there? change --ssh)", s.opts.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on an existing listener (tests pass 127.0.0.1:0).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return ssh.ErrServerClosed
	}
	s.listener = ln
	s.mu.Unlock()
	s.log.Info("ssh console listening", "addr", ln.Addr().String())
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	err := s.srv.Serve(ln)
	if errors.Is(err, ssh.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("sshserver: %w", err)
}

// Addr is the address the server listens on once serving.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		return nil
	}
	return s.listener.Addr()
}

// Close stops listening and ends every session.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.srv.Close()
}

// Shutdown stops listening and waits for sessions to end, up to ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.srv.Shutdown(ctx)
}

// bootstrap admits the first admins: every key of AdminKeysFile, and when the
// server is on loopback with no users at all, the hub user's own keys.
func (s *Server) bootstrap(ctx context.Context) error {
	if s.opts.AdminKeysFile != "" {
		keys, err := readAuthorizedKeys(s.opts.AdminKeysFile)
		if err != nil {
			return fmt.Errorf("sshserver: admin keys: %w", err)
		}
		if len(keys) == 0 {
			return fmt.Errorf("sshserver: admin keys file %s holds no public key: add lines like those of ~/.ssh/id_ed25519.pub", s.opts.AdminKeysFile)
		}
		if err := s.addAdmins(ctx, keys, "admin keys file "+s.opts.AdminKeysFile); err != nil {
			return err
		}
	}
	if s.opts.LoopbackBootstrapKeysDir == "" || !fleet.IsLoopbackAddr(s.opts.Addr) {
		return nil
	}
	n, err := s.opts.Users.CountUsers(ctx)
	if err != nil {
		return fmt.Errorf("sshserver: count console users: %w", err)
	}
	if n > 0 {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(s.opts.LoopbackBootstrapKeysDir, "*.pub"))
	var keys []authorizedKey
	for _, f := range files {
		ks, err := readAuthorizedKeys(f)
		if err != nil {
			s.log.Warn("skipping unreadable public key", "file", f, "err", err)
			continue
		}
		keys = append(keys, ks...)
	}
	if len(keys) == 0 {
		s.log.Warn("no console users and no public keys to make the first admins: nobody can log in until `fleet user add` (or --admin-keys)",
			"looked_in", s.opts.LoopbackBootstrapKeysDir)
		return nil
	}
	s.log.Info("no console users yet and SSH listens on loopback: making this account's public keys the first admins",
		"dir", s.opts.LoopbackBootstrapKeysDir, "files", files)
	return s.addAdmins(ctx, keys, "loopback bootstrap from "+s.opts.LoopbackBootstrapKeysDir)
}

type authorizedKey struct {
	key     gossh.PublicKey
	comment string
	line    string
}

func readAuthorizedKeys(path string) ([]authorizedKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	var out []authorizedKey
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, comment, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("%s line %d is not a public key (%w): expected e.g. \"ssh-ed25519 AAAA… alice@laptop\"", path, lineNo, err)
		}
		out = append(out, authorizedKey{key: key, comment: comment, line: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key)))})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// addAdmins makes each key a user with the admin role, unless a user has
// it already ("admit" is only admission's verdict, docs/glossary.md).
func (s *Server) addAdmins(ctx context.Context, keys []authorizedKey, source string) error {
	used := map[string]int{}
	for _, k := range keys {
		fp := gossh.FingerprintSHA256(k.key)
		if u, err := s.opts.Users.UserByFingerprint(ctx, fp); err == nil {
			s.log.Debug("admin key already a user", "user", u.Name, "fingerprint", fp)
			continue
		}
		name := userName(k.comment)
		if used[name]++; used[name] > 1 {
			name = fmt.Sprintf("%s-%d", name, used[name])
		}
		u := fleet.User{Name: name, Role: fleet.RoleAdmin, PublicKey: k.line, Fingerprint: fp}
		entry := fleet.AuditEntry{At: time.Now(), User: "fleet", Action: string(fleet.ActionUserAdd), Target: name + " (admin)", Outcome: "ok"}
		if err := s.opts.Users.AddUser(ctx, u); err != nil {
			entry.Outcome = "failed: " + err.Error()
			s.opts.Audit(entry)
			return fmt.Errorf("sshserver: add admin %s from %s: %w", name, source, err)
		}
		s.opts.Audit(entry)
		s.log.Info("added admin", "user", name, "fingerprint", fp, "from", source)
	}
	return nil
}

// userName makes a user name from a key comment ("alice@laptop" → "alice").
func userName(comment string) string {
	name, _, _ := strings.Cut(strings.TrimSpace(comment), "@")
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return -1
	}, name)
	if name == "" {
		return "admin"
	}
	return name
}

// loginFailures counts events (failed logins) per address over a sliding
// window.
type loginFailures struct {
	max    int
	window time.Duration
	mu     sync.Mutex
	seen   map[string][]time.Time
	sweep  time.Time
}

func newLoginFailures(max int, window time.Duration) *loginFailures {
	return &loginFailures{max: max, window: window, seen: map[string][]time.Time{}}
}

// count is how many events addr had in the window up to now, and when the
// oldest of them was.
func (l *loginFailures) count(addr string, now time.Time) (int, time.Time) {
	if l.max < 0 {
		return 0, time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.current(addr, now)
	if len(ts) == 0 {
		return 0, time.Time{}
	}
	return len(ts), ts[0]
}

// add counts an event of addr at now; past floodFactor times the limit
// the oldest are dropped, as past it the address is refused anyway.
func (l *loginFailures) add(addr string, now time.Time) {
	if l.max < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := append(l.current(addr, now), now)
	if keep := floodFactor * l.max; len(ts) > keep {
		ts = ts[len(ts)-keep:]
	}
	l.seen[addr] = ts
}

// current is addr's events within the window, the older ones forgotten;
// l.mu is held.
func (l *loginFailures) current(addr string, now time.Time) []time.Time {
	cut := now.Add(-l.window)
	// Forget quiet addresses now and then so the map stays small.
	if now.Sub(l.sweep) > l.window {
		for a, ts := range l.seen {
			if len(ts) == 0 || ts[len(ts)-1].Before(cut) {
				delete(l.seen, a)
			}
		}
		l.sweep = now
	}
	ts := l.seen[addr]
	i := 0
	for i < len(ts) && ts[i].Before(cut) {
		i++
	}
	if i == len(ts) {
		delete(l.seen, addr)
		return nil
	}
	l.seen[addr] = ts[i:]
	return ts[i:]
}

// capWindow bounds a terminal size asked for by a client to what a console
// renders.
func capWindow(width, height int) (int, int) {
	return min(max(width, 0), MaxTermWidth), min(max(height, 0), MaxTermHeight)
}

// sessionChannel opens a session channel unless its connection or its user
// already has as many open as allowed; the client shows the reason ("open
// failed: resource shortage: fleet: …").
func (s *Server) sessionChannel(srv *ssh.Server, conn *gossh.ServerConn, ch gossh.NewChannel, ctx ssh.Context) {
	// The key is the one the client proved it holds: the server has
	// verified it before any channel opens.
	fp := ""
	if key, ok := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey); ok && key != nil {
		fp = gossh.FingerprintSHA256(key)
	}
	release, why := s.limits.openSession(ctx.SessionID(), fp)
	if why != "" {
		s.log.Log(ctx, refusalLevel(ctx), "ssh session refused (warned once per connection)",
			"remote", conn.RemoteAddr().String(), "fingerprint", fp, "why", why)
		_ = ch.Reject(gossh.ResourceShortage, "fleet: "+why)
		return
	}
	defer release()
	ssh.DefaultSessionHandler(srv, conn, ch, ctx)
}

// refusalLevel is Warn for the first refusal on a connection and Debug
// after it: a client retrying in a loop must not flood the log.
func refusalLevel(ctx ssh.Context) slog.Level {
	if n, ok := ctx.Value(refusedKey).(*atomic.Int64); ok && n.Add(1) == 1 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// sessionLimits counts open sessions per connection and per user (by key
// fingerprint: one key is one user), and consoles over the whole hub.
type sessionLimits struct {
	perConn, perUser, consoles int

	mu      sync.Mutex
	conns   map[string]int
	users   map[string]int
	console int
}

func newSessionLimits(perConn, perUser, consoles int) *sessionLimits {
	return &sessionLimits{perConn: perConn, perUser: perUser, consoles: consoles, conns: map[string]int{}, users: map[string]int{}}
}

// openSession takes a session slot of conn and user, or says why it cannot.
func (l *sessionLimits) openSession(conn, user string) (release func(), why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perConn >= 0 && l.conns[conn] >= l.perConn {
		return nil, fmt.Sprintf("this connection already has %s open, the limit per connection; close one first", plural(l.perConn, "session"))
	}
	if l.perUser >= 0 && l.users[user] >= l.perUser {
		return nil, fmt.Sprintf("you already have %s open, the limit per user; close one first", plural(l.perUser, "session"))
	}
	l.conns[conn]++
	l.users[user]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			// Delete at zero so the maps hold only what is open.
			if l.conns[conn]--; l.conns[conn] <= 0 {
				delete(l.conns, conn)
			}
			if l.users[user]--; l.users[user] <= 0 {
				delete(l.users, user)
			}
		})
	}, ""
}

// openConsole takes one of the hub's console slots.
func (l *sessionLimits) openConsole() (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.consoles >= 0 && l.console >= l.consoles {
		return nil, false
	}
	l.console++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.console--
			l.mu.Unlock()
		})
	}, true
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
