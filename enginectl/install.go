package enginectl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"fleet"
)

// Default install scripts, constants like every script enginectl runs.
// They run in node.sh's environment (its install operation), whose PATH has
// both Homebrew prefixes and ~/.local/bin, and each one may run again after a
// failure: what an earlier run put in place (uv, the venv) is used, not
// installed twice. What cannot work unattended (a password for sudo, a
// missing compiler) is refused up front, saying what to do.
const (
	installBrewLlama = `set -e
command -v brew >/dev/null 2>&1 || { echo "Homebrew is not installed on this Mac (no brew in /opt/homebrew/bin or /usr/local/bin); install it from https://brew.sh or set install: in the llamacpp recipe" >&2; exit 69; }
brew install llama.cpp`

	installLinuxLlama = `set -e
if command -v brew >/dev/null 2>&1; then exec brew install llama.cpp; fi
echo "no default way to install llama.cpp on this Linux node: build it (https://github.com/ggml-org/llama.cpp) or set install: in the llamacpp recipe" >&2
exit 69`

	// A uv venv keeps vLLM and its torch apart from the system Python; the
	// link puts its entry point on the node's PATH. uv's installer puts uv
	// in ~/.local/bin and edits only the shell profiles, which this
	// environment already has on its PATH.
	// Install checks for a C compiler before it runs this (checkCompiler).
	installVLLM = `set -e
if ! command -v uv >/dev/null 2>&1; then
	command -v curl >/dev/null 2>&1 || { echo "installing vLLM needs uv, and installing uv needs curl, which this node lacks: install curl or uv (https://docs.astral.sh/uv/)" >&2; exit 69; }
	echo "installing uv (https://astral.sh/uv) into ~/.local/bin"
	curl -LsSf https://astral.sh/uv/install.sh | sh
	command -v uv >/dev/null 2>&1 || { echo "the uv installer ran, but there is no uv in ~/.local/bin (or ~/.cargo/bin): install uv by hand (https://docs.astral.sh/uv/) and start the worker again" >&2; exit 69; }
fi
[ -x "$HOME/.venv-vllm/bin/python" ] || uv venv --python 3.12 --seed "$HOME/.venv-vllm"
uv pip install --python "$HOME/.venv-vllm/bin/python" vllm --torch-backend=auto
mkdir -p "$HOME/.local/bin"
ln -sf "$HOME/.venv-vllm/bin/vllm" "$HOME/.local/bin/vllm"`

	installVLLMMetal = `set -e
[ "$(uname -m)" = arm64 ] || { echo "vllm-metal needs an Apple Silicon Mac (uname -m says $(uname -m))" >&2; exit 69; }
curl -fsSL https://raw.githubusercontent.com/vllm-project/vllm-metal/main/install.sh | bash`

	installBrewOllama = `set -e
command -v brew >/dev/null 2>&1 || { echo "Homebrew is not installed on this Mac (no brew in /opt/homebrew/bin or /usr/local/bin); install it from https://brew.sh, or Ollama from https://ollama.com/download, or set install: in the ollama recipe" >&2; exit 69; }
brew install ollama`

	// Ollama's Linux installer needs root: it writes /usr/local and sets up
	// a systemd service, with sudo when not root. A sudo that would ask for
	// a password, which nobody is there to type, is refused before it asks.
	installLinuxOllama = `set -e
if [ "$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then
	echo "Ollama's Linux installer needs root (it installs into /usr/local and sets up a systemd service with sudo), and sudo -n fails on this node (no sudo, or it wants a password, which fleet cannot type): run 'curl -fsSL https://ollama.com/install.sh | sh' on the node yourself, allow this user sudo without a password, or set install: in the ollama recipe" >&2
	exit 77
fi
curl -fsSL https://ollama.com/install.sh | sh`
)

