package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"fleet"
)

// parseSince reads --since: a Go duration (90m, 24h) or whole days (7d).
func parseSince(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err == nil && n > 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	} else if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return d, nil
	}
	return 0, usageError{fmt.Errorf("--since %q is not a time span; write e.g. 90m, 24h or 7d", s)}
}

func usageCmd(h Hub, u fleet.User) *cobra.Command {
	var since, by string
	var asJSON bool
	c := &cobra.Command{
		Use:   "usage [--since 24h] [--by key|model|worker]",
		Short: "requests and tokens (prompt, cached, completion) the router counted, by model, worker or API key (by key: admin)",
		Args:  noArgs,
		// Usage by key names the keys, which only admins list.
		Annotations: map[string]string{annotationFlagValueAction: "by=key"},
		RunE: func(c *cobra.Command, _ []string) error {
			span, err := parseSince(since)
			if err != nil {
				return err
			}
			switch by {
			case "key", "model", "worker":
			default:
				return usageError{fmt.Errorf("--by %q: usage is grouped by key, model or worker", by)}
			}
			from := time.Now().Add(-span)
			us, err := h.Usage(c.Context(), u, from, by)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), struct {
					Since time.Time     `json:"since"`
					By    string        `json:"by"`
					Usage []fleet.Usage `json:"usage"`
				}{from.UTC().Truncate(time.Minute), by, us})
			}
			return printUsage(c.OutOrStdout(), by, from, us)
		},
	}
	c.Flags().StringVar(&since, "since", "24h", "how far back: 90m, 24h, 7d (counted in whole minutes)")
	c.Flags().StringVar(&by, "by", "model", "group by key (admin), model or worker")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func printUsage(w io.Writer, by string, from time.Time, us []fleet.Usage) error {
	fmt.Fprintf(w, "since %s\n", from.Local().Truncate(time.Minute).Format("2006-01-02 15:04"))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tREQUESTS\tPROMPT\tCACHED\tCOMPLETION\tTOTAL\t\n", strings.ToUpper(by))
	for _, x := range us {
		name := map[string]string{"key": x.Key, "model": x.Model, "worker": x.Worker}[by]
		if name == "" {
			name = "(no key)"
		}
		cached := "-"
		if x.PromptTokens > 0 {
			cached = fmt.Sprintf("%d (%.0f%%)", x.CachedTokens, 100*float64(x.CachedTokens)/float64(x.PromptTokens))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t\n", name, x.Requests, x.PromptTokens, cached, x.CompletionTokens, x.PromptTokens+x.CompletionTokens)
	}
	if len(us) == 0 {
		fmt.Fprintln(tw, "(no requests)\t\t\t\t\t\t")
	}
	return tw.Flush()
}

func keyLimitCmd(h Hub, u fleet.User) *cobra.Command {
	var l fleet.KeyLimits
	c := &cobra.Command{
		Use:   "limit NAME --rpm N --tokens-per-day N",
		Short: "set a key's limits, answered with 429 and x-ratelimit-* headers (0 removes a limit; a limit not given is removed too)",
		Args:  exactArgs(1, "one NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			if l.RequestsPerMinute < 0 || l.TokensPerDay < 0 {
				return usageError{fmt.Errorf("a limit cannot be negative; 0 removes it")}
			}
			if err := h.SetKeyLimits(c.Context(), u, args[0], l); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "%s: %s requests a minute, %s tokens a day (UTC)\n", args[0], fleet.LimitText(int64(l.RequestsPerMinute)), fleet.LimitText(l.TokensPerDay))
			if why := h.KeysNotChecked(); why != "" {
				fmt.Fprintf(c.ErrOrStderr(), "the limit is stored but holds nothing now: %s\n", why)
			}
			return nil
		},
	}
	c.Flags().IntVar(&l.RequestsPerMinute, "rpm", 0, "requests a minute (0: no limit)")
	c.Flags().Int64Var(&l.TokensPerDay, "tokens-per-day", 0, "prompt plus completion tokens a UTC day (0: no limit)")
	return c
}
