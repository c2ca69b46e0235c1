package hub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/console"
	"fleet/fleetfile"
	"fleet/themes"
)

// plantedSecrets are the secrets secretFleet and plantNodeText put where
// viewers look; none may reach anyone but an admin.
var plantedSecrets = []string{
	"pyp1-s3cret", "dl-s3cret", "hf_env_s3cret", "hf_inst4ll_s3cret", "vllm-k3y-one", "vllm-k3y-two", "vllm-k3y-three",
	"llama-k3y", "sk-launch-k3y", "sk-logged-k3y", "reason-s3cret", "node-s3cret", "b3arer-tok", "audit-s3cret",
}

// plantedEscapes are what a hostile node or engine sends to retitle a
// terminal (OSC 0), write its clipboard (OSC 52) or clear it (CSI).
var plantedEscapes = []string{"\x1b]0;pwned\a", "\x1b]52;c;cHduZWQ=\a", "\x1b[2J", "\u009b2J", "\x00"}

// secretFleet is the demo fleet with secrets in every place a recipe can
// hold one: an install script with an index URL's user info, a download
// URL's token query, an exported HF_TOKEN and a bearer header; a recipe
// env HF_TOKEN; vLLM's --api_key, --api-key=… and an abbreviation;
// llama-server's --api-key.
func secretFleet(t *testing.T) []byte {
	t.Helper()
	f := string(fleetfile.Demo)
	for _, r := range [][2]string{
		{"        model: Qwen/Qwen3-4B-AWQ\n", "        model: Qwen/Qwen3-4B-AWQ\n        env:\n          HF_TOKEN: hf_env_s3cret\n" +
			"        install: |\n" +
			"          export HF_TOKEN=hf_inst4ll_s3cret\n" +
			"          pip install --index-url https://__token__:pyp1-s3cret@pypi.example.com/simple vllm\n" +
			"          curl -fsSL -H 'Authorization: Bearer b3arer-tok' 'https://dl.example.com/vllm.whl?token=dl-s3cret' -o /tmp/v.whl\n"},
		{"--tensor-parallel-size, \"1\",", "--api_key, vllm-k3y-one, --api-key=vllm-k3y-two, --api-k, vllm-k3y-three, --tensor-parallel-size, \"1\","},
		{"args: [-ngl, \"99\",", "args: [--api-key, llama-k3y, -ngl, \"99\","},
	} {
		if !strings.Contains(f, r[0]) {
			t.Fatalf("the demo fleet changed shape; update secretFleet (%q)", r[0])
		}
		f = strings.Replace(f, r[0], r[1], 1)
	}
	return []byte(f)
}

