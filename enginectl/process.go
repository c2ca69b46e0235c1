package enginectl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"fleet"
)

// Process is an engine launched detached on a node.
type Process struct {
	PID int
	// PGID is the engine's process group; the engine leads its own session,
	// so it equals PID. Stop signals the whole group.
	PGID      int
	StartedAt time.Time
	LogPath   string
	PIDPath   string
	// ServedName is the model name the engine's /v1/models must list for
	// WaitReady to call it ready; "" accepts any listed model. Set it from
	// the worker's model when rebuilding a Process for an adopted engine.
	ServedName string
}

// FileStem is the name of a worker's files in the node's state dir:
// "<node>-<model>" with every byte but letters, digits, '.', '_' and '-'
// (and a leading '.') written as %XX, so a model ID like "org/model" cannot
// climb out of the folder, and two models of one node never share their
// files: "col/x" is "col%2Fx", not "col_x" (which is another model's name).
// Names made only of those characters keep the stem they always had.
func FileStem(node, model string) string {
	return escapeFileName(node) + "-" + escapeFileName(model)
}

func escapeFileName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		safe := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.' && i > 0
		if safe {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// Start launches cmd detached: in its own session and process group, stdin
// from /dev/null, stdout and stderr to <StateDir>/<node>-<model>.log (the
// previous log kept as .log.1), with a pid file and an argv file beside it.
// The engine outlives the Runner's session. Env travels as `env K=V … cmd`.
// Start does not wait for readiness: call WaitReady.
func Start(ctx context.Context, r Runner, spec Spec, cmd Command, opts ...Option) (Process, error) {
	o := applyOptions(opts)
	if len(cmd.LaunchArgv) == 0 {
		return Process{}, errors.New("start: the command is empty; build it with BuildCommand")
	}
	argv := slices.Clone(cmd.LaunchArgv)
	vars := maps.Clone(cmd.Env)
	if spec.Owner.FleetID != "" {
		if vars == nil {
			vars = map[string]string{}
		}
		vars[EnvFleetID] = spec.Owner.FleetID
		vars[EnvLaunch] = strconv.FormatInt(spec.Owner.Launch, 10)
	}
	if len(vars) > 0 {
		env := []string{"env"}
		for _, k := range slices.Sorted(maps.Keys(vars)) {
			if !envKey.MatchString(k) {
				return Process{}, fmt.Errorf("start: env name %q is not a valid variable name", k)
			}
			env = append(env, k+"="+vars[k])
		}
		argv = append(env, argv...)
	}
	if spec.Engine == fleet.EngineVLLM && !cmd.Simulated {
		if err := checkCompiler(ctx, r, spec.Node.Name); err != nil {
			return Process{}, err
		}
	}
	stem := FileStem(spec.Node.Name, spec.Model.ID)
	args := append([]string{spec.StateDir, stem, cmd.LaunchArgv[0]}, argv...)
	started := time.Now()
	out, err := runScript(ctx, r, "start", args...)
	if err != nil {
		return Process{}, fmt.Errorf("start %s on node %s: %w", path.Base(cmd.Bin), spec.Node.Name, err)
	}
	kv := keyValues(out)
	pid, err := strconv.Atoi(kv["pid"])
	if err != nil || pid <= 1 {
		return Process{}, fmt.Errorf("start %s on node %s: the launcher printed no PID (output %q)", path.Base(cmd.Bin), spec.Node.Name, out)
	}
	p := Process{PID: pid, PGID: pid, StartedAt: started, LogPath: kv["log"], PIDPath: kv["pidfile"], ServedName: cmd.ServedName}
	o.logger.Info("engine launched", "node", spec.Node.Name, "model", spec.Model.ID, "pid", pid, "log", p.LogPath, "argv", strings.Join(cmd.Argv, " "))
	return p, nil
}

// checkCompiler refuses a vLLM launch on a node without a C compiler:
// Triton compiles vLLM's GPU kernels with one while the engine runs, and an
// engine that dies on its first request is worse than one never started.
// Install checks before it installs anything, Start before each launch
// (a vLLM installed by hand).
func checkCompiler(ctx context.Context, r Runner, node string) error {
	out, err := runScript(ctx, r, "whichall", "cc", "gcc", "clang")
	if err != nil {
		return fmt.Errorf("looking for a C compiler on node %s: %w", node, err)
	}
	if strings.TrimSpace(string(out)) == "" {
		return fmt.Errorf("vLLM needs a C compiler when it runs (Triton compiles its GPU kernels with one), and node %s has none (no cc, gcc or clang): install one (Debian, Ubuntu: sudo apt-get install gcc; Fedora: sudo dnf install gcc), and the worker starts on its next try", node)
	}
	return nil
}

func keyValues(out []byte) map[string]string {
	kv := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if k, v, ok := strings.Cut(strings.TrimRight(line, "\n"), "="); ok {
			kv[k] = v
		}
	}
	return kv
}

