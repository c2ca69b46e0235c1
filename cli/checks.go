package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"fleet"
	"fleet/bench/sweep"
)

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s, got %d arguments", c.CommandPath(), what, len(args))}
		}
		return nil
	}
}

func shapeCmd(h Hub, u fleet.User) *cobra.Command {
	var asJSON bool
	var all string
	c := &cobra.Command{
		Use:   "shape A B | shape --all MODEL",
		Short: "send the same requests to two workers and diff their response shapes (what a client would notice)",
		Args: func(c *cobra.Command, args []string) error {
			if all == "" && len(args) != 2 {
				return usageError{errors.New("shape takes two workers (NODE or NODE/MODEL), or --all MODEL")}
			}
			if all != "" && len(args) != 0 {
				return usageError{errors.New("shape --all MODEL takes no other arguments")}
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			if all != "" {
				reports, err := h.ShapeAll(c.Context(), u, all)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(c.OutOrStdout(), reports)
				}
				differs := 0
				for _, r := range reports {
					fmt.Fprintln(c.OutOrStdout(), r.Text(120, false))
					if r.Verdict != "same" {
						differs++
					}
				}
				if differs > 0 {
					return fmt.Errorf("%d of %d workers of %s differ from its reference shape", differs, len(reports), all)
				}
				return nil
			}
			r, err := h.Shape(c.Context(), u, args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), r)
			}
			fmt.Fprintln(c.OutOrStdout(), r.Text(120, false))
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	c.Flags().StringVar(&all, "all", "", "check every ready worker of this model against its reference shape")
	c.Long = `shape sends the same requests to two workers whose engines answer (ready, on probation, draining or
rejected) and prints what a client would notice between them.`
	c.Annotations = map[string]string{annotationFlagAction: "all", annotationTargetFlag: "all"}
	pin := &cobra.Command{
		Use:   "pin WORKER",
		Short: "make this worker's shape its model's reference, then re-judge every worker of the model (admin)",
		Long: `shape pin makes WORKER's response shape (rejected workers whose engine runs included) the
reference of its model, and judges every worker of the model against it at once: rejected ones
of that shape are admitted, ready ones of another shape rejected, so the model serves one shape.
The pin holds until the model's reference worker (fleet file reference:, else the first node of
its first placement) runs another command line; then that worker's shape is the reference again.
Meanwhile WORKER, admitted again with another shape (a new recipe), retakes the pin with it, and
the model's other workers are judged again.`,
		Args: exactArgs(1, "one worker"),
		RunE: func(c *cobra.Command, args []string) error {
			msg, err := h.PinShape(c.Context(), u, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), msg)
			return nil
		},
	}
	c.AddCommand(pin)
	return c
}

func benchCmd(h Hub, u fleet.User) *cobra.Command {
	var o fleet.BenchOptions
	var asJSON, history bool
	var limit int
	c := &cobra.Command{
		Use:   "bench NODE|NODE/MODEL|MODEL",
		Short: "closed-loop concurrency sweep against a worker (direct) or a model (through the router)",
		Long: `bench sends the same prompts to any machine at 1, 2 and 4 concurrent requests (by default),
discards a warm-up request, and prints the seed's table. A worker is measured directly,
bypassing the scheduler; a model name is measured through the router.

` + sweep.Definitions,
		Args: exactArgs(1, "one worker or model"),
		RunE: func(c *cobra.Command, args []string) error {
			if history {
				runs, err := h.BenchHistory(c.Context(), u, args[0], limit)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(c.OutOrStdout(), runs)
				}
				return printBenchHistory(c.OutOrStdout(), args[0], runs)
			}
			if o.Split != sweep.SplitChat && o.Split != sweep.SplitAgent {
				return usageError{fmt.Errorf("--split %q: use chat or agent", o.Split)}
			}
			if o.Turns < 1 || o.Turns > 1 && o.Split != sweep.SplitAgent {
				return usageError{fmt.Errorf("--turns %d: multi-turn sessions need --split agent and a count of 1 or more", o.Turns)}
			}
			res, err := h.Bench(c.Context(), u, args[0], o, c.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), res)
			}
			fmt.Fprint(c.OutOrStdout(), res.Text())
			return nil
		},
	}
	c.Flags().IntSliceVar(&o.Levels, "levels", []int{1, 2, 4}, "concurrency levels")
	c.Flags().StringVar(&o.Split, "split", sweep.SplitChat, "chat (256-token answers) or agent (~4.6K-token prompts, ~70-token answers)")
	c.Flags().IntVar(&o.Requests, "requests", 0, "requests per level (default 2×level, at least 3); with --turns, rounded up to whole sessions, at least one per concurrent request")
	c.Flags().IntVar(&o.Tokens, "tokens", 0, "output tokens per request (default 256 chat, 70 agent)")
	c.Flags().IntVar(&o.Turns, "turns", 1, "agent split: turns per session, each resending the conversation with the previous answer and a ~500-token tool result (the cache hit column shows what the engines reused; n/a when an engine reports no count, as vLLM without --enable-prompt-tokens-details)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	c.Flags().BoolVar(&history, "history", false, "list past runs (chat and agent splits), newest first, instead of running one: a worker's, or a model's (through the router and on each of its workers)")
	c.Flags().IntVar(&limit, "limit", 20, "with --history: how many runs")
	c.Annotations = map[string]string{annotationFlagAction: "history"}
	return c
}

