package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/bench/shape"
	"fleet/bench/sweep"
)

// fakeHub records calls and refuses what the action table does not allow,
// as the hub does.
type fakeHub struct {
	acts    [][]string
	applied string
	workers []fleet.WorkerView // the snapshot's workers when set
	// authorized are the actions and targets the tree asked about.
	authorized [][2]string
	// limits are the key limits set, "NAME RPM TPD"; usageSince and
	// usageBy what the last usage asked for.
	limits     []string
	usageSince time.Time
	usageBy    string
	// subjects are what each Events call asked for.
	subjects []string
	keys     []fleet.APIKey // what Keys lists
	// keysNotChecked is what KeysNotChecked says.
	keysNotChecked string
}

func (f *fakeHub) KeysNotChecked() string { return f.keysNotChecked }

func (f *fakeHub) Authorize(_ context.Context, u fleet.User, action fleet.ActionName, target string) error {
	f.authorized = append(f.authorized, [2]string{string(action), target})
	a, ok := fleet.LookupAction(action)
	if !ok {
		return fmt.Errorf("permission denied: %q is not in the hub's action table", action)
	}
	if !u.Role.Allows(a.Role) {
		return fmt.Errorf("permission denied: %s needs the %s role; you (%s) are %s", action, a.Role, u.Name, u.Role)
	}
	return nil
}

var errDenied = errors.New("permission denied: drain needs the operator role; you (v) are viewer")

