// Package cli is the command tree that operators type: the same commands
// answer `fleet workers` on the hub machine (through the hub's control
// socket) and `ssh -p 2222 hub workers` (through the SSH server). It holds no
// state. Before any command runs, the root asks the Hub to authorize it by
// its name in the action table (fleet.Actions): a command missing from the
// table is refused, so one added later is protected without anyone
// remembering. The Hub checks again in each action and writes the audit line.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"fleet"
	"fleet/bench/shape"
	"fleet/bench/sweep"
	"fleet/columns"
)

// Hub is what the commands need from the running hub.
type Hub interface {
	// Authorize refuses, and audits the refusal of, an action (a name in
	// fleet.Actions) that u may not do.
	Authorize(ctx context.Context, u fleet.User, action fleet.ActionName, target string) error
	// Snapshot and Events are the fleet and its events as u may see them
	// (redacted by the hub for all but admins).
	Snapshot(ctx context.Context, u fleet.User) fleet.Snapshot
	// Act does a per-worker action (fleet.Action.PerWorker: drain,
	// undrain, restart, stop, start) to the named workers or nodes.
	Act(ctx context.Context, u fleet.User, kind fleet.ActionName, targets []string) (string, error)
	Apply(ctx context.Context, u fleet.User, filename string, data []byte, dryRun bool) (string, error)
	Export(ctx context.Context, u fleet.User) ([]byte, error)
	Events(ctx context.Context, u fleet.User, subject string, afterID int64, limit int) ([]fleet.Event, error)
	Audit(ctx context.Context, u fleet.User, limit int) ([]fleet.AuditEntry, error)
	AddUser(ctx context.Context, u fleet.User, nu fleet.User) error
	RemoveUser(ctx context.Context, u fleet.User, name string) error
	Users(ctx context.Context, u fleet.User) ([]fleet.User, error)

	Shape(ctx context.Context, u fleet.User, a, b string) (shape.Report, error)
	ShapeAll(ctx context.Context, u fleet.User, model string) ([]shape.Report, error)
	PinShape(ctx context.Context, u fleet.User, worker string) (string, error)
	Bench(ctx context.Context, u fleet.User, target string, o fleet.BenchOptions, progress io.Writer) (sweep.Result, error)
	ForceAdmit(ctx context.Context, u fleet.User, worker string) (string, error)
	TrustNode(ctx context.Context, u fleet.User, node string) (string, error)
	CreateKey(ctx context.Context, u fleet.User, name string) (string, error)
	Keys(ctx context.Context, u fleet.User) ([]fleet.APIKey, error)
	RevokeKey(ctx context.Context, u fleet.User, name string) error
	SetKeyLimits(ctx context.Context, u fleet.User, name string, l fleet.KeyLimits) error
	// KeysNotChecked says why the router checks no API key ("" when it
	// does), which key commands tell whoever sets a limit.
	KeysNotChecked() string
	Usage(ctx context.Context, u fleet.User, since time.Time, by string) ([]fleet.Usage, error)
	SetTheme(ctx context.Context, u fleet.User, name string) error
	LogsHub
	StatusHub
	BenchHistoryHub
}

// Exit statuses: 0 ok, 1 the command failed, 2 it was typed wrong.
const (
	ExitOK    = 0
	ExitFail  = 1
	ExitUsage = 2
)

type usageError struct{ error }

// Run executes one command line for user u and returns its exit status.
func Run(ctx context.Context, h Hub, u fleet.User, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(h, u, stdin)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	c, err := root.ExecuteContextC(ctx)
	if err != nil && !u.Role.Allows(fleet.RoleAdmin) {
		err = redactedError{err}
	}
	return ReportError(stderr, c, err)
}

// redactedError is an error as a non-admin reads it: it may quote a node's
// error or an install script, so its text goes through fleet.RedactText.
type redactedError struct{ err error }

