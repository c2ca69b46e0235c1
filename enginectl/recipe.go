package enginectl

import (
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"fleet"
)

// Spec is one engine to run: which model, on which node, with which engine,
// on which port.
type Spec struct {
	// Node must have its Platform set (probed) for EngineFor; BuildCommand
	// reads only its name and address.
	Node   fleet.Node
	Model  fleet.Model
	Engine fleet.EngineKind
	Port   int
	// FleetBin is the path of the fleet binary on the node; simulated
	// engines run as `FleetBin sim …`.
	FleetBin string
	// StateDir holds pid, argv and log files on the node; "" means
	// $HOME/.fleet there. A leading "~/" is the node's home.
	StateDir string
	// SimMimic is the engine a sim profile mimics (the sim package's
	// Profile.Mimic), needed only for the `sim` engine kind. When empty it is
	// read from the profile's name: one containing "vllm" mimics vLLM,
	// anything else llama-server.
	SimMimic fleet.EngineKind
	// Owner is the fleet and launch the engine belongs to; Start hands it
	// to the engine as FLEET_ID and FLEET_LAUNCH, which the argv file on the
	// node records. The zero Owner starts an engine that carries neither.
	Owner Owner
}

// Owner names who launched an engine: the fleet (a random ID its database
// made once) and the serial of the launch, recorded before the start.
type Owner struct {
	FleetID string
	Launch  int64
}

// Command is the exact command line of an engine.
type Command struct {
	// Argv is what the real engine runs: what an operator sees under
	// "Started with". On a simulated node it is the command the real engine
	// would have run.
	Argv []string
	// LaunchArgv is what is really executed: Argv, or `fleet sim …` on a
	// simulated node. Adoption compares a live process against it.
	LaunchArgv []string
	// Env is set for the engine on top of the node's environment.
	Env       map[string]string
	Simulated bool
	// Bin is the program really executed (LaunchArgv[0]): the engine binary,
	// or the fleet binary when simulated. Installed and CheckPort take it.
	Bin string
	// ServedName is the model name the engine's /v1/models must list.
	ServedName string
	// Context is the context length each request may use.
	Context int
	// Slots is how many requests the engine serves at once: the recipe's
	// -np / --max-num-seqs, else the engine's documented default.
	Slots int
}

// Default binaries. vllm-metal's installer puts vLLM in its own venv.
const (
	defaultVLLMBin      = "vllm"
	defaultVLLMMetalBin = "~/.venv-vllm-metal/bin/vllm"
	defaultLlamaBin     = "llama-server"
	defaultOllamaBin    = "ollama"
	// llama-server resolves its automatic -np to 4 slots; we say it
	// explicitly so the router and the "Started with" column agree.
	defaultLlamaSlots  = 4
	defaultOllamaSlots = 4
	// vLLM's OpenAI server defaults --max-num-seqs to 256 on most GPUs; the
	// router needs a figure, and vLLM queues anything beyond its batch itself.
	defaultVLLMSlots = 256
	loopback         = "127.0.0.1"
	allInterfaces    = "0.0.0.0"
)

// ownedFlags are the flags BuildCommand sets itself: a recipe repeating one
// would either be ignored or override ours silently, so it is refused.
var ownedFlags = map[fleet.EngineKind][]string{
	fleet.EngineVLLM:      {"--host", "--port", "--served-model-name", "--max-model-len", "--model"},
	fleet.EngineVLLMMetal: {"--host", "--port", "--served-model-name", "--max-model-len", "--model"},
	fleet.EngineLlamaCpp:  {"--host", "--port", "-m", "--model", "-hf", "-hfr", "--hf-repo", "-a", "--alias", "-c", "--ctx-size"},
}

