package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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
