package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// Help never needs a hub: with none running on the data dir, every hub
// command's --help (or -h) prints its usage and succeeds.
func TestHubCommandHelpWithoutHub(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"drain", "--help"}, "fleet drain NODE|NODE/MODEL|all"},
		{[]string{"stop", "-h"}, "fleet stop NODE|NODE/MODEL|all"},
		{[]string{"start", "ultra", "--help"}, "fleet start NODE|NODE/MODEL|all"},
		{[]string{"apply", "--help"}, "--dry-run"},
		{[]string{"user", "add", "--help"}, "fleet user add NAME"},
		{[]string{"bench", "--help"}, "fleet bench"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"--data", t.TempDir()}, tc.args...)
			code := run(context.Background(), args, strings.NewReader(""), &out, &errOut)
			if code != 0 || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("fleet %v: exit %d, stdout:\n%s\nstderr:\n%s\nwant it to show %q", tc.args, code, out.String(), errOut.String(), tc.want)
			}
		})
	}
	// A "--help" after "--" is an argument, not a request for help.
	if wantsHelp([]string{"sim", "--", "--help"}) {
		t.Error("--help after -- was taken for a request for help")
	}
}

// `apply -f -` reads the fleet file from standard input.
func TestLocalArgsApplyFileDash(t *testing.T) {
	stdin := strings.NewReader("nodes: []\n")
	data := "/nowhere"
	args, in, err := localArgs("apply", []string{"--dry-run", "-f", "-"}, stdin, &data)
	if err != nil {
		t.Fatalf("apply -f -: %v", err)
	}
	if strings.Join(args, " ") != "--dry-run" {
		t.Errorf("forwarded args %q, want only --dry-run", args)
	}
	if in == nil {
		t.Fatal("apply -f - forwards no standard input")
	}
	b, _ := io.ReadAll(in)
	if string(b) != "nodes: []\n" {
		t.Errorf("apply -f - forwarded %q, want standard input", b)
	}
}