// EngineFor picks the engine for a model on a node: the pinned one, or the
// platform's default (Linux with NVIDIA GPUs → vLLM, everything else →
// llama.cpp). It fails when the model has no recipe for that engine, or the
// engine cannot run on the platform.
func EngineFor(p fleet.Platform, m fleet.Model, pinned fleet.EngineKind) (fleet.EngineKind, error) {
	if p.OS == "" {
		return "", fmt.Errorf("model %s: the node's platform is not known yet; probe the node first", m.ID)
	}
	engine := pinned
	how := "pinned by the placement"
	if engine == "" {
		engine = p.DefaultEngine()
		how = fmt.Sprintf("the default for %s/%s (%s)", p.HostLabel(), p.Arch, p.GPULabel())
	}
	if !engine.Valid() {
		return "", fmt.Errorf("model %s: unknown engine %q; known engines: %s", m.ID, engine, kindList(fleet.EngineKinds))
	}
	if _, ok := m.Recipes[engine]; !ok {
		return "", fmt.Errorf("model %s has no %s recipe, which is %s; it has recipes for: %s; add a %s recipe or pin one of those engines",
			m.ID, engine, how, recipeList(m), engine)
	}
	switch engine {
	case fleet.EngineVLLM:
		if p.OS != "linux" {
			return "", fmt.Errorf("model %s: vllm needs Linux (with NVIDIA GPUs); this node runs %s: use llamacpp or vllm-metal", m.ID, p.HostLabel())
		}
	case fleet.EngineVLLMMetal:
		if !p.AppleSilicon() {
			return "", fmt.Errorf("model %s: vllm-metal needs an Apple Silicon Mac; this node is %s %s", m.ID, p.HostLabel(), p.Arch)
		}
	}
	return engine, nil
}

func recipeList(m fleet.Model) string {
	if len(m.Recipes) == 0 {
		return "none"
	}
	return kindList(slices.Sorted(maps.Keys(m.Recipes)))
}

