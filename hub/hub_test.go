package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/cli"
	"fleet/console"
	"fleet/fleetfile"
	"fleet/sim/profiles"
)

// The actors of the role tests. Fingerprints are filled in from the store by
// seededHub, because SetTheme looks users up by name and needs one.
var (
	viewer   = fleet.User{Name: "vic", Role: fleet.RoleViewer}
	operator = fleet.User{Name: "olga", Role: fleet.RoleOperator}
	admin    = fleet.User{Name: "ada", Role: fleet.RoleAdmin}
	// nobody has no role at all; stranger has one the hub does not know.
	// Neither can be a stored console user (the store refuses such roles),
	// but the hub must not trust its callers to have checked.
	nobody   = fleet.User{Name: "eve", Fingerprint: "SHA256:eve-is-not-a-console-user"}
	stranger = fleet.User{Name: "mallory", Role: "root", Fingerprint: "SHA256:mallory-is-not-a-console-user"}
)

// The workers seededHub restores from the store, as `fleet workers` names them.
const (
	ultraWorker = "ultra/qwen3-4b"
	maxWorker   = "max/qwen3-4b"
	// knownWorkers is how resolve lists them when a name is unknown.
	knownWorkers = "known workers: max/qwen3-4b, ultra/qwen3-4b"
)

// testKey returns a fresh authorized_keys line, encoded by hand so the
// tests need nothing beyond the standard library.
func testKey(t *testing.T, comment string) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for _, part := range [][]byte{[]byte("ssh-ed25519"), pub} {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(part)))
		wire = append(wire, part...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(wire) + " " + comment
}

// openHub opens a hub without running it, so no engine starts. FleetBin is
// set so Open does not copy the test binary into every data dir.
func openHub(t *testing.T, opts Options) (*Hub, error) {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = "127.0.0.1:0"
	}
	if opts.FleetBin == "" {
		bin, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		opts.FleetBin = bin
	}
	if opts.Commands == nil {
		opts.Commands = runCLI
	}
	if opts.SimProfile == nil {
		opts.SimProfile = simProfile
	}
	return Open(t.Context(), opts)
}

// simProfile is the sim profile lookup cmd/fleet gives a hub.
func simProfile(name string) (fleet.Platform, fleet.EngineKind, error) {
	p, err := profiles.Lookup(name)
	return p.Platform, p.Mimic, err
}

// runCLI is the command tree cmd/fleet gives a hub.
func runCLI(ctx context.Context, api API, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(ctx, api, u, args, stdin, stdout, stderr)
}