// plantNodeText makes the hub hear, through the manager's callbacks (where
// text from nodes and engines enters it), what a hostile or careless node
// says: escapes and secrets in a worker's reason and command line, a node's
// reason and GPU name, an engine's version, an installer's output, an
// engine's logged settings.
func plantNodeText(h *Hub) {
	esc := strings.Join(plantedEscapes, "")
	h.onWorker(fleet.Worker{Node: "rig", Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerFailed,
		Reason:        "install failed: curl: (22) https://u:reason-s3cret@dl.example.com/x " + esc,
		EngineVersion: "0.9" + esc,
		Argv:          []string{"vllm", "serve", "Qwen/Qwen3-4B-AWQ", "--api_key", "sk-launch-k3y", "--port", "18000"},
		LaunchArgv:    []string{"sh", "-c", "s", "start", "d", "env", "HF_TOKEN=hf_env_s3cret", "fleet", "sim", "--api-key=sk-launch-k3y"}})
	h.onNode(fleet.Node{Name: "ultra", Address: "sim:m1ultra-llamacpp", State: fleet.NodeUnreachable,
		Reason:   "ssh: https://x:node-s3cret@h " + esc,
		Platform: &fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra" + esc, GPUs: []fleet.GPU{{Name: "GPU" + esc}}}})
	// An action's outcome quoting what a node said, as the audit keeps it.
	h.guard.audit(admin, "restart", "rig/qwen3-4b", "failed: install: curl https://u:audit-s3cret@dl.example.com/x "+esc)
	for _, msg := range []string{
		"install: Looking in indexes: https://__token__:pyp1-s3cret@pypi.example.com/simple " + esc,
		"launched PID 4242 on port 18000: vllm serve Qwen/Qwen3-4B-AWQ --api_key sk-launch-k3y --port 18000",
		"engine log: INFO non-default args: {'model': 'Qwen/Qwen3-4B-AWQ', 'api_key': ['sk-logged-k3y']}",
		"install: " + esc + " 45%",
	} {
		h.onEvent(fleet.Event{Level: "info", Subject: "rig/qwen3-4b", Message: msg})
	}
}

// viewerCommands are the command lines run for each action a viewer may
// do, --json forms included. An action the table gives viewers without an
// entry here fails the test, so a new viewer command is checked too.
var viewerCommands = map[fleet.ActionName][][]string{
	"help":            {{"help"}, {"workers", "--help"}},
	"whoami":          {{"whoami"}, {"whoami", "--json"}},
	"workers":         {{"workers"}, {"workers", "--json"}},
	"nodes":           {{"nodes"}, {"nodes", "--json"}},
	"models":          {{"models"}, {"models", "--json"}},
	"status":          {{"status"}, {"status", "--json"}},
	"events":          {{"events", "--limit", "500"}, {"events", "--json", "--limit", "500"}, {"events", "--subject", "rig/qwen3-4b"}},
	"export":          {{"export"}},
	"theme":           {{"theme", "dark"}},
	"usage":           {{"usage"}, {"usage", "--json"}, {"usage", "--by", "worker"}},
	"bench --history": {{"bench", "--history", "rig/qwen3-4b"}},
	// An operator reads the audit trail too; nothing but an admin may see a secret.
	"audit": {{"audit"}, {"audit", "--json"}},
}

// Secrets reach admins only, by one rule, in every output a non-admin can
// read: each viewer command and its --json form, the console's snapshot and
// its rendered views. And no terminal escape a node or engine sent reaches
// anyone raw, admins included. Before the fix, export and models --json
// showed install: whole, --api_key went unredacted everywhere, and the
// escapes reached events, the tables and the JSON.
func TestViewersReadNoSecretsAndNoEscapes(t *testing.T) {
	h, actors := seededHub(t)
	if _, err := h.Apply(t.Context(), actors["ada"], "secret.yaml", secretFleet(t), false); err != nil {
		t.Fatal(err)
	}
	plantNodeText(h)
	for _, a := range fleet.Actions() {
		if a.Role == fleet.RoleViewer && viewerCommands[a.Name] == nil {
			t.Errorf("the action table lets viewers %q, which this test does not run: add its command lines to viewerCommands", a.Name)
		}
	}
	for _, name := range []string{"vic", "olga", "ada"} {
		u := actors[name]
		t.Run(string(u.Role), func(t *testing.T) {
			outs := map[string]string{}
			for action, argvs := range viewerCommands {
				if !u.Role.Allows(fleet.ActionRole(action)) {
					continue
				}
				for _, args := range argvs {
					var out, stderr bytes.Buffer
					if code := h.Exec(t.Context(), u, args, nil, &out, &stderr); code != 0 {
						t.Errorf("%q as %s: exit %d: %s", args, u.Role, code, stderr.String())
					}
					outs[strings.Join(args, " ")] = out.String() + stderr.String()
				}
			}
			snap, err := json.Marshal(h.ConsoleSource(u).Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			outs["console snapshot (JSON)"] = string(snap)
			for view, screen := range consoleScreens(t, h, u) {
				outs["console "+view] = screen
			}
			admin := u.Role == fleet.RoleAdmin
			for what, out := range outs {
				if strings.HasPrefix(what, "console ") && !strings.Contains(what, "JSON") {
					// The console draws with escapes of its own; none may be a planted one.
					for _, e := range plantedEscapes[:2] {
						if strings.Contains(out, e[:4]) {
							t.Errorf("%s as %s carries the node's escape %q", what, u.Role, e)
						}
					}
					out = ansi.Strip(out)
				}
				for i, r := range out {
					if fleet.UnsafeRune(r) {
						t.Errorf("%s as %s carries %U at byte %d: %q", what, u.Role, r, i, around(out, i))
						break
					}
				}
				// JSON writes a control character as \u001b: decoded, it is raw again.
				for _, v := range jsonStrings(out) {
					if i := strings.IndexFunc(v, fleet.UnsafeRune); i >= 0 {
						t.Errorf("%s as %s carries %q in a JSON string: %q", what, u.Role, v[i:i+1], around(v, i))
						break
					}
				}
				if admin {
					continue
				}
				for _, s := range plantedSecrets {
					if i := strings.Index(out, s); i >= 0 {
						t.Errorf("%s as %s shows the secret %s: %q", what, u.Role, s, around(out, i))
					}
				}
			}
			if admin {
				for _, s := range []string{"pyp1-s3cret", "hf_env_s3cret", "vllm-k3y-one", "llama-k3y"} {
					if !strings.Contains(outs["export"], s) {
						t.Errorf("an admin's export (their backup) lacks the secret %s:\n%s", s, outs["export"])
					}
				}
				return
			}
			if !strings.Contains(outs["export"], "# Exported for "+u.Name) || !strings.Contains(outs["export"], "apply refuses this file") {
				t.Errorf("a redacted export does not say so:\n%s", outs["export"])
			}
			for _, kept := range []string{"--api_key", "HF_TOKEN", "pypi.example.com/simple", "dl.example.com/vllm.whl"} {
				if !strings.Contains(outs["export"], kept) {
					t.Errorf("the export hides %q too, not only the secrets:\n%s", kept, outs["export"])
				}
			}
			_, err = h.Apply(t.Context(), actors["ada"], "exported.yaml", []byte(outs["export"]), true)
			if err == nil || !strings.Contains(err.Error(), "the placeholder an export shows non-admins") {
				t.Errorf("an admin applying a viewer's redacted export: %v; want it refused", err)
			}
		})
	}
}

// jsonStrings decodes out as a stream of JSON values (an object, an array,
// or one object a line) and returns every string in them; nothing when out
// is not JSON.
func jsonStrings(out string) []string {
	var strs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			strs = append(strs, v)
		case []any:
			for _, x := range v {
				walk(x)
			}
		case map[string]any:
			for k, x := range v {
				strs = append(strs, k)
				walk(x)
			}
		}
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var v any
		if err := dec.Decode(&v); err != nil {
			return strs
		}
		walk(v)
	}
}

// around is the text near byte i, for an error message.
func around(s string, i int) string {
	return s[max(0, i-60):min(len(s), i+60)]
}

// consoleScreens renders each of the console's views, and the detail of
// the worker under the cursor, as user u's console shows them.
func consoleScreens(t *testing.T, h *Hub, u fleet.User) map[string]string {
	t.Helper()
	var m tea.Model = console.New(h.ConsoleSource(u), console.Options{User: u, Width: 240, Height: 80, Refresh: time.Millisecond,
		Theme: themes.Dark(), Now: time.Now})
	var run func(tea.Cmd)
	send := func(msg tea.Msg) {
		var cmd tea.Cmd
		m, cmd = m.Update(msg)
		run(cmd)
	}
	run = func(cmd tea.Cmd) {
		if cmd == nil {
			return
		}
		switch msg := cmd().(type) {
		case tea.BatchMsg:
			for _, c := range msg {
				run(c)
			}
		case nil, tea.QuitMsg:
		default:
			if fmt.Sprintf("%T", msg) == "console.tickMsg" {
				return
			}
			send(msg)
		}
	}
	run(m.Init())
	screens := map[string]string{}
	for i := range 5 { // workers, nodes, models, events, usage; then workers again
		screens[fmt.Sprintf("view %d", i)] = m.View().Content
		send(tea.KeyPressMsg{Code: tea.KeyTab})
	}
	send(tea.KeyPressMsg{Code: tea.KeyDown}) // rig, the failed worker with a reason
	send(tea.KeyPressMsg{Code: tea.KeyEnter})
	screens["worker detail"] = m.View().Content
	return screens
}
