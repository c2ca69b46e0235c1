package enginectl

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/nodeland"
)

// The tests here run enginectl's node script and the default installers in
// a node's userland (internal/nodeland): a Mac's, with sshd's PATH there,
// or a stock Linux box's.

var (
	macPlatform   = &fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max"}
	linuxPlatform = &fleet.Platform{OS: "linux", Arch: "amd64", GPUs: []fleet.GPU{{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288, MemFreeMiB: 12000}}}
)

// landSpec is the default recipe of engine (no bin:, no install:) on a node
// of platform p, its files in the node's ~/.fleet.
func landSpec(p *fleet.Platform, engine fleet.EngineKind, port int) Spec {
	model := "Qwen3-4B-Q4_K_M.gguf"
	if engine == fleet.EngineVLLM {
		model = "Qwen/Qwen3-4B"
	}
	return Spec{
		Node:   fleet.Node{Name: "node", Address: "ops@node", Platform: p},
		Model:  fleet.Model{ID: "qwen3-4b", Context: 8192, Recipes: map[fleet.EngineKind]fleet.Recipe{engine: {Model: model}}},
		Engine: engine,
		Port:   port,
	}
}

// On a Mac whose Homebrew is in /opt/homebrew, which sshd's PATH lacks, the
// default llama.cpp install finds brew, installs once, and the engine is
// found where brew linked it; a second install installs nothing.
func TestLandMacDefaultLlamaInstall(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Mac, BrewPrefix: "/opt/homebrew",
		Formulae: []nodeland.Formula{{Name: "llama.cpp", Bin: "llama-server", From: fakeEngine}}})
	spec := landSpec(macPlatform, fleet.EngineLlamaCpp, 18000)
	for run := 1; run <= 2; run++ {
		var progress bytes.Buffer
		if err := Install(testCtx(t), land, spec, &progress); err != nil {
			t.Fatalf("install %d: %v\n%s", run, err, progress.String())
		}
		if !strings.Contains(progress.String(), "/opt/homebrew/bin/llama-server") {
			t.Errorf("install %d does not say where llama-server is:\n%s", run, progress.String())
		}
		if got := land.Installs(); !slices.Equal(got, []string{"brew install llama.cpp"}) {
			t.Errorf("after install %d the node saw installs %q, want brew install llama.cpp once", run, got)
		}
	}
	found, err := LocateEngines(testCtx(t), land, *macPlatform)
	if want := map[fleet.EngineKind]string{fleet.EngineLlamaCpp: "/opt/homebrew/bin/llama-server"}; err != nil || !maps.Equal(found, want) {
		t.Errorf("LocateEngines = %v, %v; want %v", found, err, want)
	}
}

// The Ollama default install on the same Mac finds brew too (before, it
// exited 127).
func TestLandMacDefaultOllamaInstall(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Mac, BrewPrefix: "/opt/homebrew",
		Formulae: []nodeland.Formula{{Name: "ollama", Bin: "ollama", From: fakeEngine}}})
	spec := landSpec(macPlatform, fleet.EngineOllama, 18000)
	spec.Model.Recipes = map[fleet.EngineKind]fleet.Recipe{fleet.EngineOllama: {Model: "qwen3:4b"}}
	var progress bytes.Buffer
	if err := Install(testCtx(t), land, spec, &progress); err != nil {
		t.Fatalf("install: %v\n%s", err, progress.String())
	}
	if got := land.Installs(); !slices.Equal(got, []string{"brew install ollama"}) {
		t.Errorf("the node saw installs %q, want brew install ollama once", got)
	}
}

// An Intel Mac's Homebrew is in /usr/local, also off sshd's PATH.
func TestLandIntelMacHomebrew(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Mac, BrewPrefix: "/usr/local",
		Formulae: []nodeland.Formula{{Name: "llama.cpp", Bin: "llama-server", From: fakeEngine}}})
	var progress bytes.Buffer
	if err := Install(testCtx(t), land, landSpec(&fleet.Platform{OS: "darwin", Arch: "amd64"}, fleet.EngineLlamaCpp, 18000), &progress); err != nil {
		t.Fatalf("install: %v\n%s", err, progress.String())
	}
	if !strings.Contains(progress.String(), "/usr/local/bin/llama-server") {
		t.Errorf("install does not say llama-server is in /usr/local/bin:\n%s", progress.String())
	}
}

