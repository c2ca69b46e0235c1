package enginectl

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"fleet"
)

func TestLocate(t *testing.T) {
	home, _ := os.UserHomeDir()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		bin  string
		want string
	}{
		{fakeEngine, fakeEngine},
		{"sh", sh},
		{"/nonexistent/llama-server", ""},
		{"surely-no-such-engine-binary", ""},
		{"~/surely/not/here/vllm", ""},
	}
	if home != "" {
		// "~/" is the node's home, as in vllm-metal's default binary.
		dir, err := os.MkdirTemp(home, ".enginectl-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := copyFile(fakeEngine, filepath.Join(dir, "vllm")); err != nil {
			t.Fatal(err)
		}
		tests = append(tests, struct {
			bin  string
			want string
		}{"~/" + filepath.Base(dir) + "/vllm", filepath.Join(dir, "vllm")})
	}
	for _, tc := range tests {
		got, err := Locate(testCtx(t), LocalRunner{}, tc.bin)
		if err != nil || got != tc.want {
			t.Errorf("Locate(%q) = %q, %v; want %q", tc.bin, got, err, tc.want)
		}
	}
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "llama-server")
	counter := filepath.Join(dir, "runs")
	// A recipe's install: is the operator's own shell command.
	install := "echo fetching llama.cpp; echo 'a warning' >&2; mkdir -p '" + filepath.Dir(bin) + "' && cp '" + fakeEngine + "' '" + bin + "' && echo run >> '" + counter + "'" +
		" && printf '\\r 50.0%%\\r100.0%%'" // a progress bar's last line, not ended
	spec := testSpec("inst", 18100, dir, bin)
	r := spec.Model.Recipes[fleet.EngineLlamaCpp]
	r.Install = install
	spec.Model.Recipes[fleet.EngineLlamaCpp] = r

	var progress bytes.Buffer
	if err := Install(testCtx(t), LocalRunner{}, spec, &progress); err != nil {
		t.Fatalf("Install: %v\n%s", err, progress.String())
	}
	for _, want := range []string{"installing llama-server on inst", "fetching llama.cpp", "a warning", "100.0%\nllama-server installed on inst"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	progress.Reset()
	if err := Install(testCtx(t), LocalRunner{}, spec, &progress); err != nil {
		t.Fatal(err)
	}
	if runs, _ := os.ReadFile(counter); strings.Count(string(runs), "run") != 1 {
		t.Errorf("the installer ran %d times, want once (idempotent)", strings.Count(string(runs), "run"))
	}
	if !strings.Contains(progress.String(), "llama-server is installed on inst") {
		t.Errorf("second Install said %q", progress.String())
	}
}

func TestInstallFailures(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		install string
		bin     string
		errHas  string
		logHas  string
	}{
		{"installer fails", "echo 'no space left' >&2; exit 3", filepath.Join(dir, "a", "llama-server"), "installing llama-server on node f failed", "no space left"},
		{"installer succeeds but installs nothing", "echo done", filepath.Join(dir, "b", "llama-server"), "still not found; set bin:", "done"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec("f", 18101, dir, tc.bin)
			r := spec.Model.Recipes[fleet.EngineLlamaCpp]
			r.Install = tc.install
			spec.Model.Recipes[fleet.EngineLlamaCpp] = r
			var progress bytes.Buffer
			err := Install(testCtx(t), LocalRunner{}, spec, &progress)
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("Install = %v; want an error containing %q", err, tc.errHas)
			}
			if !strings.Contains(progress.String(), tc.logHas) {
				t.Errorf("progress %q lacks the installer's output %q", progress.String(), tc.logHas)
			}
		})
	}
	// The fleet binary is there, in the hub's private data dir, but the
	// node's user may not reach it: the error says so, not "not on node".
	t.Run("simulated with the fleet binary out of the node user's reach", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to run the node's script as another user (setpriv); tests run as root in CI")
		}
		if _, err := exec.LookPath("setpriv"); err != nil {
			t.Skip("setpriv (util-linux) is not installed")
		}
		open := t.TempDir()
		for _, d := range []string{open, filepath.Dir(open)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		data := filepath.Join(open, "data")
		for _, tc := range []struct {
			name    string
			dirMode os.FileMode
			binMode os.FileMode
			want    string
		}{
			{"private dir", 0o700, 0o755, "cannot be reached by the user nobody: it has no search permission on the directory " + data + " (drwx------ root root)"},
			{"not executable", 0o755, 0o700, "is there but the user nobody has no permission to run it (-rwx------ root root)"},
		} {
			if err := os.MkdirAll(filepath.Join(data, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(data, "bin", "fleet")
			if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), tc.binMode); err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(os.Chmod(bin, tc.binMode), os.Chmod(data, tc.dirMode)); err != nil {
				t.Fatal(err)
			}
			spec := testSpec("rig", 18103, dir, "")
			spec.Node.Address = "sim:m4max-llamacpp"
			spec.FleetBin = bin
			err := Install(testCtx(t), asNobody{}, spec, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "node rig") || strings.Contains(err.Error(), "is not on node") {
				t.Errorf("%s: Install = %v; want it to say %q", tc.name, err, tc.want)
			}
		}
	})
	t.Run("simulated without the fleet binary", func(t *testing.T) {
		spec := testSpec("s", 18102, dir, "")
		spec.Node.Address = "sim:m4max-llamacpp"
		spec.FleetBin = filepath.Join(dir, "no-fleet")
		err := Install(testCtx(t), LocalRunner{}, spec, nil)
		if err == nil || !strings.Contains(err.Error(), "fleet binary") {
			t.Fatalf("Install = %v; want a missing-fleet-binary error", err)
		}
	})
}

