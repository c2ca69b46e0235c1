// Command fleet is the hub (`fleet serve`), the simulated engine (`fleet
// sim`), and a client for every hub command (`fleet workers`, `fleet drain
// ultra`, …), which it sends to the running hub through the control socket
// in the data dir. Over SSH the hub answers the same commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"fleet"
	"fleet/cli"
	"fleet/hub"
	"fleet/internal/mdns"
	"fleet/router"
	"fleet/sim"
	"fleet/sim/profiles"
)

// Set at release time by goreleaser's ldflags (-X main.version=…); a plain
// `go build` says dev and the module's VCS stamp, if any.
var (
	version = "dev"
	commit  = ""
	date    = ""
)

// versionLine is what `fleet version` and `fleet --version` print.
func versionLine() string {
	c, d := commit, date
	if c == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					c = s.Value
				case "vcs.time":
					d = s.Value
				}
			}
		}
	}
	line := "fleet " + version
	if c != "" {
		line += " (commit " + c
		if d != "" {
			line += ", built " + d
		}
		line += ")"
	}
	return line
}

func main() {
	ctx, stop := signalContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// interrupted is the cause of main's context when a signal ended it.
type interrupted struct{ sig syscall.Signal }

func (i interrupted) Error() string { return i.sig.String() + " received" }

// signalContext is signal.NotifyContext with the signal kept as the
// context's cause (an interrupted), so an interrupted command can exit as
// shells expect of that signal.
func signalContext(parent context.Context, sigs ...os.Signal) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case s := <-ch:
			if ss, ok := s.(syscall.Signal); ok {
				cancel(interrupted{ss})
			} else {
				cancel(fmt.Errorf("%v received", s))
			}
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(context.Canceled)
	}
}

// interruptedExit is the exit status of a hub command that a signal cut
// short: 128 + the signal's number (130 for Ctrl-C's SIGINT, 143 for
// SIGTERM), as shells report a command the signal ended, and nothing is
// printed: an interrupt is how a follow (logs -f, events -f) ends, and
// the hub cancels the command when its client leaves.
func interruptedExit(ctx context.Context) (int, bool) {
	var i interrupted
	if !errors.As(context.Cause(ctx), &i) {
		return 0, false
	}
	return 128 + int(i.sig), true
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "fleet")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "fleet")
	}
	return ".fleet"
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var dataDir string
	root := &cobra.Command{
		Use:           "fleet",
		Short:         "a terminal-first console for a heterogeneous LLM inference fleet",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return cli.UsageError(err) })
	root.Version = version
	root.SetVersionTemplate(versionLine() + "\n")
	root.PersistentFlags().StringVar(&dataDir, "data", defaultDataDir(), "data dir: the SQLite database (unless serve --database-url), the hub's control socket and keys")
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)

	exit := cli.ExitOK
	root.AddCommand(serveCmd(&dataDir, args), fleetIDCmd(&dataDir), simCmd(), simulateCmd(), &cobra.Command{
		Use:   "version",
		Short: "print the version of this fleet binary",
		Args:  cobra.NoArgs,
		Run:   func(c *cobra.Command, _ []string) { fmt.Fprintln(c.OutOrStdout(), versionLine()) },
	}, completionCmd(root))
	if isCompletion(args) {
		attachForCompletion(root, &dataDir)
		return execute(ctx, root, stderr, &exit)
	}
	// Every hub command runs inside the hub; locally it is forwarded through
	// the control socket with the arguments as typed.
	for _, c := range hubCommands() {
		fwd := &cobra.Command{
			Use:                c.Use,
			Short:              c.Short + " (runs in the hub)",
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, rest []string) error {
				// Help is the hub's command tree printed here: it never
				// needs a running hub.
				if wantsHelp(rest) {
					return printHubHelp(c, rest, stdout)
				}
				// Flag parsing is off so the hub parses its own flags;
				// --data, typed anywhere, is this process's.
				fwdArgs, fwdIn, err := localArgs(cmd.Name(), rest, stdin, &dataDir)
				if err != nil {
					return err
				}
				var code int
				if name, ok := keyCreateName(cmd.Name(), fwdArgs); ok {
					code, err = createKey(cmd.Context(), dataDir, name, fwdArgs, stdout, stderr)
				} else {
					code, err = hub.RunRemote(cmd.Context(), dataDir, append([]string{cmd.Name()}, fwdArgs...), fwdIn, stdout, stderr)
				}
				if err != nil {
					if code, ok := interruptedExit(cmd.Context()); ok {
						exit = code
						return nil
					}
					return err
				}
				exit = code
				return nil
			},
		}
		root.AddCommand(fwd)
	}
	return execute(ctx, root, stderr, &exit)
}