func (f *fakeHub) Snapshot(context.Context, fleet.User) fleet.Snapshot {
	if f.workers != nil {
		return fleet.Snapshot{Workers: f.workers}
	}
	return fleet.Snapshot{Workers: []fleet.WorkerView{{
		Worker: fleet.Worker{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady, Argv: []string{"llama-server", "-c", "16384"}, Context: 16384, Slots: 4},
		Host:   "macOS", GPU: "Apple M1 Ultra", TTFTms: 187.4, PredictedTTFTms: 20,
	}}}
}
func (f *fakeHub) Act(_ context.Context, u fleet.User, kind fleet.ActionName, targets []string) (string, error) {
	if !u.Role.Allows(fleet.RoleOperator) {
		return "", errDenied
	}
	f.acts = append(f.acts, append([]string{string(kind)}, targets...))
	return string(kind) + " ok", nil
}
func (f *fakeHub) Apply(_ context.Context, _ fleet.User, name string, data []byte, dryRun bool) (string, error) {
	f.applied = name + ":" + string(data)
	return "plan\n", nil
}
func (f *fakeHub) Export(context.Context, fleet.User) ([]byte, error) {
	return []byte("nodes: []\n"), nil
}
func (f *fakeHub) Events(_ context.Context, _ fleet.User, subject string, _ int64, _ int) ([]fleet.Event, error) {
	f.subjects = append(f.subjects, subject)
	return nil, nil
}
func (f *fakeHub) Audit(context.Context, fleet.User, int) ([]fleet.AuditEntry, error) {
	return nil, nil
}
func (f *fakeHub) AddUser(context.Context, fleet.User, fleet.User) error   { return nil }
func (f *fakeHub) RemoveUser(context.Context, fleet.User, string) error    { return nil }
func (f *fakeHub) Users(context.Context, fleet.User) ([]fleet.User, error) { return nil, nil }
func (f *fakeHub) Shape(context.Context, fleet.User, string, string) (shape.Report, error) {
	return shape.Report{}, nil
}
func (f *fakeHub) ShapeAll(context.Context, fleet.User, string) ([]shape.Report, error) {
	return nil, nil
}
func (f *fakeHub) PinShape(context.Context, fleet.User, string) (string, error) { return "", nil }
func (f *fakeHub) Bench(context.Context, fleet.User, string, fleet.BenchOptions, io.Writer) (sweep.Result, error) {
	return sweep.Result{}, nil
}
func (f *fakeHub) ForceAdmit(context.Context, fleet.User, string) (string, error) { return "", nil }
func (f *fakeHub) TrustNode(context.Context, fleet.User, string) (string, error)  { return "", nil }
func (f *fakeHub) CreateKey(context.Context, fleet.User, string) (string, error)  { return "fk-x", nil }
func (f *fakeHub) Keys(context.Context, fleet.User) ([]fleet.APIKey, error)       { return f.keys, nil }
func (f *fakeHub) RevokeKey(context.Context, fleet.User, string) error            { return nil }
func (f *fakeHub) SetKeyLimits(_ context.Context, _ fleet.User, name string, l fleet.KeyLimits) error {
	f.limits = append(f.limits, fmt.Sprintf("%s %d %d", name, l.RequestsPerMinute, l.TokensPerDay))
	return nil
}
func (f *fakeHub) Usage(_ context.Context, _ fleet.User, since time.Time, by string) ([]fleet.Usage, error) {
	f.usageSince, f.usageBy = since, by
	return []fleet.Usage{{Key: "alice", Requests: 3, PromptTokens: 1200, CachedTokens: 1000, CompletionTokens: 30}}, nil
}
func (f *fakeHub) SetTheme(context.Context, fleet.User, string) error { return nil }
func (f *fakeHub) Status(context.Context, fleet.User) (fleet.HubStatus, error) {
	return fleet.HubStatus{
		Version: "v1.2.3", DataDir: "/var/lib/fleet", Database: "postgres://<redacted>@db.lab/fleet", StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), UptimeSeconds: 3725,
		Router: "http://127.0.0.1:8080/v1", Keys: 2, KeysRequired: true, Console: "0.0.0.0:22", ConsoleName: "fleet.local",
		Nodes: fleet.CountStates(map[string]string{"ultra": "up", "max": "up", "rig": "unreachable"}, []string{"up", "unreachable"}),
		Workers: fleet.CountStates(map[string]string{"ultra/qwen3-4b": "ready", "max/qwen3-4b": "installing", "rig/qwen3-4b": "failed"},
			[]string{"ready", "installing", "failed"}),
		Models: []fleet.ModelStatus{{ID: "qwen3-4b", Aliases: []string{"qwen"}, Context: 16384, Ready: 1, Workers: 3}},
		Hub:    "hub2", HubRole: "follower", Leader: "hub1",
		Hubs: []fleet.HubView{{Name: "hub1", Role: "leader", HeartbeatAgeSeconds: 0.7}, {Name: "hub2", Role: "follower", HeartbeatAgeSeconds: 1.84}},
	}, nil
}
func (f *fakeHub) BenchHistory(_ context.Context, _ fleet.User, worker string, limit int) ([]sweep.Result, error) {
	f.acts = append(f.acts, []string{"bench --history", worker, fmt.Sprint(limit)})
	at := time.Date(2026, 11, 30, 18, 0, 0, 0, time.Local)
	level := func(c int, tok, ttft float64) sweep.Level {
		return sweep.Level{Concurrency: c, TotalTokPerSec: tok, TTFT: sweep.Stats{P50: ttft}}
	}
	return []sweep.Result{
		{Target: worker, Split: sweep.SplitAgent, Turns: 3, StartedAt: at, Levels: []sweep.Level{level(1, 40, 900), level(2, 70, 1500)}},
		{Target: worker, Split: sweep.SplitChat, StartedAt: at.Add(-time.Hour), Levels: []sweep.Level{level(1, 60, 95), level(2, 110, 120), level(4, 180, 140)}},
	}, nil
}
func (f *fakeHub) Logs(_ context.Context, _ fleet.User, worker string, lines int, follow bool, w io.Writer) error {
	f.acts = append(f.acts, []string{"logs", worker, fmt.Sprint(lines), fmt.Sprint(follow)})
	fmt.Fprintf(w, "log of %s: %d lines, follow %v\n", worker, lines, follow)
	return nil
}

