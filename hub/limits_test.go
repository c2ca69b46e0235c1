package hub

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fleet"
	"fleet/fleetfile"
)

// A fleet file nested deeper than any fleet file means is refused before
// the YAML parser runs, by `serve --fleet` and by apply alike, and changes
// nothing.
func TestDeepFleetFileRefused(t *testing.T) {
	deep := "nodes: " + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "\n"
	path := filepath.Join(t.TempDir(), "deep.yaml")
	if err := os.WriteFile(path, []byte(deep), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := openHub(t, Options{FleetFile: path})
	if err == nil {
		h.Close()
		t.Fatal("serve --fleet accepted a file nested 100,000 deep")
	}
	if !strings.Contains(err.Error(), "deep.yaml:1: collections nest more than 12 deep") {
		t.Errorf("serve --fleet: %v; want the nesting refusal with file and line", err)
	}

	h = newHub(t, Options{})
	before, err := h.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Apply(t.Context(), admin, "deep.yaml", []byte(deep), false); err == nil || !strings.Contains(err.Error(), "nest more than 12 deep") {
		t.Fatalf("apply of a file nested 100,000 deep: %v; want the nesting refusal", err)
	}
	after, err := h.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the refused apply changed the fleet:\n%s\nto\n%s", before, after)
	}
}

// withToken is the demo fleet with a secret in a recipe's env and an API
// key in llama-server's args.
func withToken(t *testing.T) []byte {
	t.Helper()
	f := strings.Replace(string(fleetfile.Demo), "        model: Qwen/Qwen3-4B-AWQ\n",
		"        model: Qwen/Qwen3-4B-AWQ\n        env:\n          HF_TOKEN: hf_s3cr3t_value\n", 1)
	f = strings.Replace(f, "args: [-ngl, \"99\",", "args: [--api-key, sk-s3cr3t-key, -ngl, \"99\",", 1)
	if !strings.Contains(f, "hf_s3cr3t_value") || !strings.Contains(f, "sk-s3cr3t-key") {
		t.Fatal("the demo fleet changed shape; update withToken")
	}
	return []byte(f)
}