func (e redactedError) Error() string { return fleet.RedactText(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

// UsageError marks err as the command typed wrong (exit status 2).
func UsageError(err error) error { return usageError{err} }

// ReportError prints err, which command c ended with, and gives the exit
// status. A command typed wrong (a usage error, an unknown flag or an
// argument it does not take) ends with its own usage line and where its
// help is; an unknown command with where the list of commands is.
func ReportError(stderr io.Writer, c *cobra.Command, err error) int {
	if err == nil {
		return ExitOK
	}
	// An error may quote a node's or an engine's words, or what was typed.
	fmt.Fprintf(stderr, "fleet: %s\n", fleet.Sanitize(err.Error()))
	// Flag errors arrive as usage errors (the roots' FlagErrorFunc);
	// cobra's own argument checks say "unknown command".
	var ue usageError
	switch {
	case c == nil || !c.HasParent() && strings.HasPrefix(err.Error(), "unknown command"):
		fmt.Fprintln(stderr, "run 'help' for the list of commands")
		return ExitUsage
	case errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command"):
		fmt.Fprintf(stderr, "usage: %s\nrun '%s --help' for its arguments and flags\n", c.UseLine(), c.CommandPath())
		return ExitUsage
	}
	return ExitFail
}

func newRoot(h Hub, u fleet.User, stdin io.Reader) *cobra.Command {
	root := &cobra.Command{
		Use:           "fleet",
		Short:         "drive the fleet: workers, nodes, models, drain, restart, apply",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	// Every command below the root runs this first (none sets its own), as
	// soft-serve guards its tree.
	root.PersistentPreRunE = func(c *cobra.Command, args []string) error {
		action, target := actionOf(c, args)
		return h.Authorize(c.Context(), u, action, target)
	}
	Attach(root, h, u, stdin)
	return root
}

// Annotations a command sets when its action is not simply its path below
// the root ("user add"): annotationAction names it outright,
// annotationFlagAction names a flag that, when given, makes it another
// action ("apply" with --dry-run is "apply --dry-run"),
// annotationFlagValueAction a flag=value that does so ("usage" with --by key
// is "usage --by key"), and annotationTargetFlag a flag whose value is what
// the action is done to.
const (
	annotationAction          = "fleet.action"
	annotationFlagAction      = "fleet.action-flag"
	annotationFlagValueAction = "fleet.action-flag-value"
	annotationTargetFlag      = "fleet.target-flag"
)

// actionOf is the name in the action table of command c run with args, and
// the target its audit line names.
func actionOf(c *cobra.Command, args []string) (action fleet.ActionName, target string) {
	action = fleet.ActionName(c.Annotations[annotationAction])
	if action == "" {
		path := c.CommandPath()
		if c.HasParent() {
			path = strings.TrimPrefix(path, c.Root().Name()+" ")
		}
		action = fleet.ActionName(path)
	}
	if f := c.Annotations[annotationFlagAction]; f != "" && c.Flags().Changed(f) {
		action += fleet.ActionName(" --" + f)
	}
	if name, value, ok := strings.Cut(c.Annotations[annotationFlagValueAction], "="); ok {
		if f := c.Flags().Lookup(name); f != nil && f.Value.String() == value {
			action += fleet.ActionName(" --" + name + " " + value)
		}
	}
	target = strings.Join(args, " ")
	if f := c.Flags().Lookup(c.Annotations[annotationTargetFlag]); f != nil && f.Value.String() != "" {
		target = strings.TrimSpace(f.Value.String() + " " + target)
	}
	return action, target
}

// Walk calls f with each runnable command under root whose action, as the
// root's authorization names it when no flag is given, is in the action
// table, and with that action: how what the table says of an action (that
// it takes worker names, say) reaches its command.
func Walk(root *cobra.Command, f func(c *cobra.Command, a fleet.Action)) {
	for _, c := range root.Commands() {
		if c.Runnable() {
			name, _ := actionOf(c, nil)
			if a, ok := fleet.LookupAction(name); ok {
				f(c, a)
			}
		}
		Walk(c, f)
	}
}

// Attach adds the hub commands to root, so the local binary can offer the
// same tree next to its own serve/sim commands.
func Attach(root *cobra.Command, h Hub, u fleet.User, stdin io.Reader) {
	// snapshot is the fleet as u may see it (the hub redacts it for all
	// but admins).
	snapshot := func(ctx context.Context) fleet.Snapshot {
		return h.Snapshot(ctx, u)
	}
	var asJSON bool
	jsonFlag := func(c *cobra.Command) *cobra.Command {
		c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
		return c
	}
	root.AddCommand(
		jsonFlag(&cobra.Command{
			Use:   "workers",
			Short: "list workers: node, GPU, host, engine, context, state, and the exact command line",
			Args:  noArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				ws := snapshot(c.Context()).Workers
				if asJSON {
					return writeJSON(c.OutOrStdout(), ws)
				}
				return printWorkers(c.OutOrStdout(), ws)
			},
		}),
		jsonFlag(&cobra.Command{
			Use:   "nodes",
			Short: "list nodes with their platform and state",
			Args:  noArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				snap := snapshot(c.Context())
				if asJSON {
					return writeJSON(c.OutOrStdout(), snap.Nodes)
				}
				return printNodes(c.OutOrStdout(), snap.Nodes, snap.EnginePorts)
			},
		}),
		jsonFlag(&cobra.Command{
			Use:   "models",
			Short: "list models with their recipe per engine (secrets, such as env values and --api-key, only for admins)",
			Args:  noArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				ms := snapshot(c.Context()).Models
				if asJSON {
					return writeJSON(c.OutOrStdout(), ms)
				}
				return printModels(c.OutOrStdout(), ms)
			},
		}),
		eventsCmd(h, u),
		auditCmd(h, u),
		actCmd(h, u, fleet.ActionDrain, "stop sending new requests to workers (a node name means all its workers); in-flight ones finish"),
		actCmd(h, u, fleet.ActionUndrain, "let drained workers take requests again"),
		actCmd(h, u, fleet.ActionRestart, "drain, stop and relaunch workers; prints the new command line"),
		actCmd(h, u, fleet.ActionStop, "drain and stop workers' engines; they stay stopped, across hub restarts, until 'start'"),
		actCmd(h, u, fleet.ActionStart, "launch stopped workers again and wait until they are ready"),
		applyCmd(h, u, stdin),
		&cobra.Command{
			Use:   "export",
			Short: "print the current fleet as a fleet file that applies back to the same state (secrets only for admins: others get <redacted>, said so at the top, which apply refuses)",
			Args:  noArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				data, err := h.Export(c.Context(), u)
				if err != nil {
					return err
				}
				_, err = c.OutOrStdout().Write(data)
				return err
			},
		},
		jsonFlag(&cobra.Command{
			Use:   "whoami",
			Short: "print the user and role this session acts as",
			Args:  noArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				if asJSON {
					return writeJSON(c.OutOrStdout(), map[string]string{"name": u.Name, "role": string(u.Role), "fingerprint": u.Fingerprint})
				}
				fmt.Fprintf(c.OutOrStdout(), "%s (%s)\n", u.Name, u.Role)
				return nil
			},
		}),
		userCmd(h, u, stdin),
		&cobra.Command{
			Use:   "theme [dark|light|high-contrast|auto]",
			Short: "show, or choose, your console theme (auto follows your terminal's background)",
			Args: func(c *cobra.Command, args []string) error {
				if len(args) > 1 {
					return usageError{fmt.Errorf("theme takes one theme name, or none to show yours; got %q", args)}
				}
				return nil
			},
			RunE: func(c *cobra.Command, args []string) error {
				if len(args) == 0 {
					fmt.Fprintln(c.OutOrStdout(), themeText(u))
					return nil
				}
				name := args[0]
				if name == "auto" {
					name = ""
				}
				if err := h.SetTheme(c.Context(), u, name); err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "theme %s from your next session\n", args[0])
				return nil
			},
		},
		shapeCmd(h, u),
		benchCmd(h, u),
		admitCmd(h, u),
		nodeCmd(h, u),
		keyCmd(h, u),
		usageCmd(h, u),
		logsCmd(h, u),
		statusCmd(h, u),
	)
}