func TestExitStatuses(t *testing.T) {
	operator := fleet.User{Name: "op", Role: fleet.RoleOperator}
	viewer := fleet.User{Name: "v", Role: fleet.RoleViewer}
	admin := fleet.User{Name: "ad", Role: fleet.RoleAdmin}
	cases := []struct {
		name    string
		u       fleet.User
		args    []string
		stdin   string
		code    int
		stdout  string
		stderr  string
		actions int
	}{
		{"workers table", viewer, []string{"workers"}, "", ExitOK, "llama-server -c 16384", "", 0},
		{"workers table shows the measured TTFT", viewer, []string{"workers"}, "", ExitOK, "187ms", "", 0},
		{"drain by an operator", operator, []string{"drain", "ultra"}, "", ExitOK, "drain ok", "", 1},
		{"drain by a viewer fails and says why", viewer, []string{"drain", "ultra"}, "", ExitFail, "", "needs the operator role", 0},
		{"drain without a target is usage", operator, []string{"drain"}, "", ExitUsage, "", "at least one node", 0},
		{"stop all by an operator", operator, []string{"stop", "all"}, "", ExitOK, "stop ok", "", 1},
		{"start a node by an operator", operator, []string{"start", "ultra"}, "", ExitOK, "start ok", "", 1},
		{"stop without a target is usage", operator, []string{"stop"}, "", ExitUsage, "", "or all", 0},
		{"unknown command is usage", operator, []string{"dran", "ultra"}, "", ExitUsage, "", "unknown command", 0},
		{"unknown flag is usage", operator, []string{"workers", "--jsn"}, "", ExitUsage, "", "unknown flag", 0},
		{"extra argument is usage", operator, []string{"workers", "extra"}, "", ExitUsage, "", "takes no arguments", 0},
		{"apply with nothing on stdin is usage", admin, []string{"apply"}, "", ExitUsage, "", "standard input", 0},
		{"admit needs --force", operator, []string{"admit", "ultra"}, "", ExitUsage, "", "--force", 0},
		{"logs by an operator, 200 lines by default", operator, []string{"logs", "ultra/qwen3-4b"}, "", ExitOK, "log of ultra/qwen3-4b: 200 lines, follow false", "", 1},
		{"logs -f -n 5", operator, []string{"logs", "-f", "-n", "5", "ultra/qwen3-4b"}, "", ExitOK, "5 lines, follow true", "", 1},
		{"logs by a viewer fails: logs can hold prompts", viewer, []string{"logs", "ultra/qwen3-4b"}, "", ExitFail, "", "needs the operator role", 0},
		{"logs -n 0 is usage", operator, []string{"logs", "-n", "0", "ultra/qwen3-4b"}, "", ExitUsage, "", "from 1 to 10000", 0},
		{"logs -n past the bound is usage", operator, []string{"logs", "-n", "10001", "ultra/qwen3-4b"}, "", ExitUsage, "", "from 1 to 10000", 0},
		{"logs without a worker is usage", operator, []string{"logs"}, "", ExitUsage, "", "one worker", 0},
		{"bench with a bad split is usage", operator, []string{"bench", "ultra", "--split", "poetry"}, "", ExitUsage, "", "chat or agent", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &fakeHub{}
			var out, errOut bytes.Buffer
			code := Run(context.Background(), h, c.u, c.args, strings.NewReader(c.stdin), &out, &errOut)
			if code != c.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, c.code, out.String(), errOut.String())
			}
			if !strings.Contains(out.String(), c.stdout) {
				t.Errorf("stdout %q lacks %q", out.String(), c.stdout)
			}
			if !strings.Contains(errOut.String(), c.stderr) {
				t.Errorf("stderr %q lacks %q", errOut.String(), c.stderr)
			}
			if len(h.acts) != c.actions {
				t.Errorf("%d actions reached the hub, want %d", len(h.acts), c.actions)
			}
		})
	}
}

func TestWorkersJSONCarriesTheTableFields(t *testing.T) {
	var out bytes.Buffer
	if code := Run(context.Background(), &fakeHub{}, fleet.User{Role: fleet.RoleViewer}, []string{"workers", "--json"}, nil, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"node", "model", "engine", "state", "pid", "port", "argv", "ctx", "host", "gpu"} {
		if _, ok := rows[0][key]; !ok {
			t.Errorf("workers --json lacks %q: %v", key, rows[0])
		}
	}
}