func kindList(ks []fleet.EngineKind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// BuildCommand turns a model's recipe for spec.Engine into the exact argv and
// environment. Engines bind 127.0.0.1 (every interface only for a node
// with `endpoint: direct`) and get the port, the served name and the context
// from fleet, never from the recipe.
//
// llama-server: fleet passes --kv-unified (unless the recipe says
// --no-kv-unified), so every slot may use the model's full context and the
// slots share one KV pool of that size: memory stays what the model row
// promises. With --no-kv-unified llama-server would divide -c among the
// slots, so -c becomes context × slots instead.
func BuildCommand(spec Spec) (Command, error) {
	m := spec.Model
	if m.ID == "" {
		return Command{}, fmt.Errorf("build command: the model has no id")
	}
	if spec.Port < 1 || spec.Port > 65535 {
		return Command{}, fmt.Errorf("model %s: port %d is not a TCP port (1-65535)", m.ID, spec.Port)
	}
	if m.Context <= 0 {
		return Command{}, fmt.Errorf("model %s has no context length; set context: in the fleet file", m.ID)
	}
	if !spec.Engine.Valid() {
		return Command{}, fmt.Errorf("model %s: unknown engine %q; known engines: %s", m.ID, spec.Engine, kindList(fleet.EngineKinds))
	}
	recipe, ok := m.Recipes[spec.Engine]
	if !ok {
		return Command{}, fmt.Errorf("model %s has no %s recipe; it has recipes for: %s", m.ID, spec.Engine, recipeList(m))
	}
	for k := range recipe.Env {
		if !envKey.MatchString(k) {
			return Command{}, fmt.Errorf("model %s: recipe %s: env name %q is not a valid variable name (letters, digits, underscore)", m.ID, spec.Engine, k)
		}
	}

	profile, simNode := spec.Node.SimProfile()
	if !simNode {
		profile = "" // SimProfile hands back the whole address when it is not sim:
	}
	if simNode && profile == "" {
		return Command{}, fmt.Errorf("node %s: address %q names no sim profile (sim:PROFILE)", spec.Node.Name, spec.Node.Address)
	}
	simulated := simNode
	engine := spec.Engine
	if engine == fleet.EngineSim {
		simulated = true
		if recipe.Profile != "" {
			profile = recipe.Profile
		}
		if profile == "" {
			return Command{}, fmt.Errorf("model %s: recipe sim names no profile; set profile: (e.g. m4max-llamacpp)", m.ID)
		}
		engine = mimicOf(spec.SimMimic, profile)
		if recipe.Model == "" {
			recipe.Model = m.ID // a pure simulation has no weights of its own
		}
	}

	// The engine listens on its node's loopback, reached through the hub's
	// SSH connection, unless the fleet file asked the router to dial the
	// node directly: then it must listen where the router can reach it.
	host := loopback
	if spec.Node.DialsDirect() {
		host = allInterfaces
	}
	var cmd Command
	var err error
	switch engine {
	case fleet.EngineVLLM, fleet.EngineVLLMMetal:
		cmd, err = vllmCommand(engine, m, recipe, host, spec.Port)
	case fleet.EngineLlamaCpp:
		cmd, err = llamaCommand(m, recipe, host, spec.Port)
	case fleet.EngineOllama:
		if simulated {
			return Command{}, fmt.Errorf("model %s: the simulator mimics vllm and llamacpp only, not ollama; pin one of those on simulated node %s", m.ID, spec.Node.Name)
		}
		cmd, err = ollamaCommand(m, recipe, host, spec.Port)
	default:
		err = fmt.Errorf("model %s: sim profile %q mimics %q, which the simulator does not run", m.ID, profile, engine)
	}
	if err != nil {
		return Command{}, err
	}

	cmd.Simulated = simulated
	if simulated {
		if spec.FleetBin == "" {
			return Command{}, fmt.Errorf("model %s: simulated engine needs the path of the fleet binary on node %s (Spec.FleetBin)", m.ID, spec.Node.Name)
		}
		mimic := "llamacpp"
		if engine == fleet.EngineVLLM || engine == fleet.EngineVLLMMetal {
			mimic = "vllm"
		}
		cmd.LaunchArgv = append([]string{spec.FleetBin, "sim", "--mimic", mimic, "--profile", profile, "--"}, cmd.Argv[1:]...)
	} else {
		cmd.LaunchArgv = slices.Clone(cmd.Argv)
	}
	cmd.Bin = cmd.LaunchArgv[0]
	return cmd, nil
}

// ServedName is the model name an engine of kind engine answers to for m:
// the model ID (vLLM --served-model-name, llama-server -a), or the Ollama
// tag, which Ollama serves under its own name. The router rewrites request
// bodies to it, and checks probe engines with it.
func ServedName(m fleet.Model, engine fleet.EngineKind) string {
	if engine == fleet.EngineOllama {
		if r, ok := m.Recipes[engine]; ok && r.Model != "" {
			return r.Model
		}
	}
	return m.ID
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func mimicOf(set fleet.EngineKind, profile string) fleet.EngineKind {
	if set != "" {
		return set
	}
	if strings.Contains(profile, "vllm") {
		return fleet.EngineVLLM
	}
	return fleet.EngineLlamaCpp
}

func checkOwned(engine fleet.EngineKind, m fleet.Model, args []string) error {
	if _, name := OwnedFlag(engine, args); name != "" {
		return fmt.Errorf("model %s: recipe %s passes %s, which fleet sets itself (host, port, served name, context come from the fleet file); remove it from args", m.ID, engine, name)
	}
	return nil
}

// OwnedFlag is the first of a recipe's args that is a flag fleet sets
// itself for engine, with its index; "" when there is none.
func OwnedFlag(engine fleet.EngineKind, args []string) (int, string) {
	for i, a := range args {
		if name := flagName(a); name != "" && slices.Contains(ownedFlags[engine], name) {
			return i, name
		}
	}
	return -1, ""
}

// flagName is "--port" for "--port" and "--port=8000"; "" for a value.
func flagName(arg string) string {
	if len(arg) < 2 || arg[0] != '-' {
		return ""
	}
	if _, err := strconv.ParseFloat(arg, 64); err == nil {
		return "" // a negative number is a value
	}
	name, _, _ := strings.Cut(arg, "=")
	return name
}

// flagValue finds the value of the last occurrence of any of names.
func flagValue(args []string, names ...string) (string, bool) {
	val, found := "", false
	for i, a := range args {
		name := flagName(a)
		if !slices.Contains(names, name) {
			continue
		}
		if _, v, ok := strings.Cut(a, "="); ok {
			val, found = v, true
		} else if i+1 < len(args) {
			val, found = args[i+1], true
		}
	}
	return val, found
}

func hasFlag(args []string, names ...string) bool {
	for _, a := range args {
		if slices.Contains(names, flagName(a)) {
			return true
		}
	}
	return false
}

func vllmCommand(engine fleet.EngineKind, m fleet.Model, r fleet.Recipe, host string, port int) (Command, error) {
	if r.Model == "" {
		return Command{}, fmt.Errorf("model %s: recipe %s names no weights; set model: to a Hugging Face repo or a local path", m.ID, engine)
	}
	if err := checkOwned(engine, m, r.Args); err != nil {
		return Command{}, err
	}
	if engine == fleet.EngineVLLMMetal {
		if tp, ok := flagValue(r.Args, "--tensor-parallel-size", "-tp"); ok && tp != "1" {
			return Command{}, fmt.Errorf("model %s: recipe vllm-metal asks for --tensor-parallel-size %s, but Metal has no tensor parallelism; remove it", m.ID, tp)
		}
	}
	bin := r.Bin
	if bin == "" {
		bin = defaultVLLMBin
		if engine == fleet.EngineVLLMMetal {
			bin = defaultVLLMMetalBin
		}
	}
	argv := []string{bin, "serve", r.Model,
		"--served-model-name", m.ID,
		"--max-model-len", strconv.Itoa(m.Context),
		"--host", host,
		"--port", strconv.Itoa(port)}
	// Never add --quantization: vLLM picks the fast awq_marlin kernel for AWQ
	// checkpoints by itself, and forcing "awq" is ~5× slower. A recipe that
	// passes it anyway is kept as written.
	argv = append(argv, r.Args...)
	slots := defaultVLLMSlots
	if v, ok := flagValue(r.Args, "--max-num-seqs"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return Command{}, fmt.Errorf("model %s: recipe %s: --max-num-seqs %q is not a positive number", m.ID, engine, v)
		}
		slots = n
	}
	return Command{Argv: argv, Env: maps.Clone(r.Env), ServedName: ServedName(m, engine), Context: m.Context, Slots: slots}, nil
}

// hfRef matches a Hugging Face "owner/repo" with an optional ":quant".
var hfRef = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)?$`)

func llamaCommand(m fleet.Model, r fleet.Recipe, host string, port int) (Command, error) {
	if r.Model == "" {
		return Command{}, fmt.Errorf("model %s: recipe llamacpp names no weights; set model: to a .gguf path or repo:quant", m.ID)
	}
	if err := checkOwned(fleet.EngineLlamaCpp, m, r.Args); err != nil {
		return Command{}, err
	}
	bin := r.Bin
	if bin == "" {
		bin = defaultLlamaBin
	}
	weights := []string{"-m", r.Model}
	if isHFRef(r.Model) {
		weights = []string{"-hf", r.Model}
	}

	slots := defaultLlamaSlots
	recipeSlots := false
	if v, ok := flagValue(r.Args, "-np", "--parallel"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			return Command{}, fmt.Errorf("model %s: recipe llamacpp: -np %q is not a slot count (a positive number, or -1 for auto)", m.ID, v)
		}
		if n > 0 {
			slots = n
		}
		recipeSlots = true
	}
	unified := !hasFlag(r.Args, "--no-kv-unified", "-no-kvu")
	ctx := m.Context
	if !unified {
		ctx = m.Context * slots // llama-server divides -c among slots
	}

	argv := append([]string{bin}, weights...)
	argv = append(argv, "-a", m.ID, "-c", strconv.Itoa(ctx), "--host", host, "--port", strconv.Itoa(port))
	if !recipeSlots {
		argv = append(argv, "-np", strconv.Itoa(slots))
	}
	if unified && !hasFlag(r.Args, "--kv-unified", "-kvu") {
		argv = append(argv, "--kv-unified")
	}
	argv = append(argv, r.Args...)
	return Command{Argv: argv, Env: maps.Clone(r.Env), ServedName: ServedName(m, fleet.EngineLlamaCpp), Context: m.Context, Slots: slots}, nil
}

// isHFRef tells "Qwen/Qwen3-4B-GGUF:Q4_K_M" (download) from a file path.
func isHFRef(w string) bool {
	if strings.HasPrefix(w, "/") || strings.HasPrefix(w, "~") || strings.HasPrefix(w, ".") {
		return false
	}
	if strings.HasSuffix(strings.ToLower(w), ".gguf") {
		return false
	}
	return hfRef.MatchString(w)
}

var ollamaOwnedEnv = []string{"OLLAMA_HOST", "OLLAMA_CONTEXT_LENGTH"}

func ollamaCommand(m fleet.Model, r fleet.Recipe, host string, port int) (Command, error) {
	if r.Model == "" {
		return Command{}, fmt.Errorf("model %s: recipe ollama names no model; set model: to the Ollama tag (e.g. qwen3:4b)", m.ID)
	}
	if len(r.Args) > 0 {
		return Command{}, fmt.Errorf("model %s: recipe ollama has args %q, but `ollama serve` takes none; use env: (OLLAMA_*) instead", m.ID, r.Args)
	}
	for _, k := range ollamaOwnedEnv {
		if _, ok := r.Env[k]; ok {
			return Command{}, fmt.Errorf("model %s: recipe ollama sets %s, which fleet sets itself from the port and context; remove it from env", m.ID, k)
		}
	}
	bin := r.Bin
	if bin == "" {
		bin = defaultOllamaBin
	}
	env := maps.Clone(r.Env)
	if env == nil {
		env = map[string]string{}
	}
	slots := defaultOllamaSlots
	if v, ok := env["OLLAMA_NUM_PARALLEL"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return Command{}, fmt.Errorf("model %s: recipe ollama: OLLAMA_NUM_PARALLEL %q is not a positive number", m.ID, v)
		}
		slots = n
	}
	env["OLLAMA_HOST"] = net.JoinHostPort(host, strconv.Itoa(port))
	env["OLLAMA_CONTEXT_LENGTH"] = strconv.Itoa(m.Context)
	env["OLLAMA_NUM_PARALLEL"] = strconv.Itoa(slots)
	// Ollama answers to its own tag, so that is the name /v1/models lists.
	return Command{Argv: []string{bin, "serve"}, Env: env, ServedName: ServedName(m, fleet.EngineOllama), Context: m.Context, Slots: slots}, nil
}

// SharedKVPool is the KV tokens the requests of a llama-server started with
// argv share, 0 when its slots do not share one: with --kv-unified (which
// -np auto, the default, turns on) every slot may use the whole -c, and
// all of them together hold at most -c tokens; without it each slot has
// -c / -np of its own. The last of -kvu and -no-kvu wins, as in
// llama-server's own parsing; a -c of 0 (the model's) is not known here.
func SharedKVPool(argv []string) int {
	unified := true // -np auto
	if v, ok := flagValue(argv, "-np", "--parallel"); ok {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			unified = false
		}
	}
	for _, a := range argv {
		switch flagName(a) {
		case "-kvu", "--kv-unified":
			unified = true
		case "-no-kvu", "--no-kv-unified":
			unified = false
		}
	}
	if !unified {
		return 0
	}
	v, ok := flagValue(argv, "-c", "--ctx-size")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