// execute runs root and gives the exit status: *exit when it ran, else
// by its error (a command typed wrong ends with its usage, as the hub's).
func execute(ctx context.Context, root *cobra.Command, stderr io.Writer, exit *int) int {
	if c, err := root.ExecuteContextC(ctx); err != nil {
		return cli.ReportError(stderr, c, err)
	}
	return *exit
}

// hubCommands lists the command tree the hub serves, for help and routing.
func hubCommands() []*cobra.Command {
	tmp := &cobra.Command{Use: "fleet"}
	cli.Attach(tmp, nil, fleet.User{}, nil)
	return tmp.Commands()
}

// wantsHelp says whether args ask for help (-h or --help before any "--").
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "--help":
			return true
		}
	}
	return false
}

// printHubHelp prints the help of the hub command c, or of its subcommand
// that args name (`fleet user add --help`).
func printHubHelp(c *cobra.Command, args []string, stdout io.Writer) error {
	target := c
	if sub, _, err := c.Find(args); err == nil && sub != nil {
		target = sub
	}
	target.SetOut(stdout)
	return target.Help()
}

// localArgs adapts what only makes sense on this side of the socket: the
// --data flag belongs to this process, and `apply -f FILE` reads the file
// here and sends it as standard input, named for error messages. Only the
// commands that read standard input get it.
func localArgs(name string, args []string, stdin io.Reader, dataDir *string) ([]string, io.Reader, error) {
	var out []string
	var file string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--data" && i+1 < len(args):
			*dataDir = args[i+1]
			i++
		case strings.HasPrefix(a, "--data="):
			*dataDir = strings.TrimPrefix(a, "--data=")
		case name == "apply" && (a == "-f" || a == "--file"):
			if i+1 >= len(args) {
				return nil, nil, errors.New("apply -f needs a file name; or pipe the file: fleet apply < fleet.yaml")
			}
			file = args[i+1]
			i++
		case name == "apply" && strings.HasPrefix(a, "--file="):
			file = strings.TrimPrefix(a, "--file=")
		default:
			out = append(out, a)
		}
	}
	switch {
	case file == "-": // the usual spelling of standard input
		return out, stdin, nil
	case file != "":
		f, err := os.Open(file)
		if err != nil {
			return nil, nil, fmt.Errorf("opening the fleet file: %w", err)
		}
		return append(out, "--filename", filepath.Base(file)), f, nil
	case name == "apply" || name == "user":
		return out, stdin, nil
	}
	return out, nil, nil
}

// keyCreateName is the NAME of `key create NAME`, the one hub command that
// also runs without a hub (createKey).
func keyCreateName(cmd string, args []string) (string, bool) {
	if cmd != "key" || len(args) != 2 || args[0] != "create" || strings.HasPrefix(args[1], "-") {
		return "", false
	}
	return args[1], true
}

// createKey runs `key create NAME` in the hub running on dataDir or, when
// none answers there, writes the key into its database directly: a hub that
// requires keys does not start without one, so the first is made this way.
func createKey(ctx context.Context, dataDir, name string, args []string, stdout, stderr io.Writer) (int, error) {
	code, err := hub.RunRemote(ctx, dataDir, append([]string{"key"}, args...), nil, stdout, stderr)
	if !errors.Is(err, hub.ErrNoHub) {
		return code, err
	}
	// The database serve would open: $FLEET_DATABASE_URL's, else the data dir's.
	dbURL := os.Getenv(databaseURLEnv)
	key, err := hub.CreateKeyWithoutHub(ctx, dataDir, dbURL, name, stderr)
	if err != nil {
		return cli.ExitFail, err
	}
	fmt.Fprintln(stdout, key)
	if dbURL != "" {
		fmt.Fprintf(stderr, "no hub runs on %s: the key was written to the database at $%s (%s) directly; a hub started with that database accepts it\n",
			dataDir, databaseURLEnv, fleet.RedactText(dbURL))
	} else {
		fmt.Fprintf(stderr, "no hub runs on %s: the key was written to its database directly; a hub started with --data %s accepts it\n", dataDir, dataDir)
	}
	fmt.Fprintln(stderr, "this key is shown once; clients send it as 'Authorization: Bearer KEY'")
	return cli.ExitOK, nil
}