// The `workers` table writes each cell as the console does (package
// columns): the CLI used to print 4000 where the console said 4k, 42 for
// 42.5 tok/s, 0/0 for unknown slots and 2.35s for the console's 2.3s.
func TestWorkersTableCellsAreTheConsoles(t *testing.T) {
	h := &fakeHub{workers: []fleet.WorkerView{{
		Worker: fleet.Worker{Node: "max", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerInstalling,
			Progress: 42.4, Argv: []string{"llama-server", "-c", "4000"}, Context: 4000, PID: 4242, Port: 8001},
		Host: "macOS", GPU: "Apple M4 Max", InFlight: 1, TokPerSec: 42.46, TTFTms: 2345,
	}}}
	var out bytes.Buffer
	if code := Run(context.Background(), h, fleet.User{Role: fleet.RoleViewer}, []string{"workers"}, nil, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("workers printed %d lines, want a header and one row:\n%s", len(lines), out.String())
	}
	header := strings.Fields(lines[0])
	wantHeader := []string{"NODE", "MODEL", "GPU", "HOST", "ENGINE", "CTX", "STATE", "LOAD", "TOK/S", "TTFT", "ITL", "PID", "PORT", "STARTED", "WITH"}
	if strings.Join(header, " ") != strings.Join(wantHeader, " ") {
		t.Errorf("header = %q, want %q", header, wantHeader)
	}
	got := strings.Fields(lines[1])
	want := []string{"max", "qwen3-4b", "Apple", "M4", "Max", "macOS", "llama.cpp", "4k", "installing", "42%", "1/-", "42.5", "2.3s", "-", "4242", "8001", "llama-server", "-c", "4000"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("row = %q,\nwant  %q", got, want)
	}
}

func TestApplyReadsStdinWithItsName(t *testing.T) {
	h := &fakeHub{}
	code := Run(context.Background(), h, fleet.User{Role: fleet.RoleAdmin}, []string{"apply", "--filename", "fleet.yaml"}, strings.NewReader("nodes: []\n"), io.Discard, io.Discard)
	if code != 0 || h.applied != "fleet.yaml:nodes: []\n" {
		t.Errorf("exit %d, applied %q", code, h.applied)
	}
}

// TestApplyRefusesInputOverTheLimit: a fleet file past the limit used to be
// cut and the rest applied; now it is refused whole, naming the limit.
// apply takes -f - as the local fleet command does (docs/fleet-file.md),
// and its help lists -f: over SSH the tree is this one.
func TestApplyTakesFileFlag(t *testing.T) {
	admin := fleet.User{Role: fleet.RoleAdmin}
	h := &fakeHub{}
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), h, admin, []string{"apply", "-f", "-"}, strings.NewReader("nodes: []\n"), &out, &errOut); code != ExitOK || h.applied != "stdin:nodes: []\n" {
		t.Errorf("apply -f -: exit %d, applied %q, %s", code, h.applied, errOut.String())
	}
	errOut.Reset()
	if code := Run(context.Background(), &fakeHub{}, admin, []string{"apply", "-f", "fleet.yaml"}, strings.NewReader("nodes: []\n"), &out, &errOut); code != ExitUsage || !strings.Contains(errOut.String(), "-f - < fleet.yaml") {
		t.Errorf("apply -f FILE on the hub: exit %d, %q; want usage naming standard input", code, errOut.String())
	}
	out.Reset()
	if code := Run(context.Background(), h, admin, []string{"apply", "--help"}, nil, &out, &errOut); code != ExitOK || !strings.Contains(out.String(), "-f, --file") {
		t.Errorf("apply --help: exit %d, %q; want -f listed", code, out.String())
	}
}

func TestApplyRefusesInputOverTheLimit(t *testing.T) {
	head := "nodes: []\n"
	pad := func(n int) string { return head + "#" + strings.Repeat("x", n-len(head)-2) + "\n" }
	for _, tt := range []struct {
		name    string
		size    int
		applied bool
	}{
		{"at the limit", fleet.MaxFleetFileBytes, true},
		{"one byte over", fleet.MaxFleetFileBytes + 1, false},
		{"far over", 3 * fleet.MaxFleetFileBytes, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHub{}
			in := pad(tt.size)
			var errOut bytes.Buffer
			code := Run(context.Background(), h, fleet.User{Role: fleet.RoleAdmin}, []string{"apply", "--filename", "big.yaml"}, strings.NewReader(in), io.Discard, &errOut)
			if tt.applied {
				if code != ExitOK || h.applied != "big.yaml:"+in {
					t.Fatalf("exit %d, applied %d bytes, want all %d: %s", code, len(h.applied), len(in), errOut.String())
				}
				return
			}
			if code != ExitFail || h.applied != "" {
				t.Fatalf("exit %d, applied %d bytes; want exit 1 and nothing applied", code, len(h.applied))
			}
			for _, want := range []string{"big.yaml", "4 MiB", "nothing was applied"} {
				if !strings.Contains(errOut.String(), want) {
					t.Errorf("refusal %q does not say %q", errOut.String(), want)
				}
			}
		})
	}
}