func admitCmd(h Hub, u fleet.User) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "admit --force WORKER",
		Short: "let a rejected worker take traffic despite its failed admission check (operator, audited)",
		Long: `admit --force makes a rejected worker ready. If its engine is not running (rejected by the
memory gate before launch, or stopped after ten minutes rejected) it is launched without the checks.`,
		Args: exactArgs(1, "one worker"),
		RunE: func(c *cobra.Command, args []string) error {
			if !force {
				return usageError{errors.New("admit overrides an admission check; say so with --force")}
			}
			msg, err := h.ForceAdmit(c.Context(), u, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), msg)
			return nil
		},
	}
	c.Flags().BoolVar(&force, "force", false, "required: override the failed check")
	c.Annotations = map[string]string{annotationAction: string(fleet.ActionForceAdmit)}
	return c
}

func nodeCmd(h Hub, u fleet.User) *cobra.Command {
	c := &cobra.Command{Use: "node", Short: "node maintenance"}
	c.AddCommand(&cobra.Command{
		Use:   "trust NODE",
		Short: "accept a node's new host key after it was reinstalled (admin)",
		Args:  exactArgs(1, "one node"),
		RunE: func(c *cobra.Command, args []string) error {
			msg, err := h.TrustNode(c.Context(), u, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), msg)
			return nil
		},
	})
	return c
}

func keyCmd(h Hub, u fleet.User) *cobra.Command {
	c := &cobra.Command{Use: "key", Short: "router API keys (admin)"}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "list API keys by name (the keys themselves are never stored), with when each was last used (to the minute, within the usage kept: --retention) and its requests today (UTC)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			keys, err := h.Keys(c.Context(), u)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), keys)
			}
			tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCREATED\tREVOKED\tLAST USED\tREQUESTS TODAY\tRPM\tTOKENS/DAY")
			for _, k := range keys {
				revoked, lastUsed := "-", "-"
				if !k.Revoked.IsZero() {
					revoked = k.Revoked.Local().Format(time.DateTime)
				}
				if !k.LastUsed.IsZero() {
					lastUsed = k.LastUsed.Local().Format("2006-01-02 15:04")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", k.Name, k.Created.Local().Format(time.DateTime), revoked,
					lastUsed, k.RequestsToday, fleet.LimitText(int64(k.RequestsPerMinute)), fleet.LimitText(k.TokensPerDay))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(
		&cobra.Command{
			Use:   "create NAME",
			Short: "create a key for a client; it is printed once and only its hash is kept",
			Long: "Create a router API key for a client; it is printed once and only its hash is kept.\n\n" +
				"On the hub's machine with no hub running on --data DIR, `fleet key create NAME --data DIR` writes the key into\n" +
				"that data dir's database directly: this is how the first key of a hub started with --require-keys (or off\n" +
				"loopback) is made, since such a hub does not start without one. While a hub runs there, the command goes\n" +
				"through it, as every command does.",
			Args: exactArgs(1, "one NAME"),
			RunE: func(c *cobra.Command, args []string) error {
				key, err := h.CreateKey(c.Context(), u, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintln(c.OutOrStdout(), key)
				fmt.Fprintln(c.ErrOrStderr(), "this key is shown once; clients send it as 'Authorization: Bearer KEY'")
				return nil
			},
		},
		list,
		keyLimitCmd(h, u),
		&cobra.Command{
			Use:   "revoke NAME",
			Short: "revoke a key at once",
			Args:  exactArgs(1, "one NAME"),
			RunE: func(c *cobra.Command, args []string) error {
				if err := h.RevokeKey(c.Context(), u, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "revoked %s\n", args[0])
				return nil
			},
		},
	)
	return c
}