// crashAt is the hub's fault hook for crash tests (FLEET_CRASH_AT=POINT):
// at the first time the hub passes POINT it kills itself with SIGKILL, as a
// power cut or an OOM kill would, leaving everything else as it is then.
// With FLEET_CRASH_ARMED_BY=FILE it does so only once FILE exists, so a test
// aims at the action it is about to take, not at the same point passed
// earlier (an engine stopped because it failed to start, say).
func crashAt(point, armedBy string, log io.Writer) func(string) {
	return func(p string) {
		if p != point {
			return
		}
		if armedBy != "" {
			if _, err := os.Stat(armedBy); err != nil {
				return
			}
		}
		fmt.Fprintf(log, "fleet: FLEET_CRASH_AT=%s: killing the hub here\n", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not delivered at once; nothing more may happen
	}
}

// databaseURLEnv is serve's --database-url when the flag is not given.
const databaseURLEnv = "FLEET_DATABASE_URL"

func serveCmd(dataDir *string, commandLine []string) *cobra.Command {
	var opts hub.Options
	var logLevel, enginePorts string
	c := &cobra.Command{
		Use:   "serve",
		Short: "run the hub: router, node manager, control socket (and the SSH console)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: use debug, info, warn or error", logLevel)
			}
			ports, err := fleet.ParsePortRange(enginePorts)
			if err != nil {
				return fmt.Errorf("--engine-ports: %w", err)
			}
			opts.EnginePorts = ports
			if opts.RejectedGrace <= 0 || opts.AdmissionWait <= 0 {
				return fmt.Errorf("--rejected-grace %s and --admission-wait %s must both be above zero, like 10m and 2m", opts.RejectedGrace, opts.AdmissionWait)
			}
			opts.Logger = slog.New(slog.NewTextHandler(c.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			opts.DataDir = *dataDir
			opts.CommandLine = commandLine
			if opts.DatabaseURL == "" {
				// Read here, not as the flag's default: --help would print
				// the URL, password and all.
				opts.DatabaseURL = os.Getenv(databaseURLEnv)
			}
			opts.Version = strings.TrimPrefix(versionLine(), "fleet ")
			if point := os.Getenv("FLEET_CRASH_AT"); point != "" {
				opts.Fault = crashAt(point, os.Getenv("FLEET_CRASH_ARMED_BY"), c.ErrOrStderr())
			}
			// Sim nodes (sim:PROFILE) run the built-in profiles.
			opts.SimProfile = func(name string) (fleet.Platform, fleet.EngineKind, error) {
				p, err := profiles.Lookup(name)
				return p.Platform, p.Mimic, err
			}
			opts.Commands = func(ctx context.Context, api hub.API, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
				return cli.Run(ctx, api, u, args, stdin, stdout, stderr)
			}
			h, err := hub.Open(c.Context(), opts)
			if err != nil {
				return err
			}
			defer h.Close()
			return h.Run(c.Context(), func(addr string) {
				if opts.DatabaseURL != "" {
					fmt.Fprintf(c.OutOrStdout(), "fleet hub: router on http://%s/v1, state in %s, data in %s (%s)\n",
						addr, h.DatabaseName(), opts.DataDir, hub.DataDirHolds)
				} else {
					fmt.Fprintf(c.OutOrStdout(), "fleet hub: router on http://%s/v1, data in %s\n", addr, opts.DataDir)
				}
				if opts.SSHAddr != "" {
					printConsole(c.OutOrStdout(), opts.SSHAddr, h.LANName())
				}
			})
		},
	}
	c.Flags().StringVar(&opts.HTTPAddr, "http", "127.0.0.1:8080", "address of the OpenAI-compatible router")
	c.Flags().BoolVar(&opts.Demo, "demo", false, "apply the built-in demo fleet: rig (8x RTX 3060, vLLM), ultra (M1 Ultra) and max (M4 Max, llama.cpp), simulated")
	c.Flags().StringVar(&opts.FleetFile, "fleet", "", "apply this fleet file at start")
	c.Flags().StringVar(&opts.DatabaseURL, "database-url", "", "keep the state in PostgreSQL, postgres://USER:PASSWORD@HOST:5432/DATABASE, instead of SQLite in the data dir (default: $"+databaseURLEnv+", which keeps the password out of the process list); the data dir still holds "+hub.DataDirHolds)
	c.Flags().StringVar(&opts.HubName, "hub-name", "", "this hub's name among the hubs sharing one --database-url (default: the host name); two running hubs with one name are refused")
	c.Flags().DurationVar(&opts.LeaseTTL, "lease-ttl", hub.DefaultLeaseTTL, "with --database-url: how long the leader's lease lasts unrenewed (renewed every 2s; the leader stops driving the nodes 2s before it expires, and another hub takes over once the database says it expired); at least "+hub.MinLeaseTTL.String())
	c.Flags().DurationVar(&opts.DrainTimeout, "drain-timeout", 5*time.Minute, "how long a drain, restart or stop waits for the requests in flight on the worker (on every hub sharing a --database-url) before it goes on; a restart or stop then cuts them")
	c.Flags().DurationVar(&opts.Retention, "retention", hub.DefaultRetention, "how long request samples, usage minutes, events and the audit log's lines of repeated refusals are kept in the database (720h = 30 days; negative keeps them all); bench runs are always kept")
	c.Flags().IntVar(&opts.AuditMaxRows, "audit-rows", hub.DefaultAuditMaxRows, "most lines the audit log keeps; past it the oldest lines of refusals go first, then the oldest of actions (negative: no cap)")
	c.Flags().DurationVar(&opts.RejectedGrace, "rejected-grace", 10*time.Minute, "how long a worker rejected for speed or shape keeps its engine up to be looked at; then the engine stops")
	c.Flags().DurationVar(&opts.AdmissionWait, "admission-wait", 2*time.Minute, "how long a worker on probation waits for its model's reference worker, and for a peer measured faster whose shape is being checked (never for one not measured yet)")
	c.Flags().StringVar(&opts.Policy, "policy", router.PolicyFleet, "scheduling policy: "+policyUsage())
	c.Flags().DurationVar(&opts.QueueTimeout, "queue-timeout", 30*time.Second, "how long a request may wait for a free slot, or for a worker that is starting, before 429 or 503")
	c.Flags().IntVar(&opts.QueueSize, "queue-size", 256, "how many requests may wait per model before 429")
	c.Flags().DurationVar(&opts.BodyTimeout, "body-timeout", router.DefaultBodyTimeout, "how long a router client has to send its whole request body; slower gets 408")
	c.Flags().IntVar(&opts.BodiesInFlightMiB, "bodies-in-flight-mib", router.DefaultBodiesInFlight>>20, "MiB of request bodies the router holds at once (each from its first byte until its request ends); a body that would pass it gets 503, a larger one 413; negative: no bound")
	c.Flags().IntVar(&opts.KeyBodiesInFlightMiB, "key-bodies-in-flight-mib", router.DefaultKeyBodiesInFlight>>20, "MiB of request bodies the router holds at once for one API key; beyond it 429, a larger body 413; negative: no bound")
	c.Flags().DurationVar(&opts.WriteTimeout, "write-timeout", router.DefaultWriteTimeout, "how long a router client may read nothing of its answer (a write to it blocked, for this long or up to a sixteenth more) before it is cut and its engine request cancelled, freeing the slot; negative: never")
	c.Flags().BoolVar(&opts.RequireKeys, "require-keys", false, "require a router API key even on loopback (always required on other addresses); /metrics too. The hub does not start without a key: make the first with 'fleet key create NAME --data DIR' before")
	c.Flags().BoolVar(&opts.MetricsOpenLoopback, "metrics-open-loopback", false, "leave /metrics open to loopback clients (a Prometheus on this machine) when keys are required")
	c.Flags().StringVar(&opts.SSHAddr, "ssh", "127.0.0.1:2222", "address of the SSH console (empty: no console)")
	c.Flags().StringVar(&opts.AdminKeysFile, "admin-keys", "", "authorized_keys file whose keys become console admins (needed off loopback until a console user exists)")
	c.Flags().StringVar(&opts.MDNSName, "mdns", mdns.DefaultName, "announce the console off loopback by mDNS as NAME.local (ssh NAME.local); empty: no announcement")
	c.Flags().StringVar(&opts.Theme, "theme", "", "console theme: dark, light or high-contrast (default: from each client's background)")
	c.Flags().IntVar(&opts.SSHMaxConnsPerIPPerMinute, "ssh-rate", 0, "failed SSH logins per client address a minute before it is warned and only console users' keys get in; 4 times it closes the address off (0: default 30; negative: no limit)")
	c.Flags().IntVar(&opts.SSHMaxSessionsPerConn, "ssh-max-sessions-per-conn", 0, "SSH sessions open at once on one connection (0: default 10; negative: no limit)")
	c.Flags().IntVar(&opts.SSHMaxSessionsPerUser, "ssh-max-sessions-per-user", 0, "SSH sessions open at once per console user, over all connections (0: default 10; negative: no limit)")
	c.Flags().IntVar(&opts.SSHMaxConsoles, "ssh-max-consoles", 0, "interactive consoles open at once on the hub (0: default 16; negative: no limit)")
	c.Flags().StringVar(&enginePorts, "engine-ports", fleet.DefaultEnginePorts.String(), "TCP ports engines listen on, MIN-MAX, on nodes that set no ports: of their own in the fleet file; a port another program holds is skipped at once")
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}