// newHub opens a demo hub that is closed when the test ends.
func newHub(t *testing.T, opts Options) *Hub {
	t.Helper()
	opts.Demo = true
	h, err := openHub(t, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// seededHub is a demo hub whose database already knows two workers (ultra
// and max), the console users vic, olga and ada, an API key "ci" and a
// pinned host key on ultra. It is reopened after seeding so the workers
// reach the hub the way a restarted hub's do: restored from the store.
// It returns the actors with their stored fingerprints.
func seededHub(t *testing.T) (*Hub, map[string]fleet.User) {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	seed, err := openHub(t, Options{DataDir: dir, Demo: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	for _, node := range []string{"ultra", "max"} {
		w := fleet.Worker{Node: node, Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady, Simulated: true}
		if _, err := seed.store.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []fleet.User{viewer, operator, admin} {
		u.PublicKey = testKey(t, u.Name+"@test")
		if err := seed.store.AddUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := seed.store.CreateAPIKey(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	if err := seed.store.SetNodeHostKey(ctx, "ultra", testKey(t, "ultra-host")); err != nil {
		t.Fatal(err)
	}
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}

	h := newHub(t, Options{DataDir: dir})
	actors := map[string]fleet.User{nobody.Name: nobody, stranger.Name: stranger}
	stored, err := h.store.Users(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range stored {
		actors[u.Name] = u
	}
	if len(actors) != 5 {
		t.Fatalf("seeded users %v, want vic, olga and ada", stored)
	}
	h.state.mu.Lock()
	restored := len(h.state.workers)
	h.state.mu.Unlock()
	if restored != 2 {
		t.Fatalf("the reopened hub restored %d workers, want 2", restored)
	}
	return h, actors
}

// lastAuditID is where the audit log ends now, so a test can read only what
// one call added.
func lastAuditID(t *testing.T, h *Hub) int64 {
	t.Helper()
	all, err := h.store.Audit(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1].ID
}

func auditSince(t *testing.T, h *Hub, after int64) []fleet.AuditEntry {
	t.Helper()
	all, err := h.store.Audit(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []fleet.AuditEntry
	for _, a := range all {
		if a.ID > after {
			out = append(out, a)
		}
	}
	return out
}

// state renders everything a role-checked action can change: the declared
// fleet, users, API keys, pinned host keys, drain flags and reference
// shapes. A refused call must leave it as it was.
func state(t *testing.T, h *Hub) string {
	t.Helper()
	ctx := t.Context()
	var b strings.Builder
	exported, err := h.Export(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	b.Write(exported)
	users, err := h.store.Users(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		fmt.Fprintf(&b, "user %s %s %s theme=%q\n", u.Name, u.Role, u.Fingerprint, u.Theme)
	}
	keys, err := h.store.APIKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		fmt.Fprintf(&b, "key %s revoked=%v\n", k.Name, !k.Revoked.IsZero())
	}
	nodes, err := h.store.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		fmt.Fprintf(&b, "node %s hostkey=%q\n", n.Name, n.HostKey)
	}
	workers, err := h.store.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		fmt.Fprintf(&b, "stored worker %s drained=%v\n", w.Name(), w.Drained)
	}
	h.state.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(h.state.workers)) {
		fmt.Fprintf(&b, "hub worker %s drained=%v\n", name, h.state.workers[name].Drained)
	}
	h.state.mu.Unlock()
	if _, err := h.store.Reference(ctx, "qwen3-4b"); err == nil {
		b.WriteString("reference shape of qwen3-4b set\n")
	}
	return b.String()
}

// TestRolesEnforcedAndAudited is the hub's side of the role model: every
// entry point checks the caller's role itself (the CLI and the console only
// pass the user along), a refusal names the role needed and is audited, and
// an allowed call never fails on permissions.
func TestRolesEnforcedAndAudited(t *testing.T) {
	// succeeds and failsWith say how an allowed call ends.
	succeeds := func(fleet.User) string { return "" }
	failsWith := func(s string) func(fleet.User) string { return func(fleet.User) string { return s } }
	unknown := `no worker or node named "nope"`
	newbieKey := testKey(t, "newbie@test")

	calls := []struct {
		name   string
		action string // the action the audit line records
		need   fleet.Role
		// auditsAllowed: an allowed call writes an audit line too, failed or
		// not (actions do: mutations, and a bench's load on a worker; reads
		// only when they fail).
		auditsAllowed bool
		// allowedErr is the error an allowed call gets for reasons other than
		// its role (a substring; "" = it succeeds).
		allowedErr func(u fleet.User) string
		do         func(ctx context.Context, h *Hub, u fleet.User) error
	}{
		{"drain", "drain", fleet.RoleOperator, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Act(ctx, u, "drain", []string{"ultra"})
			return err
		}},
		{"undrain", "undrain", fleet.RoleOperator, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Act(ctx, u, "undrain", []string{"ultra"})
			return err
		}},
		// Without Run the node manager has no worker to restart, so the
		// allowed path is shown with an unknown name.
		{"restart", "restart", fleet.RoleOperator, true, failsWith(unknown + "; " + knownWorkers), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Act(ctx, u, "restart", []string{"nope"})
			return err
		}},
		{"stop", "stop", fleet.RoleOperator, true, failsWith(unknown + "; " + knownWorkers), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Act(ctx, u, "stop", []string{"nope"})
			return err
		}},
		{"start", "start", fleet.RoleOperator, true, failsWith(unknown + "; " + knownWorkers), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Act(ctx, u, "start", []string{"nope"})
			return err
		}},
		{"apply", "apply", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Apply(ctx, u, "demo.yaml", fleetfile.Demo, false)
			return err
		}},
		{"apply dry run", "apply --dry-run", fleet.RoleAdmin, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.Apply(ctx, u, "demo.yaml", fleetfile.Demo, true)
			return err
		}},
		{"export", "export", fleet.RoleViewer, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			data, err := h.Export(ctx, u)
			if err == nil && !strings.Contains(string(data), "ultra") {
				return fmt.Errorf("export lacks node ultra:\n%s", data)
			}
			return err
		}},
		{"user add", "user add", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			return h.admin.AddUser(ctx, u, fleet.User{Name: "newbie", Role: fleet.RoleViewer, PublicKey: newbieKey})
		}},
		{"user rm", "user rm", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			return h.admin.RemoveUser(ctx, u, "vic")
		}},
		{"user list", "user list", fleet.RoleAdmin, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			us, err := h.admin.Users(ctx, u)
			if err == nil && len(us) != 3 {
				return fmt.Errorf("Users listed %d users, want 3", len(us))
			}
			return err
		}},
		{"key create", "key create", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.admin.CreateKey(ctx, u, "new-client")
			return err
		}},
		{"key revoke", "key revoke", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			return h.admin.RevokeKey(ctx, u, "ci")
		}},
		{"key limit", "key limit", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			return h.ledger.SetKeyLimits(ctx, u, "ci", fleet.KeyLimits{RequestsPerMinute: 10})
		}},
		{"usage", "usage", fleet.RoleViewer, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.ledger.Usage(ctx, u, time.Now().Add(-time.Hour), "model")
			return err
		}},
		{"usage by key", "usage --by key", fleet.RoleAdmin, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.ledger.Usage(ctx, u, time.Now().Add(-time.Hour), "key")
			return err
		}},
		{"key list", "key list", fleet.RoleAdmin, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			keys, err := h.admin.Keys(ctx, u)
			if err == nil && len(keys) != 1 {
				return fmt.Errorf("Keys listed %d keys, want 1", len(keys))
			}
			return err
		}},
		// Without Run the node manager holds no rejected worker, so the
		// allowed path is shown with an unknown name.
		{"admit force", "admit --force", fleet.RoleOperator, true, failsWith(unknown), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.ForceAdmit(ctx, u, "nope")
			return err
		}},
		{"node trust", "node trust", fleet.RoleAdmin, true, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.TrustNode(ctx, u, "ultra")
			return err
		}},
		{"audit", "audit", fleet.RoleOperator, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.admin.Audit(ctx, u, 0)
			return err
		}},
		// A theme is each console user's own preference: any role may set
		// their own, and eve and mallory, who have none, may not.
		{"theme", "theme", fleet.RoleViewer, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			return h.admin.SetTheme(ctx, u, "dark")
		}},
		// shape sends load to workers: an operator's, as in the console.
		{"shape", "shape", fleet.RoleOperator, false, failsWith(unknown), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.runs.Shape(ctx, u, "nope", ultraWorker)
			return err
		}},
		{"shape all", "shape --all", fleet.RoleOperator, false, failsWith("model qwen3-4b has no reference shape yet"), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.runs.ShapeAll(ctx, u, "qwen3-4b")
			return err
		}},
		{"shape pin", "shape pin", fleet.RoleAdmin, true, failsWith(unknown), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.runs.PinShape(ctx, u, "nope")
			return err
		}},
		{"bench", "bench", fleet.RoleOperator, true, failsWith(unknown), func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.runs.Bench(ctx, u, "nope", fleet.BenchOptions{}, nil)
			return err
		}},
		{"status", "status", fleet.RoleViewer, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			st, err := h.Status(ctx, u)
			if err == nil && st.Keys != 1 {
				return fmt.Errorf("status counted %d API keys, want 1", st.Keys)
			}
			return err
		}},
		// Past bench runs are read from the store: anyone may list them.
		{"bench history", "bench --history", fleet.RoleViewer, false, succeeds, func(ctx context.Context, h *Hub, u fleet.User) error {
			_, err := h.runs.BenchHistory(ctx, u, ultraWorker, 10)
			return err
		}},
		// An engine's log can hold prompts: an operator's.
		{"logs", "logs", fleet.RoleOperator, false, failsWith(unknown), func(ctx context.Context, h *Hub, u fleet.User) error {
			return h.Logs(ctx, u, "nope", 10, false, io.Discard)
		}},
	}
	for _, c := range calls {
		for _, name := range []string{viewer.Name, operator.Name, admin.Name, nobody.Name, stranger.Name} {
			t.Run(c.name+"/"+name, func(t *testing.T) {
				t.Parallel() // each case opens its own hub
				h, actors := seededHub(t)
				u := actors[name]
				before, mark := state(t, h), lastAuditID(t, h)

				err := c.do(t.Context(), h, u)
				audited := auditSince(t, h, mark)

				if !u.Role.Allows(c.need) {
					if err == nil || !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), string(c.need)) {
						t.Fatalf("%s as %s (%q): err = %v, want permission denied naming the %s role", c.name, u.Name, u.Role, err, c.need)
					}
					if len(audited) != 1 || audited[0].User != u.Name || audited[0].Action != c.action ||
						!strings.HasPrefix(audited[0].Outcome, "denied") || !strings.Contains(audited[0].Outcome, string(c.need)) {
						t.Errorf("audit after a refused %s = %+v, want one %q line by %s with outcome \"denied: needs %s\"", c.name, audited, c.action, u.Name, c.need)
					}
					if after := state(t, h); after != before {
						t.Errorf("a refused %s changed the hub:\nbefore:\n%s\nafter:\n%s", c.name, before, after)
					}
					return
				}

				if err != nil && strings.Contains(err.Error(), "permission denied") {
					t.Fatalf("%s as %s (%s): %v, want no permission error", c.name, u.Name, u.Role, err)
				}
				if want := c.allowedErr(u); want == "" && err != nil {
					t.Fatalf("%s as %s (%s): %v", c.name, u.Name, u.Role, err)
				} else if want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
					t.Fatalf("%s as %s (%s): err = %v, want one saying %q", c.name, u.Name, u.Role, err, want)
				}
				for _, a := range audited {
					if strings.HasPrefix(a.Outcome, "denied") {
						t.Errorf("an allowed %s was audited as %+v", c.name, a)
					}
				}
				switch {
				case c.auditsAllowed && !slices.ContainsFunc(audited, func(a fleet.AuditEntry) bool { return a.User == u.Name && a.Action == c.action }):
					t.Errorf("audit after %s by %s = %+v, want a %q line by %s", c.name, u.Name, audited, c.action, u.Name)
				case !c.auditsAllowed && err == nil && len(audited) != 0:
					t.Errorf("%s, a read, wrote audit lines %+v", c.name, audited)
				case !c.auditsAllowed && err != nil && (len(audited) != 1 || audited[0].Action != c.action || !strings.HasPrefix(audited[0].Outcome, "failed: ")):
					t.Errorf("%s, a read that failed, wrote audit lines %+v, want one \"failed: …\" %s line", c.name, audited, c.action)
				}
			})
		}
	}
}