// themeText says which console theme u has.
func themeText(u fleet.User) string {
	switch {
	case u.Fingerprint == "":
		return u.Name + " is not a console user: themes are per SSH user (see yours with: ssh -p PORT hub theme)"
	case u.Theme == "":
		return "theme auto: the hub's --theme if it sets one, else from your terminal's background; choose one with: theme dark|light|high-contrast"
	}
	return "theme " + u.Theme + " (theme auto to follow your terminal's background)"
}

func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", c.Name(), args)}
	}
	return nil
}

// actCmd is the command of a per-worker action (fleet.Action.PerWorker).
func actCmd(h Hub, u fleet.User, kind fleet.ActionName, short string) *cobra.Command {
	return &cobra.Command{
		Use:   string(kind) + " NODE|NODE/MODEL|all...",
		Short: short,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{fmt.Errorf("%s needs at least one node or worker name, or all (see 'workers')", kind)}
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			msg, err := h.Act(c.Context(), u, kind, args)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), msg)
			return nil
		},
	}
}

func applyCmd(h Hub, u fleet.User, stdin io.Reader) *cobra.Command {
	var dryRun bool
	var filename, file string
	c := &cobra.Command{
		Use:   "apply [-f FILE|-]",
		Short: "make the fleet match a fleet file, read from standard input or -f (adds, changes, removes; at most 4 MiB)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			// The local fleet command reads -f FILE itself and sends it here
			// as standard input; over SSH the file is on the other machine.
			if file != "" && file != "-" {
				return usageError{fmt.Errorf("apply -f %s: the file is on your machine, not the hub's; send it on standard input: ssh … apply -f - < %s", file, file)}
			}
			// One byte past the limit tells a file at the limit from a
			// longer one: a cut file can still parse, and applying what is
			// left of it would remove what the cut dropped.
			data, err := io.ReadAll(io.LimitReader(stdin, fleet.MaxFleetFileBytes+1))
			if err != nil {
				return fmt.Errorf("reading the fleet file from standard input: %w", err)
			}
			if len(data) > fleet.MaxFleetFileBytes {
				return fmt.Errorf("the fleet file %s is larger than apply's limit of %d MiB (%d bytes); nothing was applied: "+
					"a fleet file that large is not one people wrote, so check what was sent", filename, fleet.MaxFleetFileBytes>>20, fleet.MaxFleetFileBytes)
			}
			if len(strings.TrimSpace(string(data))) == 0 {
				return usageError{errors.New("apply reads a fleet file on standard input and got nothing; try: apply < fleet.yaml")}
			}
			msg, err := h.Apply(c.Context(), u, filename, data, dryRun)
			if err != nil {
				return err
			}
			fmt.Fprint(c.OutOrStdout(), msg)
			return nil
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan and change nothing")
	c.Flags().StringVarP(&file, "file", "f", "", "the fleet file; - (or no -f) reads standard input")
	c.Flags().StringVar(&filename, "filename", "stdin", "name used for the file in error messages")
	c.Annotations = map[string]string{annotationFlagAction: "dry-run", annotationTargetFlag: "filename"}
	return c
}

func eventsCmd(h Hub, u fleet.User) *cobra.Command {
	var follow, asJSON bool
	var limit int
	var subject string
	c := &cobra.Command{
		Use:   "events [NODE|NODE/MODEL]",
		Short: "print recent events (launches, probes, drains, failures), all or of one node or worker; --follow keeps printing",
		Args: func(c *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return usageError{fmt.Errorf("events takes at most one node or worker, got %q", args)}
			case len(args) == 1 && subject != "" && subject != args[0]:
				return usageError{fmt.Errorf("events %s --subject %s names two subjects; give one", args[0], subject)}
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 {
				subject = args[0]
			}
			ctx := c.Context()
			var after int64
			for {
				evs, err := h.Events(ctx, u, subject, after, limit)
				if err != nil {
					return err
				}
				for _, e := range evs {
					if asJSON {
						if err := json.NewEncoder(c.OutOrStdout()).Encode(e); err != nil {
							return err
						}
					} else {
						fmt.Fprintf(c.OutOrStdout(), "%s %-5s %-20s %s\n", e.At.Local().Format("15:04:05"), e.Level, e.Subject, e.Message)
					}
					after = e.ID
				}
				if !follow {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(500 * time.Millisecond):
				}
			}
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until interrupted")
	c.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	c.Flags().IntVar(&limit, "limit", 50, "how many recent events")
	c.Flags().StringVar(&subject, "subject", "", "only events of this node or worker (the same as naming it: events NODE)")
	return c
}

func auditCmd(h Hub, u fleet.User) *cobra.Command {
	var asJSON bool
	var limit int
	c := &cobra.Command{
		Use:   "audit",
		Short: "who did what, when, to what, and how it ended (a user's repeated refusals of one action within a minute are one line with a count)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			es, err := h.Audit(c.Context(), u, limit)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), es)
			}
			tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "WHEN\tUSER\tACTION\tTARGET\tOUTCOME")
			for _, e := range es {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.At.Local().Format(time.DateTime), e.User, e.Action, e.Target, e.OutcomeText())
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().IntVar(&limit, "limit", 50, "how many recent entries")
	return c
}

func userCmd(h Hub, u fleet.User, stdin io.Reader) *cobra.Command {
	c := &cobra.Command{Use: "user", Short: "manage console users (admin)"}
	var role string
	add := &cobra.Command{
		Use:   "add NAME --role viewer|operator|admin < key.pub",
		Short: "add a user with the public key read from standard input",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("user add takes one NAME")}
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			key, err := io.ReadAll(io.LimitReader(stdin, 16<<10))
			if err != nil {
				return fmt.Errorf("reading the public key from standard input: %w", err)
			}
			r := fleet.Role(role)
			if !r.Allows(fleet.RoleViewer) {
				return usageError{fmt.Errorf("unknown role %q: use viewer, operator or admin", role)}
			}
			if err := h.AddUser(c.Context(), u, fleet.User{Name: args[0], Role: r, PublicKey: strings.TrimSpace(string(key))}); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "added %s (%s)\n", args[0], r)
			return nil
		},
	}
	add.Flags().StringVar(&role, "role", "viewer", "viewer, operator or admin")
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "list users and their roles",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			us, err := h.Users(c.Context(), u)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), us)
			}
			tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tKEY")
			for _, x := range us {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", x.Name, x.Role, x.Fingerprint)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "remove a user",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("user rm takes one NAME")}
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			if err := h.RemoveUser(c.Context(), u, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "removed %s\n", args[0])
			return nil
		},
	}
	c.AddCommand(add, list, rm)
	return c
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// workerColumns are the columns of `workers`: the set the console's worker
// table shows too, then what only the CLI prints.
var workerColumns = append(slices.Clip(columns.Table), columns.PID, columns.Port, columns.Argv)