// Recipe env values (an HF_TOKEN) and secret flag values (--api-key) reach
// admins only: export, models --json, workers --json and the console's
// snapshot show the other roles the names with a placeholder, and an export
// with the placeholder does not apply back as the value.
func TestSecretsRedactedForNonAdmins(t *testing.T) {
	secrets := []string{"hf_s3cr3t_value", "sk-s3cr3t-key"}
	h := newHub(t, Options{})
	if _, err := h.Apply(t.Context(), admin, "fleet.yaml", withToken(t), false); err != nil {
		t.Fatal(err)
	}
	// A worker started with the key on its command line, as the manager
	// reports one.
	h.state.mu.Lock()
	h.state.workers["ultra/qwen3-4b"] = fleet.Worker{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady,
		Argv:       []string{"llama-server", "--api-key", "sk-s3cr3t-key", "--port", "18000"},
		LaunchArgv: []string{"sh", "-c", "s", "start", "d", "env", "HF_TOKEN=hf_s3cr3t_value", "fleet", "sim", "--api-key=sk-s3cr3t-key"}}
	h.state.mu.Unlock()
	for _, u := range []fleet.User{viewer, operator, admin} {
		exported, err := h.Export(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		outs := map[string]string{"export": string(exported)}
		for _, cmd := range []string{"models", "workers"} {
			var out, stderr bytes.Buffer
			if code := h.Exec(t.Context(), u, []string{cmd, "--json"}, nil, &out, &stderr); code != 0 {
				t.Fatalf("%s --json as %s: exit %d: %s", cmd, u.Role, code, stderr.String())
			}
			outs[cmd+" --json"] = out.String()
		}
		snap, err := json.Marshal(h.ConsoleSource(u).Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		outs["console snapshot"] = string(snap)
		for what, out := range outs {
			for _, secret := range secrets {
				shows := strings.Contains(out, secret)
				if shows != (u.Role == fleet.RoleAdmin) {
					t.Errorf("%s as %s shows %s: %v\n%s", what, u.Role, secret, shows, out)
				}
			}
			if !strings.Contains(out, "HF_TOKEN") || !strings.Contains(out, "--api-key") {
				t.Errorf("%s as %s hides the variable's or the flag's name too:\n%s", what, u.Role, out)
			}
		}
		if u.Role != fleet.RoleAdmin {
			_, err := h.Apply(t.Context(), admin, "exported.yaml", exported, true)
			if err == nil || !strings.Contains(err.Error(), "holds "+fleet.Redacted+", the placeholder") {
				t.Errorf("a redacted export applied: %v", err)
			}
			noEnv := strings.Replace(string(exported), "HF_TOKEN: "+fleet.Redacted, "HF_TOKEN: hf_real", 1)
			_, err = h.Apply(t.Context(), admin, "exported.yaml", []byte(noEnv), true)
			if err == nil || !strings.Contains(err.Error(), "args: --api-key holds "+fleet.Redacted+", the placeholder") {
				t.Errorf("an export with a redacted --api-key applied: %v\n%s", err, noEnv)
			}
		}
	}
}

// What the hub tells a viewer or an operator leaves out the hub's data dir
// (a path on the hub's machine) and, in events, what engines and installers
// print that carries a credential: a secret flag's value on a launch line, a
// URL's user and password, a signed URL's query. Admins see all of it.
func TestHubPathAndEventSecretsOnlyForAdmins(t *testing.T) {
	dir := t.TempDir()
	h := newHub(t, Options{DataDir: dir})
	for _, msg := range []string{
		"launched PID 4242 on port 18000: llama-server -hf Qwen/Qwen3-4B-GGUF:Q4_K_M --api-key sk-s3cr3t-key --port 18000",
		"download: https://cas-bridge.xethub.hf.co/xet-bridge/Qwen3-4B-Q4_K_M.gguf?X-Amz-Signature=s1gn3d&X-Amz-Credential=AKIA 45%|####      | 1.1G/2.5G",
		"install: Looking in indexes: https://__token__:pyp1-t0ken@pypi.example.com/simple",
	} {
		h.onEvent(fleet.Event{Level: "info", Subject: "ultra/qwen3-4b", Message: msg})
	}
	secrets := []string{"sk-s3cr3t-key", "s1gn3d", "AKIA", "pyp1-t0ken"}
	kept := []string{"--api-key", "cas-bridge.xethub.hf.co/xet-bridge/Qwen3-4B-Q4_K_M.gguf", "45%", "pypi.example.com/simple"}
	for _, u := range []fleet.User{viewer, operator, admin} {
		outs := map[string]string{}
		for _, args := range [][]string{{"status"}, {"status", "--json"}, {"events"}, {"events", "--json"}} {
			var out, stderr bytes.Buffer
			if code := h.Exec(t.Context(), u, args, nil, &out, &stderr); code != 0 {
				t.Fatalf("%q as %s: exit %d: %s", args, u.Role, code, stderr.String())
			}
			outs[strings.Join(args, " ")] = out.String()
		}
		snap, err := json.Marshal(h.ConsoleSource(u).Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		outs["console snapshot"] = string(snap)
		isAdmin := u.Role == fleet.RoleAdmin
		for what, out := range outs {
			if strings.HasPrefix(what, "status") {
				if shows := strings.Contains(out, dir); shows != isAdmin {
					t.Errorf("%s as %s shows the data dir %s: %v\n%s", what, u.Role, dir, shows, out)
				}
				continue
			}
			for _, secret := range secrets {
				if shows := strings.Contains(out, secret); shows != isAdmin {
					t.Errorf("%s as %s shows %s: %v\n%s", what, u.Role, secret, shows, out)
				}
			}
			for _, k := range kept {
				if !strings.Contains(out, k) {
					t.Errorf("%s as %s hides %q too:\n%s", what, u.Role, k, out)
				}
			}
		}
	}
}