// TestConsoleSourceRoles: the console is a second way into the same
// actions, and the audit trail it shows is itself operator-only.
func TestConsoleSourceRoles(t *testing.T) {
	tests := []struct {
		user      string
		seesAudit bool
		// mayAct: the console's drain, restart and bench go through.
		mayAct bool
	}{
		{viewer.Name, false, false},
		{operator.Name, true, true},
		{admin.Name, true, true},
		{nobody.Name, false, false},
		{stranger.Name, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			t.Parallel()
			h, actors := seededHub(t)
			u := actors[tt.user]
			h.guard.audit(admin, "seed", "", "ok") // something for the audit view to show
			src := h.ConsoleSource(u)

			if got := len(src.Snapshot().Audit) > 0; got != tt.seesAudit {
				t.Errorf("%s (%q) sees the audit trail: %v, want %v", u.Name, u.Role, got, tt.seesAudit)
			}
			_, logErr := src.WorkerLog(t.Context(), ultraWorker, 10)
			if mayRead := u.Role.Allows(fleet.RoleOperator); mayRead && logErr != nil && strings.Contains(logErr.Error(), "role") ||
				!mayRead && (logErr == nil || !strings.Contains(logErr.Error(), "needs the operator role")) {
				t.Errorf("console log of %s for %s (%q): err = %v; an engine log is for operators", ultraWorker, u.Name, u.Role, logErr)
			}
			if tt.mayAct {
				return // the allowed paths are TestRolesEnforcedAndAudited's; restart here would outlive the test
			}
			before := state(t, h)
			for _, kind := range []fleet.ActionName{fleet.ActionDrain, fleet.ActionRestart, fleet.ActionBench, fleet.ActionShape} {
				mark := lastAuditID(t, h)
				_, err := src.Do(t.Context(), console.Action{Kind: kind, Targets: []string{ultraWorker}})
				if err == nil || !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), "operator") {
					t.Errorf("console %s by %s (%q): err = %v, want permission denied naming the operator role", kind, u.Name, u.Role, err)
				}
				if a := auditSince(t, h, mark); len(a) != 1 || a[0].Action != string(kind) || !strings.HasPrefix(a[0].Outcome, "denied") {
					t.Errorf("audit after the console's refused %s = %+v, want one denied %s line", kind, a, kind)
				}
			}
			// A key the console refuses itself is audited like a refused exec;
			// in the next minute, so it is a line of its own, not a repeat of
			// the refusals above.
			now := time.Now().Add(refusalWindow)
			h.guard.refused.now = func() time.Time { return now }
			for _, kind := range []fleet.ActionName{fleet.ActionDrain, fleet.ActionUndrain, fleet.ActionRestart, fleet.ActionBench, fleet.ActionShape} {
				mark := lastAuditID(t, h)
				src.Refused(kind, []string{ultraWorker})
				if a := auditSince(t, h, mark); len(a) != 1 || a[0].Action != string(kind) || a[0].User != u.Name || a[0].Target != ultraWorker || !strings.HasPrefix(a[0].Outcome, "denied: needs operator") {
					t.Errorf("audit after the console refused %s = %+v, want one \"denied: needs operator\" line by %s", kind, a, u.Name)
				}
			}
			if after := state(t, h); after != before {
				t.Errorf("refused console actions changed the hub:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// TestLocalAdmin: whoever can open the control socket owns the database, so
// they act as an admin whose audit lines say which OS user it was.
func TestLocalAdmin(t *testing.T) {
	tests := []struct{ env, want string }{
		{"alice", "alice@hub"},
		{"", "local@hub"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Setenv("USER", tt.env)
			u := LocalAdmin()
			if u.Name != tt.want || u.Role != fleet.RoleAdmin {
				t.Errorf("LocalAdmin() with USER=%q = %+v, want %s as admin", tt.env, u, tt.want)
			}
		})
	}
}

// TestExecWithoutCommands: the hub does not import the command tree, it is
// given it (Options.Commands); a hub opened without one refuses every
// command line with an exit status and says what is missing, rather than
// crashing on a nil function.
func TestExecWithoutCommands(t *testing.T) {
	h := newHub(t, Options{})
	h.opts.Commands = nil
	var stdout, stderr strings.Builder
	if code := h.Exec(t.Context(), admin, []string{"workers"}, nil, &stdout, &stderr); code != 1 {
		t.Errorf("Exec without a command tree = %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "Options.Commands") || stdout.Len() != 0 {
		t.Errorf("stdout %q, stderr %q; want nothing on stdout and the missing Options.Commands named", stdout.String(), stderr.String())
	}
}