// procState is a process as the node reports it.
type procState struct {
	State string
	PPID  int
	PGID  int
}

// stat reports a live (non-zombie) process, ok=false when it is gone.
func stat(ctx context.Context, r Runner, pid int) (procState, bool, error) {
	out, err := runScript(ctx, r, "stat", strconv.Itoa(pid))
	if err != nil {
		return procState{}, false, err
	}
	f := strings.Fields(string(out))
	if len(f) < 3 {
		return procState{}, false, nil
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	if f[0] == "Z" || f[0] == "X" {
		return procState{}, false, nil
	}
	return procState{State: f[0], PPID: ppid, PGID: pgid}, true, nil
}

// Alive reports whether PID runs on the node (a zombie counts as gone).
func Alive(ctx context.Context, r Runner, pid int) (bool, error) {
	_, ok, err := stat(ctx, r, pid)
	return ok, err
}

// groupMembers lists the live PIDs of a process group.
func groupMembers(ctx context.Context, r Runner, pgid int) ([]int, error) {
	out, err := runScript(ctx, r, "group", strconv.Itoa(pgid))
	if err != nil {
		return nil, err
	}
	var pids []int
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if pid, err := strconv.Atoi(f[0]); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Stop ends the engine: TERM to its whole process group (vLLM's engine
// core and workers included), KILL after grace, then confirms nothing of the
// group is left. Stopping an engine that is already gone succeeds.
func Stop(ctx context.Context, r Runner, p Process, grace time.Duration, opts ...Option) error {
	o := applyOptions(opts)
	if p.PID <= 1 {
		return fmt.Errorf("stop: PID %d is not an engine process", p.PID)
	}
	pgid := p.PGID
	if pgid == 0 {
		pgid = p.PID
	}
	return stopGroup(ctx, r, p.PID, pgid, grace, o)
}

func stopGroup(ctx context.Context, r Runner, pid, pgid int, grace time.Duration, o options) error {
	members, err := groupMembers(ctx, r, pgid)
	if err != nil {
		return fmt.Errorf("stop PID %d: %w", pid, err)
	}
	if len(members) == 0 {
		o.logger.Info("engine already gone", "pid", pid, "pgid", pgid)
		return nil
	}
	o.logger.Info("stopping engine", "pid", pid, "pgid", pgid, "members", members, "grace", grace)
	if _, err := runScript(ctx, r, "signal", "TERM", strconv.Itoa(pgid)); err != nil {
		return fmt.Errorf("stop PID %d: %w", pid, err)
	}
	gone, err := waitGroupGone(ctx, r, pgid, grace, o.pollInterval)
	if err != nil || gone {
		return err
	}
	members, _ = groupMembers(ctx, r, pgid)
	o.logger.Warn("engine ignored TERM; killing it", "pid", pid, "pgid", pgid, "members", members, "grace", grace)
	if _, err := runScript(ctx, r, "signal", "KILL", strconv.Itoa(pgid)); err != nil {
		return fmt.Errorf("stop PID %d: %w", pid, err)
	}
	// KILL cannot be ignored; what is left after this is stuck in the kernel
	// (uninterruptible I/O) and worth an operator's attention.
	gone, err = waitGroupGone(ctx, r, pgid, 10*time.Second, o.pollInterval)
	if err != nil {
		return err
	}
	if !gone {
		members, _ = groupMembers(ctx, r, pgid)
		return fmt.Errorf("stop PID %d: processes %v of group %d survive KILL; check them on the node (ps -o pid,stat,args -g %d)", pid, members, pgid, pgid)
	}
	return nil
}

func waitGroupGone(ctx context.Context, r Runner, pgid int, within, every time.Duration) (bool, error) {
	deadline := time.Now().Add(within)
	for {
		members, err := groupMembers(ctx, r, pgid)
		if err != nil {
			return false, fmt.Errorf("stop process group %d: %w", pgid, err)
		}
		if len(members) == 0 {
			return true, nil
		}
		if !time.Now().Before(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("stop process group %d: %w", pgid, ctx.Err())
		case <-time.After(every):
		}
	}
}

// procInfo is what the node says a process runs.
type procInfo struct {
	Exe  string
	Argv []string
	// Args is the space-joined command line when the node cannot give the
	// exact argv (ps -o args= on macOS).
	Args string
	Home string
	// Owner is the fleet and launch in the process's environment; zero
	// when it has none (started before fleets had an identity, or not by
	// fleet) or the node does not show it.
	Owner Owner
}

func readArgv(ctx context.Context, r Runner, pid int) (procInfo, bool, error) {
	out, err := runScript(ctx, r, "argv", strconv.Itoa(pid))
	if err != nil {
		if code, ok := ExitCode(err); ok && code == 3 {
			return procInfo{}, false, nil
		}
		return procInfo{}, false, err
	}
	var info procInfo
	rest := out
	for len(rest) > 0 {
		line, tail, _ := bytes.Cut(rest, []byte("\n"))
		rest = tail
		s := string(line)
		switch {
		case strings.HasPrefix(s, "home="):
			info.Home = strings.TrimPrefix(s, "home=")
		case strings.HasPrefix(s, "fleet_id="):
			info.Owner.FleetID = strings.TrimPrefix(s, "fleet_id=")
		case strings.HasPrefix(s, "fleet_launch="):
			info.Owner.Launch, _ = strconv.ParseInt(strings.TrimPrefix(s, "fleet_launch="), 10, 64)
		case strings.HasPrefix(s, "exe="):
			info.Exe = strings.TrimPrefix(s, "exe=")
		case s == "cmdline":
			for a := range bytes.SplitSeq(bytes.TrimSuffix(rest, []byte{0}), []byte{0}) {
				info.Argv = append(info.Argv, string(a))
			}
			if len(rest) == 0 {
				info.Argv = nil
			}
			return info, true, nil
		case s == "args":
			info.Args = strings.TrimRight(string(rest), "\n")
			return info, true, nil
		}
	}
	return info, true, nil
}

// Adopt reports whether p is still our engine: its PID is alive and runs
// exactly launchArgv (a restarted hub adopts it instead of starting a
// duplicate). A leading "~/" in launchArgv means the node's home, as at
// launch. An interpreter in front (python3 /path/vllm serve …) still
// matches, since that is how the kernel shows script engines.
func Adopt(ctx context.Context, r Runner, p Process, launchArgv []string, opts ...Option) (bool, error) {
	o := applyOptions(opts)
	if p.PID <= 1 || len(launchArgv) == 0 {
		return false, nil
	}
	st, alive, err := stat(ctx, r, p.PID)
	if err != nil {
		return false, fmt.Errorf("adopt PID %d: %w", p.PID, err)
	}
	if !alive {
		o.logger.Info("not adopting: engine gone", "pid", p.PID)
		return false, nil
	}
	if p.PGID != 0 && st.PGID != p.PGID {
		o.logger.Info("not adopting: PID now belongs to another process group", "pid", p.PID, "pgid", st.PGID, "want_pgid", p.PGID)
		return false, nil
	}
	info, alive, err := readArgv(ctx, r, p.PID)
	if err != nil {
		return false, fmt.Errorf("adopt PID %d: %w", p.PID, err)
	}
	if !alive {
		return false, nil
	}
	switch err := o.fleet.judge(p.PID, info.Owner); {
	case errors.Is(err, errOtherFleet):
		o.logger.Info("not adopting: the engine belongs to another fleet", "pid", p.PID, "err", err)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("adopt PID %d: %w", p.PID, err)
	}
	want := expandHome(launchArgv, info.Home)
	if argvMatches(info, want) {
		o.logger.Info("adopting running engine", "pid", p.PID)
		return true, nil
	}
	// A wrapper script that execs the real engine keeps our PID but shows
	// another executable and argv: what start recorded on the node decides.
	ours, why, err := launchedAs(ctx, r, p, launchArgv)
	if err != nil {
		return false, fmt.Errorf("adopt PID %d: %w", p.PID, err)
	}
	if !ours {
		o.logger.Info("not adopting: PID runs something else", "pid", p.PID, "argv", info.Argv, "args", info.Args, "want", want, "recorded", why)
		return false, nil
	}
	o.logger.Info("adopting running engine by the PID and argv recorded at its launch", "pid", p.PID, "exe", info.Exe)
	return true, nil
}

// launchSlack is how much younger than its pid file the launched process
// may look: both ages are read in whole seconds, and the pid file is
// written just after the launch.
const launchSlack = 2

// launchedAs reports whether p is the process start launched with
// launchArgv, judged by the pid and argv files start wrote beside the log:
// the pid file names p.PID, the argv file holds launchArgv (after an `env
// K=V` prefix, if any), and the process is not younger than the pid file,
// which a later process given the same PID would be. why says which check
// failed.
func launchedAs(ctx context.Context, r Runner, p Process, launchArgv []string) (bool, string, error) {
	if p.PIDPath == "" {
		return false, "no pid file known", nil
	}
	rec, why, err := readLaunch(ctx, r, p.PID, p.PIDPath)
	if err != nil || why != "" {
		return false, why, err
	}
	argv := rec.argv
	want := expandHome(launchArgv, rec.home)
	n := len(argv) - len(want)
	if n < 0 || !slices.Equal(argv[n:], want) {
		return false, fmt.Sprintf("recorded argv %q", argv), nil
	}
	// What comes before is start's `env K=V …` prefix, or nothing.
	if n > 0 {
		if argv[0] != "env" {
			return false, fmt.Sprintf("recorded argv %q", argv), nil
		}
		for _, kv := range argv[1:n] {
			if !strings.Contains(kv, "=") {
				return false, fmt.Sprintf("recorded argv %q", argv), nil
			}
		}
	}
	return true, "", nil
}

// launchRecord is what start recorded on the node about the process that
// now has its PID: the argv file's command (with start's `env K=V` prefix)
// and the node's home.
type launchRecord struct {
	argv []string
	home string
}

// readLaunch reads the launch record of pid from the pid file at pidPath
// and the argv file beside it. why is not "" when pid is not the process
// start launched: gone, not named by the pid file, or younger than it (a
// later process given the same PID).
func readLaunch(ctx context.Context, r Runner, pid int, pidPath string) (launchRecord, string, error) {
	argvPath := strings.TrimSuffix(pidPath, ".pid") + ".argv"
	out, err := runScript(ctx, r, "launched", strconv.Itoa(pid), pidPath, argvPath)
	if code, ok := ExitCode(err); ok && (code == 3 || code == 4) {
		return launchRecord{}, "process or launch records gone", nil
	}
	if err != nil {
		return launchRecord{}, "", err
	}
	head, recorded, ok := bytes.Cut(out, []byte("\nargv\n"))
	if !ok {
		return launchRecord{}, "", fmt.Errorf("launched: unexpected output %q", out)
	}
	kv := keyValues(append(head, '\n'))
	if got, _ := strconv.Atoi(strings.TrimSpace(kv["pid"])); got != pid {
		return launchRecord{}, fmt.Sprintf("pid file names PID %s", strings.TrimSpace(kv["pid"])), nil
	}
	age, err1 := strconv.Atoi(kv["pidfile_age"])
	elapsed, err2 := strconv.Atoi(kv["elapsed"])
	if err1 != nil || err2 != nil {
		return launchRecord{}, "", fmt.Errorf("launched: unreadable ages in %q", head)
	}
	if elapsed+launchSlack < age {
		return launchRecord{}, fmt.Sprintf("process started %ds ago, after its pid file (%ds old)", elapsed, age), nil
	}
	rec := launchRecord{home: kv["home"]}
	for a := range bytes.SplitSeq(bytes.TrimSuffix(recorded, []byte{0}), []byte{0}) {
		rec.argv = append(rec.argv, string(a))
	}
	return rec, "", nil
}

// owner is the fleet and launch the recorded `env` prefix names; the zero
// Owner for an engine started without them (before fleets had an identity).
func (l launchRecord) owner() Owner {
	var o Owner
	if len(l.argv) == 0 || l.argv[0] != "env" {
		return o
	}
	for _, kv := range l.argv[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			break // the command itself
		}
		switch k {
		case EnvFleetID:
			o.FleetID = v
		case EnvLaunch:
			o.Launch, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return o
}

// EnvFleetID and EnvLaunch are the variables an engine is started with to
// say whose it is: its fleet's ID and the serial of its launch.
const (
	EnvFleetID = "FLEET_ID"
	EnvLaunch  = "FLEET_LAUNCH"
)

// FindLaunch looks on the node for the engine of a launch recorded before
// its start whose PID never reached the hub (the hub was killed in
// between): the pid file at pidPath names a live process that start
// launched, recorded as owner's. found is false when no engine of that
// launch runs: it never started, or it is gone.
func FindLaunch(ctx context.Context, r Runner, pidPath string, owner Owner, opts ...Option) (p Process, found bool, err error) {
	o := applyOptions(opts)
	if owner.FleetID == "" || owner.Launch == 0 {
		return Process{}, false, fmt.Errorf("find launch: no owner given (fleet ID %q, launch %d)", owner.FleetID, owner.Launch)
	}
	out, err := runScript(ctx, r, "tail", "1", pidPath)
	if code, ok := ExitCode(err); ok && code == 1 {
		return Process{}, false, nil // no pid file: nothing was started
	}
	if err != nil {
		return Process{}, false, fmt.Errorf("find the engine of launch %d: %w", owner.Launch, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 1 {
		return Process{}, false, nil
	}
	if _, alive, err := stat(ctx, r, pid); err != nil || !alive { // a zombie is gone too
		return Process{}, false, err
	}
	rec, why, err := readLaunch(ctx, r, pid, pidPath)
	if err != nil {
		return Process{}, false, fmt.Errorf("find the engine of launch %d: %w", owner.Launch, err)
	}
	if why != "" {
		o.logger.Info("launch recorded before the hub stopped: no engine of it runs", "pidfile", pidPath, "pid", pid, "why", why)
		return Process{}, false, nil
	}
	if got := rec.owner(); got != owner {
		o.logger.Info("launch recorded before the hub stopped: the pid file names another launch's engine", "pidfile", pidPath, "pid", pid, "owner", got, "want", owner)
		return Process{}, false, nil
	}
	return Process{PID: pid, PGID: pid, PIDPath: pidPath, LogPath: strings.TrimSuffix(pidPath, ".pid") + ".log"}, true, nil
}

func expandHome(argv []string, home string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		switch {
		case a == "~" && home != "":
			out[i] = home
		case strings.HasPrefix(a, "~/") && home != "":
			out[i] = strings.TrimSuffix(home, "/") + "/" + a[2:]
		default:
			out[i] = a
		}
	}
	return out
}

// argvMatches compares a live process with the argv we launched. The
// binary may appear as we passed it or resolved (setsid/env exec by PATH
// keep argv[0] as given, but a script's interpreter replaces it).
func argvMatches(info procInfo, want []string) bool {
	if info.Argv != nil {
		if slices.Equal(info.Argv, want) {
			return true
		}
		// python3 /home/u/.venv/bin/vllm serve … for want = vllm serve …
		if n := len(info.Argv) - len(want); n >= 1 && slices.Equal(info.Argv[n+1:], want[1:]) {
			return path.Base(info.Argv[n]) == path.Base(want[0])
		}
		return false
	}
	joined := strings.Join(want, " ")
	if info.Args == joined {
		return true
	}
	tail := strings.Join(want[1:], " ")
	if tail != "" && strings.HasSuffix(info.Args, " "+tail) {
		head := strings.Fields(strings.TrimSuffix(info.Args, " "+tail))
		return len(head) > 0 && path.Base(head[len(head)-1]) == path.Base(want[0])
	}
	return false
}
