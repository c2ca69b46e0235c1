package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"fleet"
	"fleet/cli"
	"fleet/hub"
)

// completionCmd prints cobra's completion script for a shell. It runs here,
// never in the hub: a shell's startup files must work with no hub running.
func completionCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "print the shell completion script (needs no running hub)",
		Long: `completion prints a script that completes fleet's commands, flags and, from a running hub,
worker and node names. Load it:
  bash:  source <(fleet completion bash)        (or save it in /etc/bash_completion.d/fleet)
  zsh:   fleet completion zsh > "${fpath[1]}/_fleet"
  fish:  fleet completion fish > ~/.config/fish/completions/fleet.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 || !slices.Contains([]string{"bash", "zsh", "fish"}, args[0]) {
				return fmt.Errorf("completion takes one shell: bash, zsh or fish (got %q)", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			w := c.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			}
			return root.GenFishCompletion(w, true)
		},
	}
}

// isCompletion says whether args are the completion scripts' request to
// complete a command line (cobra's hidden __complete command).
func isCompletion(args []string) bool {
	return len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd)
}

// attachForCompletion puts the hub's real command tree under root, so its
// subcommands and flags complete (the forwarders parse no flags), and lets
// the commands whose action takes workers or nodes (fleet.Action.OnWorkers)
// complete their names from the hub running on the data dir, when one runs.
func attachForCompletion(root *cobra.Command, dataDir *string) {
	cli.Attach(root, nil, fleet.User{}, nil)
	names := func(c *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		return runningNames(c.Context(), *dataDir), cobra.ShellCompDirectiveNoFileComp
	}
	cli.Walk(root, func(c *cobra.Command, a fleet.Action) {
		if a.OnWorkers {
			c.ValidArgsFunction = names
		}
	})
}

// runningNames are the workers and nodes of the hub on dataDir; none when
// no hub answers within a second, so a tab press never hangs.
func runningNames(ctx context.Context, dataDir string) []string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var out bytes.Buffer
	if code, err := hub.RunRemote(ctx, dataDir, []string{"workers", "--json"}, nil, &out, io.Discard); err != nil || code != 0 {
		return nil
	}
	var ws []fleet.WorkerView
	if json.Unmarshal(out.Bytes(), &ws) != nil {
		return nil
	}
	var names []string
	for _, w := range ws {
		names = append(names, w.Name())
		if !slices.Contains(names, w.Node) {
			names = append(names, w.Node)
		}
	}
	slices.Sort(names)
	return names
}
