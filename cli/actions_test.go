package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"fleet"
)

// commandFor is a command line that asks for each action of the table; the
// test below fails when the table gains an action no command asks for.
var commandFor = map[fleet.ActionName][]string{
	"help":            {"help"},
	"whoami":          {"whoami"},
	"workers":         {"workers"},
	"nodes":           {"nodes"},
	"models":          {"models"},
	"events":          {"events"},
	"export":          {"export"},
	"theme":           {"theme", "dark"},
	"drain":           {"drain", "ultra"},
	"undrain":         {"undrain", "ultra"},
	"restart":         {"restart", "ultra"},
	"stop":            {"stop", "ultra"},
	"start":           {"start", "ultra"},
	"shape":           {"shape", "ultra", "max"},
	"shape --all":     {"shape", "--all", "qwen3-4b"},
	"bench":           {"bench", "ultra"},
	"bench --history": {"bench", "--history", "ultra/qwen3-4b"},
	"admit --force":   {"admit", "--force", "ultra"},
	"audit":           {"audit"},
	"apply":           {"apply", "--filename", "f.yaml"},
	"apply --dry-run": {"apply", "--dry-run", "--filename", "f.yaml"},
	"shape pin":       {"shape", "pin", "ultra"},
	"node trust":      {"node", "trust", "ultra"},
	"user add":        {"user", "add", "newbie"},
	"user rm":         {"user", "rm", "vic"},
	"user list":       {"user", "list"},
	"key create":      {"key", "create", "ci"},
	"key revoke":      {"key", "revoke", "ci"},
	"key list":        {"key", "list"},
	"key limit":       {"key", "limit", "ci", "--rpm", "60"},
	"usage":           {"usage"},
	"usage --by key":  {"usage", "--by", "key"},
	"logs":            {"logs", "ultra/qwen3-4b"},
	"status":          {"status"},
}

// TestEveryActionByEveryRole runs the command of every action in the table
// as every role: the tree asks the hub about exactly that action before
// running anything, and a refusal stops the command before it prints.
func TestEveryActionByEveryRole(t *testing.T) {
	users := []fleet.User{
		{Name: "v", Role: fleet.RoleViewer}, {Name: "op", Role: fleet.RoleOperator}, {Name: "ad", Role: fleet.RoleAdmin},
		{Name: "eve"}, {Name: "mallory", Role: "root"},
	}
	for _, a := range fleet.Actions() {
		args, ok := commandFor[a.Name]
		if !ok {
			t.Errorf("action %q is in the table but no command line here asks for it", a.Name)
			continue
		}
		for _, u := range users {
			t.Run(string(a.Name)+"/"+u.Name, func(t *testing.T) {
				h := &fakeHub{}
				var out, errOut bytes.Buffer
				code := Run(context.Background(), h, u, args, strings.NewReader("nodes: []\n"), &out, &errOut)
				if len(h.authorized) == 0 || h.authorized[0][0] != string(a.Name) {
					t.Fatalf("%v asked the hub about %v first, want %q", args, h.authorized, a.Name)
				}
				if u.Role.Allows(a.Role) {
					if strings.Contains(errOut.String(), "permission denied") {
						t.Errorf("%v by %s (%q) was refused: %s", args, u.Name, u.Role, errOut.String())
					}
					return
				}
				if code != ExitFail || !strings.Contains(errOut.String(), "permission denied") || out.Len() != 0 || len(h.acts) != 0 || h.applied != "" {
					t.Errorf("%v by %s (%q): exit %d, stdout %q, stderr %q, acts %v; want a refusal that ran nothing",
						args, u.Name, u.Role, code, out.String(), errOut.String(), h.acts)
				}
			})
		}
	}
}

// TestCommandOutsideTheTableIsRefused: a command added to the tree without
// an entry in the action table does not run, even for an admin.
func TestCommandOutsideTheTableIsRefused(t *testing.T) {
	h := &fakeHub{}
	root := newRoot(h, fleet.User{Name: "ad", Role: fleet.RoleAdmin}, nil)
	ran := false
	root.AddCommand(&cobra.Command{Use: "frobnicate", RunE: func(*cobra.Command, []string) error { ran = true; return nil }})
	root.SetArgs([]string{"frobnicate", "ultra"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	err := root.ExecuteContext(context.Background())
	if ran || err == nil || !strings.Contains(err.Error(), "not in the hub's action table") {
		t.Fatalf("frobnicate ran=%v, err=%v; want it refused as outside the action table", ran, err)
	}
	if len(h.authorized) != 1 || h.authorized[0] != [2]string{"frobnicate", "ultra"} {
		t.Errorf("the hub was asked about %v, want frobnicate on ultra", h.authorized)
	}
}

// TestTreeKeepsTheGuard: cobra runs only the nearest PersistentPreRunE, so
// a command with its own would slip past the root's check.
func TestTreeKeepsTheGuard(t *testing.T) {
	root := newRoot(&fakeHub{}, fleet.User{}, nil)
	root.InitDefaultHelpCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sc := range c.Commands() {
			if sc.PersistentPreRun != nil || sc.PersistentPreRunE != nil {
				t.Errorf("%s sets its own PersistentPreRun, which skips the root's authorization", sc.CommandPath())
			}
			if sc.Runnable() {
				if action, _ := actionOf(sc, nil); !fleetHas(action) {
					t.Errorf("%s runs as action %q, which the table does not have: it would be refused for everyone", sc.CommandPath(), action)
				}
			}
			walk(sc)
		}
	}
	walk(root)
}

func fleetHas(action fleet.ActionName) bool {
	_, ok := fleet.LookupAction(action)
	return ok
}
