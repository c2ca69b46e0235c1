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

// commandActions are the actions c can run as: its own, and the ones a flag
// its annotations name makes of it ("apply" with --dry-run).
func commandActions(t *testing.T, c *cobra.Command) []fleet.ActionName {
	t.Helper()
	base, _ := actionOf(c, nil)
	out := []fleet.ActionName{base}
	if f := c.Annotations[annotationFlagAction]; f != "" {
		out = append(out, base+fleet.ActionName(" --"+f))
	}
	if name, value, ok := strings.Cut(c.Annotations[annotationFlagValueAction], "="); ok {
		out = append(out, base+fleet.ActionName(" --"+name+" "+value))
	}
	return out
}

// TestEveryActionHasItsCommand: each action of the table is what some
// command of the tree runs as, and a per-worker one (fleet.Action.PerWorker)
// is a command that hands its arguments to the hub's Act under that name.
// An action added to the table and not to the tree fails here; one added to
// the tree and not the table fails TestTreeKeepsTheGuard.
func TestEveryActionHasItsCommand(t *testing.T) {
	root := newRoot(&fakeHub{}, fleet.User{}, nil)
	root.InitDefaultHelpCmd()
	commands := map[fleet.ActionName]*cobra.Command{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sc := range c.Commands() {
			if sc.Runnable() {
				for _, a := range commandActions(t, sc) {
					if prev, ok := commands[a]; ok {
						t.Errorf("%s and %s both run as %q", prev.CommandPath(), sc.CommandPath(), a)
					}
					commands[a] = sc
				}
			}
			walk(sc)
		}
	}
	walk(root)
	admin := fleet.User{Name: "ad", Role: fleet.RoleAdmin}
	for _, a := range fleet.Actions() {
		c, ok := commands[a.Name]
		if !ok {
			t.Errorf("action %q is in the table but no command runs as it", a.Name)
			continue
		}
		if !a.PerWorker {
			continue
		}
		h := &fakeHub{}
		var out, errOut bytes.Buffer
		path := strings.Fields(strings.TrimPrefix(c.CommandPath(), "fleet "))
		if code := Run(context.Background(), h, admin, append(path, "ultra"), nil, &out, &errOut); code != ExitOK {
			t.Errorf("%v ultra: exit %d, %s", path, code, errOut.String())
		}
		if len(h.acts) != 1 || h.acts[0][0] != string(a.Name) || h.acts[0][1] != "ultra" {
			t.Errorf("%v ultra asked the hub to act %v, want %s on ultra", path, h.acts, a.Name)
		}
	}
}

// TestWalkGivesEachCommandItsAction: Walk, which completion derives worker
// names from, hands each runnable command the table's entry of the action
// it runs as with no flag given.
func TestWalkGivesEachCommandItsAction(t *testing.T) {
	root := newRoot(&fakeHub{}, fleet.User{}, nil)
	seen := map[fleet.ActionName]bool{}
	Walk(root, func(c *cobra.Command, a fleet.Action) {
		if base, _ := actionOf(c, nil); base != a.Name {
			t.Errorf("Walk gave %s the action %q; it runs as %q", c.CommandPath(), a.Name, base)
		}
		seen[a.Name] = true
	})
	for _, want := range []fleet.ActionName{fleet.ActionDrain, fleet.ActionForceAdmit, fleet.ActionUserAdd, fleet.ActionShapePin, fleet.ActionApply} {
		if !seen[want] {
			t.Errorf("Walk never gave %q; saw %v", want, seen)
		}
	}
	if seen[fleet.ActionApplyDryRun] || seen[fleet.ActionUsageByKey] {
		t.Errorf("Walk gave a flag's action as a command's own: %v", seen)
	}
}