// TestStatusScreen: one screen that says where everything is and what is
// not well, and the same figures as JSON.
func TestStatusScreen(t *testing.T) {
	var out bytes.Buffer
	if code := Run(context.Background(), &fakeHub{}, fleet.User{Role: fleet.RoleViewer}, []string{"status"}, nil, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"fleet v1.2.3, up 1h2m5s, data in /var/lib/fleet, state in postgres://<redacted>@db.lab/fleet",
		"http://127.0.0.1:8080/v1 (2 API keys, required)",
		"ssh fleet.local (0.0.0.0:22)",
		"3: 2 up, 1 unreachable (rig)",
		"3: 1 ready, 1 installing (max/qwen3-4b), 1 failed (rig/qwen3-4b)",
		"qwen3-4b (qwen): 1/3 workers ready, context 16384",
		"hub2, follower (leader hub1)",
		"2: hub1 leader, heartbeat 700ms ago; hub2 follower, heartbeat 1.8s ago",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := Run(context.Background(), &fakeHub{}, fleet.User{Role: fleet.RoleViewer}, []string{"status", "--json"}, nil, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var st map[string]any
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"version", "data_dir", "database", "uptime_s", "router", "console", "nodes", "workers", "models", "keys", "hub", "hub_role", "leader", "hubs"} {
		if _, ok := st[key]; !ok {
			t.Errorf("status --json lacks %q: %s", key, out.String())
		}
	}
}

// TestBenchHistory: past runs, newest first, each labelled with its split,
// and the flag makes it a read (bench --history), not a run.
func TestBenchHistory(t *testing.T) {
	h := &fakeHub{}
	var out bytes.Buffer
	if code := Run(context.Background(), h, fleet.User{Role: fleet.RoleViewer}, []string{"bench", "--history", "--limit", "5", "ultra/qwen3-4b"}, nil, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "SPLIT") {
		t.Fatalf("history printed:\n%s\nwant a header and two runs", out.String())
	}
	for i, want := range [][]string{
		{"2026-11-30 18:00:00", "agent, 3 turns", "1/2", "40/70", "900ms/1.5s"},
		{"2026-11-30 17:00:00", "chat", "1/2/4", "60/110/180", "95ms/120ms/140ms"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("run %d %q lacks %q", i+1, lines[i+1], w)
			}
		}
	}
	if len(h.acts) != 1 || strings.Join(h.acts[0], " ") != "bench --history ultra/qwen3-4b 5" || h.authorized[0][0] != "bench --history" {
		t.Errorf("the hub was asked %v (authorized %v); want one history read of ultra/qwen3-4b, limit 5", h.acts, h.authorized)
	}
}

// TestEventsTakesItsSubjectAsLogsDoes: `events WORKER` names what to show
// as `logs WORKER` does (it said "events takes no arguments"); --subject
// still works, and the two disagreeing is a usage error.
func TestEventsTakesItsSubjectAsLogsDoes(t *testing.T) {
	viewer := fleet.User{Name: "v", Role: fleet.RoleViewer}
	for _, tt := range []struct {
		args    []string
		code    int
		subject string
	}{
		{[]string{"events", "rig/qwen3-4b"}, ExitOK, "rig/qwen3-4b"},
		{[]string{"events", "--subject", "rig"}, ExitOK, "rig"},
		{[]string{"events", "rig", "--subject", "rig"}, ExitOK, "rig"},
		{[]string{"events"}, ExitOK, ""},
		{[]string{"events", "rig", "--subject", "max"}, ExitUsage, ""},
		{[]string{"events", "rig", "max"}, ExitUsage, ""},
	} {
		h := &fakeHub{}
		var errOut bytes.Buffer
		code := Run(context.Background(), h, viewer, tt.args, nil, io.Discard, &errOut)
		if code != tt.code {
			t.Errorf("%q: exit %d, want %d: %s", tt.args, code, tt.code, errOut.String())
			continue
		}
		if tt.code == ExitOK && (len(h.subjects) != 1 || h.subjects[0] != tt.subject) {
			t.Errorf("%q asked the hub for the events of %q, want %q", tt.args, h.subjects, tt.subject)
		}
	}
}

