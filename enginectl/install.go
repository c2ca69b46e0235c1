package enginectl

import (
	"context"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"

	"fleet"
)

// Default install scripts, constants like every script enginectl runs.
// They install into the user's home (no root), where the default binaries
// and nodeScript's PATH look.
const (
	installBrewLlama = `set -e
command -v brew >/dev/null 2>&1 || { echo "Homebrew is not installed on this Mac; install it from https://brew.sh or set install: in the llamacpp recipe" >&2; exit 69; }
brew install llama.cpp`

	installLinuxLlama = `set -e
if command -v brew >/dev/null 2>&1; then exec brew install llama.cpp; fi
echo "no default way to install llama.cpp on this Linux node: build it (https://github.com/ggml-org/llama.cpp) or set install: in the llamacpp recipe" >&2
exit 69`

	// A uv venv keeps vLLM and its torch apart from the system Python; the
	// link puts its entry point where nodeScript's PATH finds it.
	installVLLM = `set -e
if ! command -v uv >/dev/null 2>&1; then
	echo "installing uv (https://astral.sh/uv)"
	curl -LsSf https://astral.sh/uv/install.sh | sh
fi
uv venv --python 3.12 --seed "$HOME/.venv-vllm"
uv pip install --python "$HOME/.venv-vllm/bin/python" vllm --torch-backend=auto
mkdir -p "$HOME/.local/bin"
ln -sf "$HOME/.venv-vllm/bin/vllm" "$HOME/.local/bin/vllm"`

	installVLLMMetal = `set -e
[ "$(uname -m)" = arm64 ] || { echo "vllm-metal needs an Apple Silicon Mac (uname -m says $(uname -m))" >&2; exit 69; }
curl -fsSL https://raw.githubusercontent.com/vllm-project/vllm-metal/main/install.sh | bash`

	installBrewOllama  = `brew install ollama`
	installLinuxOllama = `curl -fsSL https://ollama.com/install.sh | sh`
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

// Installed reports whether cmd's binary (cmd.Bin) is on the node.
func Installed(ctx context.Context, r Runner, cmd Command) (bool, error) {
	if cmd.Bin == "" {
		return false, fmt.Errorf("installed: the command names no binary")
	}
	_, err := runScript(ctx, r, "which", cmd.Bin)
	if err == nil {
		return true, nil
	}
	if code, ok := ExitCode(err); ok && code == 1 {
		return false, nil
	}
	return false, fmt.Errorf("is %s installed: %w", cmd.Bin, err)
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
	ok, err := Installed(ctx, r, cmd)
	if err != nil && cmd.Simulated {
		return fmt.Errorf("simulated engines on node %s run from the fleet binary %s, which the node's user cannot use (%w); "+
			"let that user reach it (the hub's data dir is private: chmod o+x each directory on the way) or reach the node as the hub's own user",
			spec.Node.Name, cmd.Bin, err)
	}
	if err != nil {
		return err
	}
	name := path.Base(cmd.Bin)
	if ok {
		fmt.Fprintf(progress, "%s is installed on %s\n", name, spec.Node.Name)
		return nil
	}
	if cmd.Simulated {
		return fmt.Errorf("the fleet binary %s is not on node %s; simulated engines run from it", cmd.Bin, spec.Node.Name)
	}
	script, err := InstallCommand(spec)
	if err != nil {
		return err
	}
	// The script itself goes to the log, not into progress: progress is the
	// installer's own output, which callers read percentages from.
	o.logger.Info("installing engine", "node", spec.Node.Name, "engine", spec.Engine, "bin", cmd.Bin, "command", firstLine(script))
	fmt.Fprintf(progress, "installing %s on %s\n", name, spec.Node.Name)
	// One writer for both streams: installers interleave them, and a
	// progress log reads best in the order things happened.
	w := &lockedWriter{w: progress}
	err = r.Run(ctx, []string{"sh", "-c", script}, nil, w, w)
	w.endLine()
	if err != nil {
		return fmt.Errorf("installing %s on node %s failed (its output is in the node's event log): %w", name, spec.Node.Name, err)
	}
	ok, err = Installed(ctx, r, cmd)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("the installer for %s on node %s finished, but %s is still not found; set bin: in the recipe to where it installed", name, spec.Node.Name, cmd.Bin)
	}
	fmt.Fprintf(progress, "%s installed on %s\n", name, spec.Node.Name)
	return nil
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