// A Mac without Homebrew is told to install it.
func TestLandMacWithoutHomebrew(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Mac})
	var progress bytes.Buffer
	err := Install(testCtx(t), land, landSpec(macPlatform, fleet.EngineLlamaCpp, 18000), &progress)
	if err == nil || !strings.Contains(progress.String(), "https://brew.sh") {
		t.Fatalf("install = %v; want a failure that says to install Homebrew:\n%s", err, progress.String())
	}
}

// On a Linux box without uv, with sshd's PATH, the default vLLM install
// installs uv (which, as the real installer, only edits the profiles), then
// uses it at once; the engine is found; a second install installs nothing.
func TestLandLinuxDefaultVLLMInstall(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux,
		Packages: []nodeland.Package{{Name: "vllm", Bin: "vllm", From: fakeEngine}}})
	spec := landSpec(linuxPlatform, fleet.EngineVLLM, 18000)
	want := []string{"uv installer", "uv venv " + land.Home + "/.venv-vllm", "uv pip install vllm"}
	for run := 1; run <= 2; run++ {
		var progress bytes.Buffer
		if err := Install(testCtx(t), land, spec, &progress); err != nil {
			t.Fatalf("install %d: %v\n%s", run, err, progress.String())
		}
		if !strings.Contains(progress.String(), land.Home+"/.local/bin/vllm") {
			t.Errorf("install %d does not say where vllm is:\n%s", run, progress.String())
		}
		if got := land.Installs(); !slices.Equal(got, want) {
			t.Errorf("after install %d the node saw installs %q, want %q", run, got, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(land.Home, ".profile")); err != nil || !strings.Contains(string(b), ".local/bin/env") {
		t.Errorf("the uv installer stand-in did not edit ~/.profile as the real one does: %q, %v", b, err)
	}
}

// The vLLM installer run again after a failure half way (as a retried
// install does) uses the uv and the venv the first run made.
func TestLandVLLMInstallerRerun(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux,
		Packages: []nodeland.Package{{Name: "vllm", Bin: "vllm", From: fakeEngine}}})
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		if err := land.Run(testCtx(t), []string{"sh", "-c", nodeScript, "fleet-enginectl", "install", installVLLM}, nil, &out, &out); err != nil {
			t.Fatalf("installer run %d: %v\n%s", run, err, out.String())
		}
	}
	want := []string{"uv installer", "uv venv " + land.Home + "/.venv-vllm", "uv pip install vllm"}
	if got := land.Installs(); !slices.Equal(got, want) {
		t.Errorf("two runs of the installer made installs %q, want %q", got, want)
	}
}

// A vLLM already in a venv off PATH is found, not installed again, and
// started from there.
func TestLandFindsVLLMInVenv(t *testing.T) {
	land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux})
	venv := filepath.Join(land.Home, ".venv", "bin", "vllm")
	if err := copyFile(fakeEngine, venv); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	spec := landSpec(linuxPlatform, fleet.EngineVLLM, port)
	var progress bytes.Buffer
	if err := Install(testCtx(t), land, spec, &progress); err != nil {
		t.Fatalf("install: %v\n%s", err, progress.String())
	}
	if !strings.Contains(progress.String(), "is installed on node: "+venv) || land.Installs() != nil {
		t.Errorf("install did not use the vLLM in %s (installs %q):\n%s", venv, land.Installs(), progress.String())
	}
	found, err := LocateEngines(testCtx(t), land, *linuxPlatform)
	if want := map[fleet.EngineKind]string{fleet.EngineVLLM: venv}; err != nil || !maps.Equal(found, want) {
		t.Errorf("LocateEngines = %v, %v; want %v", found, err, want)
	}
	p, _ := startEngine(t, land, spec)
	if err := WaitReady(testCtx(t), land, port, p, spec.Engine, fast...); err != nil {
		t.Fatalf("the engine found in the venv did not come up: %v", err)
	}
}