// printConsole tells how to reach the console: by its mDNS name (e.g.
// fleet.local), with the ~/.ssh/config stanza that makes `ssh fleet.local`
// work as typed, when it is announced; by address otherwise.
func printConsole(w io.Writer, addr, lanName string) {
	host, port, _ := net.SplitHostPort(addr)
	if lanName == "" {
		fmt.Fprintf(w, "console: ssh -p %s %s\n", port, host)
		return
	}
	fmt.Fprintf(w, "console: ssh %s (announced by mDNS)\n", lanName)
	n, _ := strconv.Atoi(port)
	if stanza := mdns.SSHConfig(strings.TrimSuffix(lanName, ".local"), n); stanza != "" {
		fmt.Fprintf(w, "for `ssh %s` as typed, add to ~/.ssh/config on each laptop:\n%s", lanName, indent(stanza, "    "))
	}
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

// policyHelp says what each of the router's policies (router.PolicyNames,
// the list the router checks --policy against) does, for --policy's help;
// a test keeps the two lists and the README's one.
var policyHelp = map[string]string{
	router.PolicyFleet:          "the default: lowest predicted completion, counting the prompt prefix each worker holds",
	router.PolicyFleetNoPrefix:  "fleet without the prefix",
	router.PolicyP2CLeastLoaded: "the less loaded of two random workers with a free slot",
	router.PolicyRoundRobin:     "each worker with a free slot in turn",
	router.PolicyRandom:         "any worker with a free slot",
	router.PolicySessionSticky:  "rendezvous hash of the prompt's first chunk, whatever the load",
	router.PolicyCacheAware:     "SGLang gateway's: longest cached prefix unless the load is unbalanced",
	router.PolicyLeastLoaded:    "the worker with the fewest requests in flight per slot",
}

// policyUsage lists the policies in the router's order, each with what it
// does.
func policyUsage() string {
	parts := make([]string, len(router.PolicyNames))
	for i, name := range router.PolicyNames {
		parts[i] = fmt.Sprintf("%s (%s)", name, policyHelp[name])
	}
	return strings.Join(parts, ", ")
}

func simCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "sim --profile NAME [--mimic vllm|llamacpp] [flags] [-- ENGINE ARGS]",
		Short:              "run a simulated vLLM or llama-server worker (a real HTTP server); sim --help lists its flags",
		DisableFlagParsing: true,
		RunE: func(c *cobra.Command, args []string) error {
			return sim.Main(c.Context(), withoutDataFlag(args), c.OutOrStdout(), c.ErrOrStderr())
		},
	}
}

// withoutDataFlag drops --data, the root's flag that a command parsing its
// own flags receives too (`fleet --data DIR sim …`), from the arguments
// before "--"; the sim has no data dir.
func withoutDataFlag(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--":
			return append(out, args[i:]...)
		case a == "--data" && i+1 < len(args):
			i++
		case strings.HasPrefix(a, "--data="):
		default:
			out = append(out, a)
		}
	}
	return out
}