func printWorkers(w io.Writer, ws []fleet.WorkerView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	cells := make([]string, len(workerColumns))
	for i, c := range workerColumns {
		cells[i] = c.CLIHeader()
	}
	fmt.Fprintln(tw, strings.Join(cells, "\t"))
	for _, x := range ws {
		for i, c := range workerColumns {
			cells[i] = c.Cell(x)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// printNodes prints the nodes table; hubPorts are the engine ports of nodes
// that set none of their own.
func printNodes(w io.Writer, ns []fleet.Node, hubPorts fleet.PortRange) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// USABLE is the figure a model's memory_gb is compared with (free GPU
	// memory on NVIDIA), in the unit a memory rejection uses.
	// ENGINES says where each engine was found on the node.
	fmt.Fprintln(tw, "NODE\tADDRESS\tSTATE\tHOST\tGPU\tUSABLE\tMEMORY FREE/TOTAL\tPORTS\tDRAINED\tENGINES")
	for _, n := range ns {
		host, gpu, usable, mem, engines := "?", "?", "?", "?", "?"
		if n.Platform != nil {
			host, gpu = n.Platform.HostLabel(), n.Platform.GPULabel()
			usable = fleet.GiB(n.Platform.UsableMemory())
			mem = strings.TrimSuffix(fleet.GiB(n.Platform.MemFreeBytes), " GiB") + "/" + fleet.GiB(n.Platform.MemTotalBytes)
			engines = engineLocations(n.Platform.Engines)
		}
		state := string(n.State)
		if n.Reason != "" {
			state += " (" + n.Reason + ")"
		}
		ports := n.Ports.String()
		if ports == "" {
			ports = hubPorts.String() + " (hub's)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\t%s\n", n.Name, n.Address, state, host, gpu, usable, mem, ports, n.Drained, engines)
	}
	return tw.Flush()
}

// engineLocations is "llamacpp=/opt/homebrew/bin/llama-server vllm=…", or
// "none" when the node has no engine installed yet.
func engineLocations(found map[fleet.EngineKind]string) string {
	var s []string
	for _, k := range fleet.EngineKinds {
		if where, ok := found[k]; ok {
			s = append(s, string(k)+"="+where)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

func printModels(w io.Writer, ms []fleet.Model) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tALIASES\tCTX\tMEMORY\tENGINE\tWEIGHTS\tARGS")
	for _, m := range ms {
		first := true
		for _, k := range fleet.EngineKinds {
			r, ok := m.Recipes[k]
			if !ok {
				continue
			}
			id, aliases, ctx, mem := "", "", "", ""
			if first {
				id, aliases, ctx, mem = m.ID, strings.Join(m.Aliases, ","), columns.Tokens(m.Context), fmt.Sprintf("%g GiB", m.MemoryGB)
				first = false
			}
			weights := r.Model
			if k == fleet.EngineSim {
				weights = "profile " + r.Profile
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id, aliases, ctx, mem, k, weights, strings.Join(r.Args, " "))
		}
	}
	return tw.Flush()
}
