package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"fleet"
)

// LogsHub is what `logs` needs from the hub.
type LogsHub interface {
	// Logs writes the last lines of a worker's engine log to w and, with
	// follow, what it logs next until ctx ends.
	Logs(ctx context.Context, u fleet.User, worker string, lines int, follow bool, w io.Writer) error
}

func logsCmd(h Hub, u fleet.User) *cobra.Command {
	var follow bool
	var lines int
	c := &cobra.Command{
		Use:   "logs WORKER [-f] [-n N]",
		Short: "print a worker's engine log, read on its node; -f follows it (operator: logs can hold prompts; secrets only for admins)",
		Long: `logs prints the last lines of the engine's own output (stdout and stderr, which the engine
was launched with into a log file on its node), read through the node's connection. With -f it
keeps printing until you interrupt it (at most 24 hours), following the new log after a restart;
interrupted, the local fleet prints nothing more and exits 130 (Ctrl-C) or 143 (SIGTERM).
WORKER is NODE/MODEL, or a node name when the node runs one worker.`,
		Args: exactArgs(1, "one worker (NODE/MODEL)"),
		RunE: func(c *cobra.Command, args []string) error {
			if lines < 1 || lines > fleet.MaxLogLines {
				return usageError{fmt.Errorf("-n %d: give a line count from 1 to %d", lines, fleet.MaxLogLines)}
			}
			return h.Logs(c.Context(), u, args[0], lines, follow, c.OutOrStdout())
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing what the engine logs until interrupted")
	c.Flags().IntVarP(&lines, "lines", "n", fleet.DefaultLogLines, fmt.Sprintf("how many of the last lines to print first (at most %d)", fleet.MaxLogLines))
	return c
}