// InstallCommand is the shell command that installs spec's engine on its
// node: the recipe's install:, else the platform's default. It is "" for a
// simulated engine (the fleet binary is all it needs).
func InstallCommand(spec Spec) (string, error) {
	recipe, ok := spec.Model.Recipes[spec.Engine]
	if !ok {
		return "", fmt.Errorf("model %s has no %s recipe; it has recipes for: %s", spec.Model.ID, spec.Engine, recipeList(spec.Model))
	}
	if recipe.Install != "" {
		return recipe.Install, nil
	}
	if _, sim := spec.Node.SimProfile(); sim || spec.Engine == fleet.EngineSim {
		return "", nil
	}
	var p fleet.Platform
	if spec.Node.Platform != nil {
		p = *spec.Node.Platform
	}
	switch spec.Engine {
	case fleet.EngineLlamaCpp:
		if p.OS == "darwin" {
			return installBrewLlama, nil
		}
		return installLinuxLlama, nil
	case fleet.EngineVLLM:
		return installVLLM, nil
	case fleet.EngineVLLMMetal:
		return installVLLMMetal, nil
	case fleet.EngineOllama:
		if p.OS == "darwin" {
			return installBrewOllama, nil
		}
		return installLinuxOllama, nil
	}
	return "", fmt.Errorf("model %s: no install command for engine %q", spec.Model.ID, spec.Engine)
}

// Locate is where bin is found on the node, "" when nowhere: bin itself when
// it is a path, else the first on the node's PATH (both Homebrew prefixes and
// ~/.local/bin included), else one in the usual virtual environments off PATH
// (~/.venv*, conda and miniforge envs), which Start then runs.
func Locate(ctx context.Context, r Runner, bin string) (string, error) {
	if bin == "" {
		return "", fmt.Errorf("locate: the command names no binary")
	}
	out, err := runScript(ctx, r, "which", bin)
	if err == nil {
		return strings.TrimSpace(string(out)), nil
	}
	if code, ok := ExitCode(err); ok && code == 1 {
		return "", nil
	}
	return "", fmt.Errorf("is %s installed: %w", bin, err)
}

// LocateEngines is where each engine that can run on p is found on the
// node, by its default binary (see Locate); engines not found are absent.
func LocateEngines(ctx context.Context, r Runner, p fleet.Platform) (map[fleet.EngineKind]string, error) {
	var kinds []fleet.EngineKind
	var bins []string
	for _, k := range []fleet.EngineKind{fleet.EngineLlamaCpp, fleet.EngineVLLM, fleet.EngineVLLMMetal, fleet.EngineOllama} {
		// EngineFor says whether k can run on p, for a model with a k recipe.
		if _, err := EngineFor(p, fleet.Model{Recipes: map[fleet.EngineKind]fleet.Recipe{k: {}}}, k); err == nil {
			kinds, bins = append(kinds, k), append(bins, defaultBin(k))
		}
	}
	out, err := runScript(ctx, r, "whichall", bins...)
	if err != nil {
		return nil, fmt.Errorf("looking for engines on the node: %w", err)
	}
	found := map[fleet.EngineKind]string{}
	lines := strings.Split(string(out), "\n")
	for i, k := range kinds {
		if i < len(lines) && lines[i] != "" {
			found[k] = lines[i]
		}
	}
	return found, nil
}

// defaultBin is the binary an engine's recipe runs when it sets no bin:.
func defaultBin(k fleet.EngineKind) string {
	switch k {
	case fleet.EngineVLLM:
		return defaultVLLMBin
	case fleet.EngineVLLMMetal:
		return defaultVLLMMetalBin
	case fleet.EngineOllama:
		return defaultOllamaBin
	}
	return defaultLlamaBin
}

