package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fleet/router"
	"fleet/sim"
	"fleet/store"
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

// TestSimHelp: `fleet sim --help` prints the sim's real help (its flags,
// the profiles, where the engine's arguments go) and succeeds; it printed a
// one-line usage and failed.
func TestSimHelp(t *testing.T) {
	for _, help := range []string{"--help", "-h"} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"sim", help}, strings.NewReader(""), &out, &errOut)
		if code != 0 || errOut.Len() > 0 {
			t.Errorf("fleet sim %s: exit %d, stderr %q; want 0 and nothing", help, code, errOut.String())
		}
		for _, want := range append([]string{"--profile", "--mimic", "--load-time", "--slots", "-- ENGINE ARGS", "--enable-prompt-tokens-details"}, sim.ProfileNames()...) {
			if !strings.Contains(out.String(), want) {
				t.Errorf("fleet sim %s lacks %q:\n%s", help, want, out.String())
			}
		}
	}
}

// TestLocalFlagErrorsPointToTheCommandsUsage: the local commands (serve,
// simulate) end a flag error with their own usage, as the hub's do.
func TestLocalFlagErrorsPointToTheCommandsUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"simulate", "--lod", "2"}, strings.NewReader(""), &out, &errOut)
	if code != 2 || !strings.Contains(errOut.String(), "usage: fleet simulate [flags]") || !strings.Contains(errOut.String(), "run 'fleet simulate --help'") {
		t.Errorf("fleet simulate --lod: exit %d, stderr:\n%s\nwant 2 and simulate's usage", code, errOut.String())
	}
}

// TestPolicyListIsOne: --policy's help, `fleet simulate --policies`' help,
// the router's refusal and the docs name the same policies, the router's
// list (least-loaded was refused by name but mentioned nowhere else).
func TestPolicyListIsOne(t *testing.T) {
	var docs strings.Builder
	for _, pattern := range []string{"../../README.md", "../../docs/*.md"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			docs.Write(b)
		}
	}
	serveHelp := serveCmd(new(string), nil).Flags().Lookup("policy").Usage
	simulateHelp := simulateCmd().Flags().Lookup("policies").Usage
	for _, name := range router.PolicyNames {
		if !strings.Contains(serveHelp, name+" (") {
			t.Errorf("serve --policy's help does not describe %s: %s", name, serveHelp)
		}
		if !strings.Contains(simulateHelp, name) {
			t.Errorf("simulate --policies' help does not name %s: %s", name, simulateHelp)
		}
		if !strings.Contains(docs.String(), "`"+name+"`") {
			t.Errorf("the README and docs/ never name the policy `%s`", name)
		}
	}
	if len(policyHelp) != len(router.PolicyNames) {
		t.Errorf("%d policies described, the router knows %d (%v)", len(policyHelp), len(router.PolicyNames), router.PolicyNames)
	}
}

// The first start with --require-keys (issue 21.10): the refusal names the
// flags as given and how to make the first key with no hub running; `fleet
// key create NAME --data DIR` then writes it into the database, and the
// key verifies there. A second key of the same name is refused, and the
// database keeps the first.
func TestFirstKeyBeforeTheFirstStart(t *testing.T) {
	dir := t.TempDir()
	serve := []string{"serve", "--require-keys", "--http", "127.0.0.1:0", "--ssh", "", "--mdns", "", "--data", dir}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), serve, strings.NewReader(""), &out, &errOut); code == 0 {
		t.Fatalf("serve --require-keys without a key: exit 0\n%s", errOut.String())
	}
	for _, want := range []string{"(--require-keys)", "fleet key create NAME --data " + dir, "then run again: fleet serve --require-keys --http 127.0.0.1:0 --ssh '' --mdns '' --data " + dir} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("the refusal %q does not say %q", errOut.String(), want)
		}
	}
	out.Reset()
	errOut.Reset()
	if code := run(t.Context(), []string{"key", "create", "ci", "--data", dir}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("key create without a hub: exit %d: %s", code, errOut.String())
	}
	key := strings.TrimSpace(out.String())
	st, err := store.Open(t.Context(), filepath.Join(dir, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	live, err := st.LiveAPIKeyHashes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || live[0].Name != "ci" || live[0].Hash != store.HashAPIKey(key) {
		t.Errorf("the printed key %q: the live keys are %+v; want the one of ci, its hash", key, live)
	}
	errOut.Reset()
	if code := run(t.Context(), []string{"--data", dir, "key", "create", "ci"}, strings.NewReader(""), io.Discard, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "a key named ci exists") {
		t.Errorf("a second key ci: exit %d: %s; want it refused", code, errOut.String())
	}
}