// What cannot work unattended is refused before it starts, saying why.
func TestLandRefusals(t *testing.T) {
	t.Run("vLLM without a C compiler", func(t *testing.T) {
		land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux, Hide: []string{"cc", "gcc", "clang"},
			Packages: []nodeland.Package{{Name: "vllm", Bin: "vllm", From: fakeEngine}}})
		var progress bytes.Buffer
		err := Install(testCtx(t), land, landSpec(linuxPlatform, fleet.EngineVLLM, 18000), &progress)
		if err == nil || !strings.Contains(err.Error(), "needs a C compiler") || land.Installs() != nil {
			t.Errorf("install = %v, installs %q; want a refusal naming the C compiler:\n%s", err, land.Installs(), progress.String())
		}
	})
	t.Run("launching vLLM without a C compiler", func(t *testing.T) {
		land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux, Hide: []string{"cc", "gcc", "clang"}})
		if err := copyFile(fakeEngine, filepath.Join(land.Home, ".venv-vllm", "bin", "vllm")); err != nil {
			t.Fatal(err)
		}
		spec := landSpec(linuxPlatform, fleet.EngineVLLM, freePort(t))
		cmd, err := BuildCommand(spec)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Start(testCtx(t), land, spec, cmd)
		if err == nil {
			_ = Stop(testCtx(t), land, p, time.Second, fast...)
		}
		if err == nil || !strings.Contains(err.Error(), "needs a C compiler") {
			t.Errorf("start = %v; want a refusal naming the C compiler", err)
		}
	})
	// A user (uid 501, a Mac's first) whose sudo wants a password, as
	// sudo answers without a terminal.
	sudoer := t.TempDir()
	for name, script := range map[string]string{
		"id":   "#!/bin/sh\n[ \"$1\" = -u ] && echo 501 || echo 'uid=501(ops) gid=20(staff)'\n",
		"sudo": "#!/bin/sh\ncase $1 in -n) echo 'sudo: a password is required' >&2 ;; *) echo 'sudo: a terminal is required to read the password; either use the -S option to read from standard input or configure an askpass helper' >&2 ;; esac\nexit 1\n",
	} {
		if err := os.MkdirAll(filepath.Join(sudoer, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sudoer, "bin", name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("Ollama on Linux without passwordless sudo", func(t *testing.T) {
		land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux, Machine: sudoer})
		spec := landSpec(linuxPlatform, fleet.EngineOllama, 18000)
		spec.Model.Recipes = map[fleet.EngineKind]fleet.Recipe{fleet.EngineOllama: {Model: "qwen3:4b"}}
		var progress bytes.Buffer
		err := Install(testCtx(t), land, spec, &progress)
		if code, _ := ExitCode(err); code != 77 || !strings.Contains(progress.String(), "sudo -n fails on this node") {
			t.Errorf("install = %v; want exit 77 and a refusal that names sudo:\n%s", err, progress.String())
		}
	})
	t.Run("a recipe's installer that asks sudo for a password", func(t *testing.T) {
		land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux, Machine: sudoer})
		spec := landSpec(linuxPlatform, fleet.EngineLlamaCpp, 18000)
		spec.Model.Recipes[fleet.EngineLlamaCpp] = fleet.Recipe{Model: "m.gguf", Install: "sudo apt-get install -y llama.cpp"}
		err := Install(testCtx(t), land, spec, nil)
		if err == nil || !strings.Contains(err.Error(), "asked sudo for a password, which fleet cannot type") {
			t.Errorf("install = %v; want an error that says sudo wanted a password", err)
		}
	})
	t.Run("detaching with none of setsid, perl, bash, python3", func(t *testing.T) {
		land := nodeland.New(t, nodeland.Options{Kind: nodeland.Linux, Hide: []string{"setsid", "perl", "python3"}})
		spec := landSpec(linuxPlatform, fleet.EngineLlamaCpp, freePort(t))
		r := spec.Model.Recipes[fleet.EngineLlamaCpp]
		r.Bin = fakeEngine
		spec.Model.Recipes[fleet.EngineLlamaCpp] = r
		cmd, err := BuildCommand(spec)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Start(testCtx(t), land, spec, cmd)
		if err == nil || !strings.Contains(err.Error(), "cannot detach the engine") || !strings.Contains(err.Error(), "xcode-select --install") {
			t.Errorf("start = %v; want a refusal that says what to install", err)
		}
	})
}