func TestInstallCommand(t *testing.T) {
	mac := &fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra"}
	linux := &fleet.Platform{OS: "linux", Arch: "amd64", GPUs: []fleet.GPU{{Name: "NVIDIA GeForce RTX 3060"}}}
	tests := []struct {
		name   string
		p      *fleet.Platform
		addr   string
		engine fleet.EngineKind
		model  fleet.Model
		has    string
	}{
		{"llama.cpp on macOS uses brew", mac, "ops@ultra", fleet.EngineLlamaCpp, qwen(), "brew install llama.cpp"},
		{"llama.cpp on Linux without brew says what to do", linux, "ops@rig", fleet.EngineLlamaCpp, qwen(), "set install: in the llamacpp recipe"},
		{"vLLM on Linux goes into a uv venv", linux, "ops@rig", fleet.EngineVLLM, qwen(), "uv pip install --python \"$HOME/.venv-vllm/bin/python\" vllm"},
		{"vllm-metal uses its installer", mac, "ops@ultra", fleet.EngineVLLMMetal, qwen(), "vllm-metal/main/install.sh"},
		{"ollama on macOS", mac, "ops@ultra", fleet.EngineOllama, qwen(), "brew install ollama"},
		{"ollama on Linux", linux, "ops@rig", fleet.EngineOllama, qwen(), "ollama.com/install.sh"},
		{"recipe install wins", mac, "ops@ultra", fleet.EngineLlamaCpp, withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "m.gguf", Install: "port install llama.cpp"}), "port install llama.cpp"},
		{"simulated nodes install nothing", mac, "sim:m1ultra-llamacpp", fleet.EngineLlamaCpp, qwen(), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := InstallCommand(Spec{Node: fleet.Node{Name: "n", Address: tc.addr, Platform: tc.p}, Model: tc.model, Engine: tc.engine})
			if err != nil {
				t.Fatal(err)
			}
			if tc.has == "" && got != "" || !strings.Contains(got, tc.has) {
				t.Errorf("install command %q; want one containing %q", got, tc.has)
			}
		})
	}
}

func TestProgressPercent(t *testing.T) {
	tests := []struct {
		line string
		want float64
		ok   bool
	}{
		{"######################################## 56.3%", 56.3, true},
		{"\r###                                        5.0%\r#########     21.4%", 21.4, true},
		{"Downloading torch (846.0MiB) 100%", 100, true},
		{"==> Pouring llama.cpp--b6097.arm64_sequoia.bottle.tar.gz", 0, false},
		{"disk 250% full", 0, false},
		{"version 1.2.3%", 0, false},
		{"", 0, false},
	}
	for _, tc := range tests {
		got, ok := ProgressPercent(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ProgressPercent(%q) = %v, %v; want %v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

// asNobody runs a node's commands as the user nobody, as an SSH node's
// user other than the hub's would.
type asNobody struct{ LocalRunner }

func (r asNobody) Run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	return r.LocalRunner.Run(ctx, append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, argv...), stdin, stdout, stderr)
}
