package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"fleet"
	"fleet/cli"
)

// TestCompletionWithoutHub: the completion scripts and the completions of
// the hub's commands and flags come from this binary, with no hub running.
func TestCompletionWithoutHub(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"completion", "bash"}, 0, "__start_fleet"},
		{[]string{"completion", "zsh"}, 0, "#compdef fleet"},
		{[]string{"completion", "fish"}, 0, "complete -c fleet"},
		{[]string{"completion", "tcsh"}, 1, "bash, zsh or fish"},
		// What the scripts ask when tab is pressed: the hub's subcommands
		// and flags, which the forwarding commands do not parse.
		{[]string{"__complete", "--data", "DATA", "user", ""}, 0, "add\t"},
		{[]string{"__complete", "--data", "DATA", "logs", "-"}, 0, "--follow\t"},
		{[]string{"__complete", "--data", "DATA", "sta"}, 0, "status\t"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := tc.args
			for i, a := range args {
				if a == "DATA" {
					args = append(append(append([]string{}, args[:i]...), t.TempDir()), args[i+1:]...)
				}
			}
			var out, errOut bytes.Buffer
			code := run(context.Background(), args, strings.NewReader(""), &out, &errOut)
			if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.want) {
				t.Errorf("fleet %v: exit %d (want %d)\nstdout:\n%.400s\nstderr:\n%s\nwant %q", tc.args, code, tc.code, out.String(), errOut.String(), tc.want)
			}
		})
	}
}

// TestCompletionFollowsTheActionTable: a command completes worker and node
// names exactly when the table says its action takes them
// (fleet.Action.OnWorkers), so an action added to the table completes with
// no list to keep here. With no hub on the data dir the names are none, but
// the directive still tells a names completion (no files) from none.
func TestCompletionFollowsTheActionTable(t *testing.T) {
	tree := &cobra.Command{Use: "fleet"}
	cli.Attach(tree, nil, fleet.User{}, nil)
	seen := map[fleet.ActionName]bool{}
	cli.Walk(tree, func(c *cobra.Command, a fleet.Action) {
		seen[a.Name] = true
		path := strings.Fields(strings.TrimPrefix(c.CommandPath(), "fleet "))
		args := append(append([]string{"__complete", "--data", t.TempDir()}, path...), "")
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != 0 {
			t.Errorf("fleet %v: exit %d, %s", args, code, errOut.String())
			return
		}
		// cobra ends its answer with the directive, ":4" being no files.
		names := slices.Contains(strings.Split(out.String(), "\n"), fmt.Sprintf(":%d", cobra.ShellCompDirectiveNoFileComp))
		if names != a.OnWorkers {
			t.Errorf("%v completes names = %v; the table says %s takes workers = %v\n%s", path, names, a.Name, a.OnWorkers, out.String())
		}
	})
	for _, a := range fleet.Actions() {
		// A flag's variant ("bench --history") completes as its command.
		if a.OnWorkers && !strings.Contains(string(a.Name), " --") && !seen[a.Name] {
			t.Errorf("%s takes workers but no command of the tree runs as it", a.Name)
		}
	}
}