// node.sh's whole lifecycle on each userland: launch, logs, adopt, a stale
// engine of ours on the port, stop.
func TestLandLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    nodeland.Options
		p    *fleet.Platform
	}{
		{"mac", nodeland.Options{Kind: nodeland.Mac, BrewPrefix: "/opt/homebrew"}, macPlatform},
		// A Mac whose perl is gone: bash's job control detaches.
		{"mac without perl", nodeland.Options{Kind: nodeland.Mac, BrewPrefix: "/opt/homebrew", Hide: []string{"perl"}}, macPlatform},
		{"linux", nodeland.Options{Kind: nodeland.Linux}, linuxPlatform},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Formulae = []nodeland.Formula{{Name: "llama.cpp", Bin: "llama-server", From: fakeEngine}}
			land := nodeland.New(t, tc.o)
			// The engine as its installer leaves it: Homebrew's on the Mac,
			// ~/.local/bin on Linux; either is off sshd's PATH.
			bin := "/opt/homebrew/bin/llama-server"
			if tc.o.Kind == nodeland.Linux {
				bin = filepath.Join(land.Home, ".local", "bin", "llama-server")
				if err := copyFile(fakeEngine, bin); err != nil {
					t.Fatal(err)
				}
			} else if err := land.Run(testCtx(t), []string{"/opt/homebrew/bin/brew", "install", "llama.cpp"}, nil, nil, nil); err != nil {
				t.Fatal(err)
			}
			port := freePort(t)
			spec := landSpec(tc.p, fleet.EngineLlamaCpp, port)
			p, cmd := startEngine(t, land, spec)
			if err := WaitReady(testCtx(t), land, port, p, spec.Engine, fast...); err != nil {
				t.Fatalf("not ready: %v", err)
			}
			if where, err := Locate(testCtx(t), land, cmd.Bin); err != nil || where != bin {
				t.Errorf("Locate(%s) = %q, %v; want %s", cmd.Bin, where, err, bin)
			}
			if members, err := groupMembers(testCtx(t), land, p.PGID); err != nil || !slices.Contains(members, p.PID) {
				t.Errorf("the engine's group %d has members %v (%v); want the engine %d, leading it", p.PGID, members, err, p.PID)
			}
			if tail, err := LogTailBytes(testCtx(t), land, p, 4096); err != nil || len(tail) == 0 {
				t.Errorf("log tail = %q, %v; want the engine's output", tail, err)
			}
			// A restarted hub adopts it by its records.
			if ok, err := Adopt(testCtx(t), land, Process{PID: p.PID, PGID: p.PGID, PIDPath: p.PIDPath}, cmd.LaunchArgv, fast...); err != nil || !ok {
				t.Fatalf("Adopt = %v, %v; want the engine adopted", ok, err)
			}
			// A hub that lost its records finds our stale engine on the port
			// and stops it.
			owner, err := CheckPort(testCtx(t), land, port, cmd.Bin, fast...)
			if err != nil || !owner.Stale || owner.PID != p.PID {
				t.Fatalf("CheckPort = %+v, %v; want PID %d stopped as stale", owner, err, p.PID)
			}
			if alive, err := Alive(testCtx(t), land, p.PID); err != nil || alive {
				t.Fatalf("the stale engine PID %d is alive=%v (%v) after CheckPort", p.PID, alive, err)
			}
			// Launched again, and stopped.
			p, _ = startEngine(t, land, spec)
			if err := WaitReady(testCtx(t), land, port, p, spec.Engine, fast...); err != nil {
				t.Fatalf("not ready after a relaunch: %v", err)
			}
			if err := Stop(testCtx(t), land, p, 5*time.Second, fast...); err != nil {
				t.Fatal(err)
			}
			if members, err := groupMembers(testCtx(t), land, p.PGID); err != nil || len(members) > 0 {
				t.Errorf("after Stop, group %d still has %v (%v)", p.PGID, members, err)
			}
		})
	}
}