// Install makes spec's engine present on its node, streaming the
// installer's output to progress (nil discards it). It does nothing when
// the binary is already there, so it is safe to call before every launch.
// A recipe's install: is an operator-written shell command and runs as
// `sh -c` on the node.
func Install(ctx context.Context, r Runner, spec Spec, progress io.Writer, opts ...Option) error {
	o := applyOptions(opts)
	if progress == nil {
		progress = io.Discard
	}
	cmd, err := BuildCommand(spec)
	if err != nil {
		return err
	}
	where, err := Locate(ctx, r, cmd.Bin)
	if err != nil && cmd.Simulated {
		return fmt.Errorf("simulated engines on node %s run from the fleet binary %s, which the node's user cannot use (%w); "+
			"let that user reach it (the hub's data dir is private: chmod o+x each directory on the way) or reach the node as the hub's own user",
			spec.Node.Name, cmd.Bin, err)
	}
	if err != nil {
		return err
	}
	name := path.Base(cmd.Bin)
	if where != "" {
		fmt.Fprintf(progress, "%s is installed on %s: %s\n", name, spec.Node.Name, where)
		return nil
	}
	if cmd.Simulated {
		return fmt.Errorf("the fleet binary %s is not on node %s; simulated engines run from it", cmd.Bin, spec.Node.Name)
	}
	script, err := InstallCommand(spec)
	if err != nil {
		return err
	}
	if spec.Engine == fleet.EngineVLLM {
		// Start would refuse the engine: install nothing for it.
		if err := checkCompiler(ctx, r, spec.Node.Name); err != nil {
			return err
		}
	}
	// The script itself goes to the log, not into progress: progress is the
	// installer's own output, which callers read percentages from.
	o.logger.Info("installing engine", "node", spec.Node.Name, "engine", spec.Engine, "bin", cmd.Bin, "command", firstLine(script))
	fmt.Fprintf(progress, "installing %s on %s\n", name, spec.Node.Name)
	// One writer for both streams: installers interleave them, and a
	// progress log reads best in the order things happened.
	w := &lockedWriter{w: progress}
	sudo := &sudoPrompt{}
	out := io.MultiWriter(w, sudo)
	err = r.Run(ctx, []string{"sh", "-c", nodeScript, "fleet-enginectl", "install", script}, nil, out, out)
	w.endLine()
	if err != nil {
		if sudo.asked {
			return fmt.Errorf("installing %s on node %s failed: its installer asked sudo for a password, which fleet cannot type; run the installer on the node yourself, allow this user sudo without a password, or set install: in the recipe: %w", name, spec.Node.Name, err)
		}
		return fmt.Errorf("installing %s on node %s failed (its output is in the node's event log): %w", name, spec.Node.Name, err)
	}
	where, err = Locate(ctx, r, cmd.Bin)
	if err != nil {
		return err
	}
	if where == "" {
		return fmt.Errorf("the installer for %s on node %s finished, but %s is still not found; set bin: in the recipe to where it installed", name, spec.Node.Name, cmd.Bin)
	}
	fmt.Fprintf(progress, "%s installed on %s: %s\n", name, spec.Node.Name, where)
	return nil
}

// sudoPrompt notices sudo failing for want of a password in an installer's
// output: without a terminal, sudo says "a terminal is required to read the
// password" (or, with -n, "a password is required").
type sudoPrompt struct {
	mu    sync.Mutex
	tail  []byte
	asked bool
}

func (s *sudoPrompt) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A message split over two writes is still seen whole.
	s.tail = append(s.tail, p...)
	if bytes.Contains(s.tail, []byte("sudo: a terminal is required")) || bytes.Contains(s.tail, []byte("sudo: a password is required")) {
		s.asked = true
	}
	if n := len(s.tail); n > 256 {
		s.tail = append(s.tail[:0], s.tail[n-256:]...)
	}
	return len(p), nil
}

func firstLine(s string) string {
	for line := range strings.Lines(s) {
		if t := strings.TrimSpace(line); t != "" && t != "set -e" {
			return t
		}
	}
	return s
}

// percent matches the figures installers print as they download: curl's
// "###### 45.2%", pip and uv bars, brew's curl.
var percent = regexp.MustCompile(`(?:^|[^0-9.])([0-9]{1,3}(?:\.[0-9]+)?)\s?%`)

// ProgressPercent reads a completion figure (0-100) from one line of an
// installer's output, for a progress display; ok is false when the line
// has none. The last figure on the line wins (bars redraw in place).
func ProgressPercent(line string) (pct float64, ok bool) {
	ms := percent.FindAllStringSubmatch(line, -1)
	for i := len(ms) - 1; i >= 0; i-- {
		v, err := strconv.ParseFloat(ms[i][1], 64)
		if err == nil && v >= 0 && v <= 100 {
			return v, true
		}
	}
	return 0, false
}