// TestUsageErrorsPointToTheCommandsUsage: a command typed wrong ends with
// its own usage and how to see its help, not with the list of commands;
// only an unknown command points there.
func TestUsageErrorsPointToTheCommandsUsage(t *testing.T) {
	operator := fleet.User{Name: "op", Role: fleet.RoleOperator}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"workers", "--jsn"}, []string{"unknown flag: --jsn", "usage: fleet workers [flags]", "run 'fleet workers --help'"}},
		{[]string{"drain"}, []string{"usage: fleet drain NODE|NODE/MODEL|all...", "run 'fleet drain --help'"}},
		{[]string{"bench", "ultra", "--split", "poetry"}, []string{"usage: fleet bench NODE|NODE/MODEL|MODEL [flags]", "run 'fleet bench --help'"}},
		{[]string{"shape", "pin"}, []string{"usage: fleet shape pin WORKER", "run 'fleet shape pin --help'"}},
		{[]string{"user", "add"}, []string{"usage: fleet user add NAME --role viewer|operator|admin < key.pub", "run 'fleet user add --help'"}},
		{[]string{"dran"}, []string{"unknown command \"dran\"", "run 'help' for the list of commands"}},
	} {
		var errOut bytes.Buffer
		if code := Run(context.Background(), &fakeHub{}, operator, tt.args, strings.NewReader(""), io.Discard, &errOut); code != ExitUsage {
			t.Errorf("%q: exit %d, want %d", tt.args, code, ExitUsage)
		}
		for _, w := range tt.want {
			if !strings.Contains(errOut.String(), w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tt.args, w, errOut.String())
			}
		}
		if tt.args[0] != "dran" && strings.Contains(errOut.String(), "list of commands") {
			t.Errorf("%q points to the list of commands, not its own usage:\n%s", tt.args, errOut.String())
		}
	}
}

// An error of the command's own that happens to start with "unknown" is a
// failure (exit 1), not a usage error.
func TestUnknownThemeIsAFailure(t *testing.T) {
	var errOut bytes.Buffer
	h := &themeHub{fakeHub: &fakeHub{}}
	if code := Run(context.Background(), h, fleet.User{Role: fleet.RoleViewer}, []string{"theme", "purple"}, nil, io.Discard, &errOut); code != ExitFail || strings.Contains(errOut.String(), "usage:") {
		t.Errorf("theme purple: exit %d, stderr %q; want %d and no usage", code, errOut.String(), ExitFail)
	}
}

// theme without a name shows the user's theme.
func TestThemeWithoutANameShowsIt(t *testing.T) {
	for _, tc := range []struct {
		u    fleet.User
		want string
	}{
		{fleet.User{Name: "vic", Role: fleet.RoleViewer, Fingerprint: "SHA256:x", Theme: "light"}, "theme light"},
		{fleet.User{Name: "vic", Role: fleet.RoleViewer, Fingerprint: "SHA256:x"}, "theme auto"},
		{fleet.User{Name: "root@hub", Role: fleet.RoleAdmin}, "root@hub is not a console user"},
	} {
		var out, errOut bytes.Buffer
		if code := Run(context.Background(), &fakeHub{}, tc.u, []string{"theme"}, nil, &out, &errOut); code != ExitOK || !strings.Contains(out.String(), tc.want) {
			t.Errorf("theme as %+v: exit %d, %q %q; want %q", tc.u, code, out.String(), errOut.String(), tc.want)
		}
	}
}

type themeHub struct{ *fakeHub }

func (themeHub) SetTheme(context.Context, fleet.User, string) error {
	return errors.New(`unknown theme "purple": choose one of dark, high-contrast, light`)
}
