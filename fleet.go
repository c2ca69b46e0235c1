// Package fleet holds the shared vocabulary of the fleet console: nodes and
// their platforms, models with one recipe per engine, placements, workers and
// their lifecycle states, and measurement samples. It imports no other package
// of the module, so every package can speak it.
package fleet

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EngineKind names an inference engine fleet knows how to launch.
type EngineKind string

const (
	EngineVLLM      EngineKind = "vllm"
	EngineLlamaCpp  EngineKind = "llamacpp"
	EngineVLLMMetal EngineKind = "vllm-metal"
	EngineOllama    EngineKind = "ollama"
	EngineSim       EngineKind = "sim"
)

// EngineKinds lists every engine kind, in the order they are documented.
var EngineKinds = []EngineKind{EngineVLLM, EngineLlamaCpp, EngineVLLMMetal, EngineOllama, EngineSim}

// Valid reports whether k is a known engine kind.
func (k EngineKind) Valid() bool {
	for _, e := range EngineKinds {
		if e == k {
			return true
		}
	}
	return false
}

// Label is how the worker table shows an engine ("vLLM", "llama.cpp").
func (k EngineKind) Label() string {
	switch k {
	case EngineVLLM:
		return "vLLM"
	case EngineLlamaCpp:
		return "llama.cpp"
	case EngineVLLMMetal:
		return "vllm-metal"
	case EngineOllama:
		return "Ollama"
	case EngineSim:
		return "sim"
	}
	return string(k)
}

// GPU is one accelerator as the node's probe reported it. Memory figures are
// zero when the driver reports them as [N/A] (unified-memory parts). A GPU's
// index is its place in Platform.GPUs: nvidia-smi lists GPUs by index, which
// is PCI bus order, the order CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them in.
type GPU struct {
	Name        string `json:"name"`
	MemTotalMiB int64  `json:"mem_total_mib,omitempty"`
	MemFreeMiB  int64  `json:"mem_free_mib,omitempty"`
}

// Platform is what a probe learned about a node.
type Platform struct {
	OS   string `json:"os"`   // "linux", "darwin"
	Arch string `json:"arch"` // "amd64", "arm64"
	WSL  bool   `json:"wsl,omitempty"`
	// Chip is the CPU brand string; on Apple Silicon it names the GPU too ("Apple M4 Max").
	Chip string `json:"chip,omitempty"`
	GPUs []GPU  `json:"gpus,omitempty"`
	// GPUError is set when nvidia-smi is there but failed (a driver upgraded
	// under the loaded module, no device found): what it said and what to
	// do. GPUs is then empty and the node serves on its CPU.
	GPUError string `json:"gpu_error,omitempty"`
	// Notes are what the probe found worth telling the operator about this
	// kind of machine (WSL2, unified memory, an Intel Mac), each with what
	// it means for fleet.
	Notes []string `json:"notes,omitempty"`
	// MemTotalBytes is installed memory. MemFreeBytes is what can be allocated
	// without swapping: MemAvailable on Linux, free+inactive+speculative on macOS.
	MemTotalBytes uint64 `json:"mem_total_bytes,omitempty"`
	MemFreeBytes  uint64 `json:"mem_free_bytes,omitempty"`
	// Profile is set on simulated nodes: the sim profile whose platform this is.
	Profile string `json:"profile,omitempty"`
	// Engines is where the probe found each engine's default binary on the
	// node (Homebrew, ~/.local/bin, a venv off PATH…); an engine not found
	// is absent.
	Engines map[EngineKind]string `json:"engines,omitempty"`
}

// GiB is how fleet writes an amount of memory, everywhere (tables, events,
// rejections): GiB, 2^30 bytes, with one decimal, as in "22.3 GiB". A fleet
// file's memory_gb is in the same unit. Binary units because the figures
// come binary: nvidia-smi reports MiB, engines their use in GiB or MiB,
// and a "24 GB" GPU holds 24 GiB.
func GiB(bytes uint64) string {
	return strconv.FormatFloat(float64(bytes)/(1<<30), 'f', 1, 64) + " GiB"
}

// UsableMemory is the memory a new engine on the node can count on, which
// admission compares a model's memory_gb with: on a Mac three quarters of
// free memory (Metal's working-set limit keeps the rest); on NVIDIA the free
// GPU memory summed over the GPUs, as llama.cpp splits a model over them all
// (a vLLM engine is instead checked GPU by GPU, on the GPUs its recipe
// uses: hub/admission.CheckMemory); on unified-memory NVIDIA parts that
// report no GPU memory, and on CPU machines, MemAvailable.
func (p Platform) UsableMemory() uint64 {
	if p.OS == "darwin" {
		return p.MemFreeBytes / 4 * 3
	}
	var gpuFree uint64
	for _, g := range p.GPUs {
		if g.MemFreeMiB > 0 {
			gpuFree += uint64(g.MemFreeMiB) << 20
		}
	}
	if gpuFree > 0 {
		return gpuFree
	}
	return p.MemFreeBytes
}

// HostLabel is the "Host" column: Linux, macOS or Windows/WSL.
func (p Platform) HostLabel() string {
	switch {
	case p.WSL:
		return "Windows/WSL"
	case p.OS == "darwin":
		return "macOS"
	case p.OS == "linux":
		return "Linux"
	case p.OS == "":
		return "?"
	}
	return p.OS
}

// AppleSilicon reports whether the node is a Mac with an Apple chip.
func (p Platform) AppleSilicon() bool {
	return p.OS == "darwin" && (p.Arch == "arm64" || strings.HasPrefix(p.Chip, "Apple"))
}

// GPULabel is the "GPU" column: "8x RTX 3060", "Apple M1 Ultra", "CPU", or
// "CPU (GPU failed)" when nvidia-smi is there but failed.
func (p Platform) GPULabel() string {
	if len(p.GPUs) > 0 {
		name := strings.TrimPrefix(strings.TrimPrefix(p.GPUs[0].Name, "NVIDIA "), "GeForce ")
		same := true
		for _, g := range p.GPUs[1:] {
			if g.Name != p.GPUs[0].Name {
				same = false
			}
		}
		if same && len(p.GPUs) > 1 {
			return fmt.Sprintf("%dx %s", len(p.GPUs), name)
		}
		if same {
			return name
		}
		return fmt.Sprintf("%d GPUs", len(p.GPUs))
	}
	if p.AppleSilicon() && p.Chip != "" {
		return p.Chip
	}
	if p.GPUError != "" {
		return "CPU (GPU failed)"
	}
	return "CPU"
}

// GPUIndices writes GPU indices as the worker table shows them: "#3",
// "#0,2", "#0-3".
func GPUIndices(gpus []int) string {
	if len(gpus) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('#')
	for i := 0; i < len(gpus); {
		j := i
		for j+1 < len(gpus) && gpus[j+1] == gpus[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(gpus[i]))
		if j > i+1 {
			b.WriteString("-" + strconv.Itoa(gpus[j]))
		} else if j == i+1 {
			b.WriteString("," + strconv.Itoa(gpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// DefaultEngine is the engine a placement gets when it does not pin one:
// NVIDIA → vLLM, everything else → llama.cpp.
func (p Platform) DefaultEngine() EngineKind {
	if len(p.GPUs) > 0 && p.OS == "linux" {
		return EngineVLLM
	}
	return EngineLlamaCpp
}

// NodeState is whether the hub can reach a node.
type NodeState string

const (
	NodeUnknown     NodeState = "unknown"
	NodeUp          NodeState = "up"
	NodeUnreachable NodeState = "unreachable"
)

// Node is a machine the hub drives.
type Node struct {
	Name string `json:"name"`
	// Address is user@host[:port], "local" for the hub's own machine, or
	// "sim:PROFILE" for a simulated node.
	Address  string `json:"address"`
	Identity string `json:"identity,omitempty"`
	// Endpoint is "tunnel" (default: reach engines through the node's SSH
	// connection) or "direct" (dial the node's address).
	Endpoint string `json:"endpoint,omitempty"`
	// Ports are the TCP ports the node's engines may listen on; zero is
	// the hub's default (`serve --engine-ports`).
	Ports    PortRange `json:"ports,omitzero"`
	HostKey  string    `json:"host_key,omitempty"`
	Platform *Platform `json:"platform,omitempty"`
	ProbedAt time.Time `json:"probed_at,omitzero"`
	State    NodeState `json:"state"`
	Reason   string    `json:"reason,omitempty"`
	Drained  bool      `json:"drained,omitempty"`
}

// PortRange is an inclusive range of TCP ports, written "18000-18999".
type PortRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// DefaultEnginePorts is where engines listen unless the hub or a node says
// otherwise: below Linux's ephemeral ports (32768-60999), which outgoing
// connections take, and above the well-known ones.
var DefaultEnginePorts = PortRange{Min: 18000, Max: 18999}

// MinEnginePort is the lowest port an engine may be given: ports below
// 1024 need root, and engines run as the node's SSH user.
const MinEnginePort = 1024

// ParsePortRange reads "MIN-MAX" (or one port), both from 1024 to 65535.
// The error says what is wrong and how to write it.
func ParsePortRange(s string) (PortRange, error) {
	firstText, lastText, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		lastText = firstText
	}
	port := func(p string) (int, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		return n, err == nil && n >= MinEnginePort && n <= 65535
	}
	first, okFirst := port(firstText)
	last, okLast := port(lastText)
	switch {
	case !okFirst || !okLast:
		return PortRange{}, fmt.Errorf("ports %q must be MIN-MAX, two port numbers from %d to 65535, like 18000-18999", s, MinEnginePort)
	case first > last:
		return PortRange{}, fmt.Errorf("ports %q: %d is above %d; write the lower port first, like %d-%d", s, first, last, last, first)
	}
	return PortRange{Min: first, Max: last}, nil
}

// IsZero reports an unset range.
func (r PortRange) IsZero() bool { return r == PortRange{} }

// String is "MIN-MAX", as a fleet file writes it; "" when unset.
func (r PortRange) String() string {
	if r.IsZero() {
		return ""
	}
	return strconv.Itoa(r.Min) + "-" + strconv.Itoa(r.Max)
}

// Or is r, or def when r is unset.
func (r PortRange) Or(def PortRange) PortRange {
	if r.IsZero() {
		return def
	}
	return r
}

// Address kinds.
const (
	AddressLocal     = "local"
	AddressSimPrefix = "sim:"
)

// SimProfile returns the profile of a "sim:PROFILE" address.
func (n Node) SimProfile() (string, bool) {
	return strings.CutPrefix(n.Address, AddressSimPrefix)
}

// DialsDirect says whether the router reaches this node's engines at the
// node's own address (`endpoint: direct` on an SSH node) instead of through
// its SSH connection. Such engines listen on every interface of their node;
// on the hub's own machine and on simulated nodes the setting changes nothing.
func (n Node) DialsDirect() bool {
	if n.Endpoint != "direct" || n.Address == AddressLocal {
		return false
	}
	_, sim := n.SimProfile()
	return !sim
}

// Recipe is how one engine serves one model.
type Recipe struct {
	Engine EngineKind `json:"engine" yaml:"-"`
	// Model is the weights: an HF repo, a GGUF path, or repo:quant.
	Model   string            `json:"model,omitempty" yaml:"model,omitempty"`
	Args    []string          `json:"args,omitempty" yaml:"args,omitempty"`
	Bin     string            `json:"bin,omitempty" yaml:"bin,omitempty"`
	Install string            `json:"install,omitempty" yaml:"install,omitempty"`
	Env     map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// Profile is the sim profile, for the sim engine only.
	Profile string `json:"profile,omitempty" yaml:"profile,omitempty"`
	// ReadyTimeout bounds launch to ready for this recipe (a first start
	// that downloads weights takes long); 0 is the hub's default.
	ReadyTimeout time.Duration `json:"ready_timeout,omitempty" yaml:"-"`
}

// Model is one model ID clients send, and how each engine serves it.
type Model struct {
	ID       string   `json:"id"`
	Aliases  []string `json:"aliases,omitempty"`
	Context  int      `json:"context"`
	MemoryGB float64  `json:"memory_gb,omitempty"`
	// SpeedTolerance is the fraction of the best ready worker's single-request
	// speed a new worker must reach to be admitted (default 0.5).
	SpeedTolerance float64 `json:"speed_tolerance,omitempty"`
	// Reasoning is the opt-in response normalisation: "", "inline" or "field".
	Reasoning string `json:"reasoning,omitempty"`
	// Reference is the node whose worker's response shape every worker of
	// the model must match; "" means the first node of the model's first
	// placement (see Fleet.ReferenceNode).
	Reference string                `json:"reference,omitempty"`
	Recipes   map[EngineKind]Recipe `json:"recipes"`
}

// Serves reports whether name is the model's ID or one of its aliases.
func (m Model) Serves(name string) bool {
	if name == m.ID {
		return true
	}
	for _, a := range m.Aliases {
		if a == name {
			return true
		}
	}
	return false
}

// Placement asks for a model on a node, with the engine chosen from the
// node's platform unless Engine pins it.
type Placement struct {
	Model  string     `json:"model"`
	Node   string     `json:"node"`
	Engine EngineKind `json:"engine,omitempty"`
	// Context is the worker's context when smaller than the model's (a
	// small GPU runs the model with less KV cache); 0 means the model's.
	Context int `json:"context,omitempty"`
}

// ContextOf is the context the worker of p runs m with.
func (p Placement) ContextOf(m Model) int {
	if p.Context > 0 && (m.Context <= 0 || p.Context < m.Context) {
		return p.Context
	}
	return m.Context
}

// WorkerState is a step of the worker lifecycle:
// pending → installing → starting → probation → ready ⇄ draining → stopped,
// plus failed and rejected.
type WorkerState string

const (
	WorkerPending    WorkerState = "pending"
	WorkerInstalling WorkerState = "installing"
	WorkerStarting   WorkerState = "starting"
	WorkerProbation  WorkerState = "probation"
	WorkerReady      WorkerState = "ready"
	WorkerDraining   WorkerState = "draining"
	WorkerStopped    WorkerState = "stopped"
	WorkerFailed     WorkerState = "failed"
	WorkerRejected   WorkerState = "rejected"
)

// Worker is one engine process serving one model on one node.
type Worker struct {
	ID     int64       `json:"id"`
	Node   string      `json:"node"`
	Model  string      `json:"model"`
	Engine EngineKind  `json:"engine"`
	State  WorkerState `json:"state"`
	// Reason says why a worker is failed or rejected, with the figures.
	Reason string `json:"reason,omitempty"`
	Port   int    `json:"port"`
	PID    int    `json:"pid"`
	PGID   int    `json:"pgid,omitempty"`
	// Argv is the exact command line of the engine ("Started with"). On a
	// simulated node it is the command the real engine would have run.
	Argv []string `json:"argv,omitempty"`
	// LaunchArgv is what was really executed; it differs from Argv only on
	// simulated nodes, where the engine is `fleet sim --mimic …`.
	LaunchArgv []string `json:"launch_argv,omitempty"`
	// GPUs are the indices of the node's GPUs the admission gate gave the
	// engine (its CUDA_VISIBLE_DEVICES); none when the engine sees them all.
	// Stored, so an engine adopted after a hub restart keeps them.
	GPUs          []int     `json:"gpus,omitempty"`
	Simulated     bool      `json:"simulated,omitempty"`
	StartedAt     time.Time `json:"started_at,omitzero"`
	Context       int       `json:"ctx,omitempty"`
	Slots         int       `json:"slots,omitempty"`
	EngineVersion string    `json:"engine_version,omitempty"`
	Restarts      int       `json:"restarts,omitempty"`
	// Progress is the engine install's progress in percent while the worker
	// is installing, or its download of the weights while it is starting,
	// when the installer or the engine prints one.
	Progress float64 `json:"progress,omitempty"`
	Drained  bool    `json:"drained,omitempty"`
	// Held is an operator's `fleet stop`: the worker stays stopped, across
	// hub restarts, until `fleet start`.
	Held bool `json:"held,omitempty"`
	// Launch is the serial of the worker's last engine launch, recorded in
	// the database before the engine was started; the engine carries it
	// (FLEET_LAUNCH, with its fleet's FLEET_ID), so a hub killed before it
	// learnt the engine's PID finds the engine by it. 0: none in doubt.
	Launch int64 `json:"launch,omitempty"`
}

// Name is NODE/MODEL, the worker's name everywhere it is shown.
func (w Worker) Name() string { return w.Node + "/" + w.Model }

// Sample is one measurement of a worker: a request the router served, or a
// bench or shape result.
type Sample struct {
	Worker string    `json:"worker"`
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"` // "request", "bench", "shape"
	// TTFT is the time to the first token, from the moment the worker was
	// sent the request; 0 when not known (a non-streamed answer whose
	// engine reports no prefill time).
	TTFT         time.Duration `json:"ttft"`
	ITL          time.Duration `json:"itl"`
	E2E          time.Duration `json:"e2e"`
	OutputTokens int           `json:"output_tokens"`
	TokPerSec    float64       `json:"tok_s"`
	Detail       string        `json:"detail,omitempty"`
}

// RestartBackoff is the wait before the n-th relaunch of a failed worker:
// min(10·2^(n−1), 300) seconds.
func RestartBackoff(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if n > 6 {
		return 300 * time.Second
	}
	s := 10 << (n - 1)
	if s > 300 {
		s = 300
	}
	return time.Duration(s) * time.Second
}

// Fleet is the declared state: what a fleet file says and `fleet export` prints.
type Fleet struct {
	Nodes      []Node      `json:"nodes"`
	Models     []Model     `json:"models"`
	Placements []Placement `json:"placements"`
}

// ReferenceNode is the node whose worker sets model's reference shape: the
// model's `reference:` when given, else the first node of its first
// placement in the file. A fixed rule, so the reference never depends on
// which worker happened to become ready first. "" when the model is not
// placed anywhere.
func (f Fleet) ReferenceNode(model string) string {
	for _, m := range f.Models {
		if m.ID == model && m.Reference != "" {
			return m.Reference
		}
	}
	for _, p := range f.Placements {
		if p.Model == model {
			return p.Node
		}
	}
	return ""
}

// Role is what an SSH user may do: viewer < operator < admin.
type Role string

const (
	RoleViewer   Role = "viewer"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// Allows reports whether r is at least need. A need that is no role (an
// action missing from the table asks for "") is allowed to nobody.
func (r Role) Allows(need Role) bool { return need.rank() > 0 && r.rank() >= need.rank() }

// ActionName is how the command tree spells an action and the audit trail
// records it ("drain", "user add", "apply --dry-run"). Code names an action
// by one of the constants below, never by a bare string, so a name is
// spelled once: here.
type ActionName string

// The actions, in the order of the table below.
const (
	ActionHelp       ActionName = "help"
	ActionWhoami     ActionName = "whoami"
	ActionWorkers    ActionName = "workers"
	ActionNodes      ActionName = "nodes"
	ActionModels     ActionName = "models"
	ActionStatus     ActionName = "status"
	ActionEvents     ActionName = "events"
	ActionExport     ActionName = "export"
	ActionTheme      ActionName = "theme"
	ActionUsage      ActionName = "usage"
	ActionUsageByKey ActionName = "usage --by key"

	ActionDrain        ActionName = "drain"
	ActionUndrain      ActionName = "undrain"
	ActionRestart      ActionName = "restart"
	ActionStop         ActionName = "stop"
	ActionStart        ActionName = "start"
	ActionShape        ActionName = "shape"
	ActionShapeAll     ActionName = "shape --all"
	ActionBench        ActionName = "bench"
	ActionBenchHistory ActionName = "bench --history"
	ActionForceAdmit   ActionName = "admit --force"
	ActionAudit        ActionName = "audit"
	ActionLogs         ActionName = "logs"

	ActionApply       ActionName = "apply"
	ActionApplyDryRun ActionName = "apply --dry-run"
	ActionShapePin    ActionName = "shape pin"
	ActionNodeTrust   ActionName = "node trust"
	ActionUserAdd     ActionName = "user add"
	ActionUserRemove  ActionName = "user rm"
	ActionUserList    ActionName = "user list"
	ActionKeyCreate   ActionName = "key create"
	ActionKeyRevoke   ActionName = "key revoke"
	ActionKeyList     ActionName = "key list"
	ActionKeyLimit    ActionName = "key limit"
)

// Action is one thing a user may ask of the hub, whichever way it arrives
// (console key, SSH exec, the local CLI).
type Action struct {
	// Name is how the command tree spells it and the audit trail records it.
	Name ActionName
	// Role is the least role that may do it.
	Role Role
	// Audited actions change the fleet, its users or keys, or send load to
	// workers: their audit line is written before they run (and they do not
	// run when it cannot be), then says how they ended. Of the others
	// (reads) only a refusal is audited.
	Audited bool
	// OnWorkers actions take the names of workers or nodes as arguments,
	// so the shell completes them from the running hub's.
	OnWorkers bool
	// PerWorker actions are the hub's Act: done to each worker named (a
	// node name or all meaning its workers), one audit line per worker.
	PerWorker bool
}

// actions is the one table of what may be asked of the hub: the hub
// authorizes and audits by it, the command tree refuses a command missing
// from it and completes worker names for the ones on workers, and the
// console's keys name it and are greyed out by it. shape and bench send
// load to workers, so they need an operator.
var actions = [...]Action{
	{Name: ActionHelp, Role: RoleViewer},
	{Name: ActionWhoami, Role: RoleViewer},
	{Name: ActionWorkers, Role: RoleViewer},
	{Name: ActionNodes, Role: RoleViewer},
	{Name: ActionModels, Role: RoleViewer},
	{Name: ActionStatus, Role: RoleViewer},
	{Name: ActionEvents, Role: RoleViewer, OnWorkers: true},
	{Name: ActionExport, Role: RoleViewer},
	// A theme is the user's own preference, not the fleet's.
	{Name: ActionTheme, Role: RoleViewer},
	// Usage by model or worker is the fleet's; by key it names the keys,
	// which only admins list.
	{Name: ActionUsage, Role: RoleViewer},
	{Name: ActionUsageByKey, Role: RoleAdmin},

	{Name: ActionDrain, Role: RoleOperator, Audited: true, OnWorkers: true, PerWorker: true},
	{Name: ActionUndrain, Role: RoleOperator, Audited: true, OnWorkers: true, PerWorker: true},
	{Name: ActionRestart, Role: RoleOperator, Audited: true, OnWorkers: true, PerWorker: true},
	{Name: ActionStop, Role: RoleOperator, Audited: true, OnWorkers: true, PerWorker: true},
	{Name: ActionStart, Role: RoleOperator, Audited: true, OnWorkers: true, PerWorker: true},
	{Name: ActionShape, Role: RoleOperator, OnWorkers: true},
	{Name: ActionShapeAll, Role: RoleOperator},
	{Name: ActionBench, Role: RoleOperator, Audited: true, OnWorkers: true},
	// Past runs are read from the store: no load on any worker.
	{Name: ActionBenchHistory, Role: RoleViewer, OnWorkers: true},
	{Name: ActionForceAdmit, Role: RoleOperator, Audited: true, OnWorkers: true},
	{Name: ActionAudit, Role: RoleOperator},
	// An engine's log can hold prompts and answers (llama-server logs them
	// at -v, vLLM with --enable-log-requests): the API clients' data, not
	// for everyone who may look at the fleet.
	{Name: ActionLogs, Role: RoleOperator, OnWorkers: true},

	{Name: ActionApply, Role: RoleAdmin, Audited: true},
	{Name: ActionApplyDryRun, Role: RoleAdmin},
	{Name: ActionShapePin, Role: RoleAdmin, Audited: true, OnWorkers: true},
	{Name: ActionNodeTrust, Role: RoleAdmin, Audited: true, OnWorkers: true},
	{Name: ActionUserAdd, Role: RoleAdmin, Audited: true},
	{Name: ActionUserRemove, Role: RoleAdmin, Audited: true},
	{Name: ActionUserList, Role: RoleAdmin},
	{Name: ActionKeyCreate, Role: RoleAdmin, Audited: true},
	{Name: ActionKeyRevoke, Role: RoleAdmin, Audited: true},
	{Name: ActionKeyList, Role: RoleAdmin},
	{Name: ActionKeyLimit, Role: RoleAdmin, Audited: true},
}

// Actions returns the action table (a copy).
func Actions() []Action { return slices.Clone(actions[:]) }

// LookupAction finds an action by name; ok is false for one not in the
// table, which nobody may do.
func LookupAction(name ActionName) (a Action, ok bool) {
	for _, a := range actions {
		if a.Name == name {
			return a, true
		}
	}
	return Action{Name: name}, false
}

// ActionRole is the role an action needs; "" (which Allows grants nobody)
// for an action missing from the table.
func ActionRole(name ActionName) Role {
	a, _ := LookupAction(name)
	return a.Role
}

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// User is an SSH identity of the console.
type User struct {
	Name      string `json:"name"`
	Role      Role   `json:"role"`
	PublicKey string `json:"public_key"` // authorized_keys format
	// Fingerprint is the SHA256 fingerprint of PublicKey, as ssh-keygen -lf prints it.
	Fingerprint string `json:"fingerprint"`
	Theme       string `json:"theme,omitempty"`
}

// APIKey is a router key as listed: its name and dates, never the key
// itself (the store keeps only its hash).
type APIKey struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Revoked time.Time `json:"revoked,omitzero"`
	KeyLimits
	// LastUsed is the start of the last minute the key had a request
	// answered, zero when the usage kept (see --retention) has none.
	LastUsed time.Time `json:"last_used,omitzero"`
	// RequestsToday counts its requests answered since 00:00 UTC.
	RequestsToday int64 `json:"requests_today"`
}

// KeyLimits are a router key's optional limits; 0 is no limit. Tokens are
// prompt plus completion tokens as the engines report them, per UTC day.
type KeyLimits struct {
	RequestsPerMinute int   `json:"requests_per_minute,omitempty"`
	TokensPerDay      int64 `json:"tokens_per_day,omitempty"`
}

// LimitText is a key limit as people read it: 0 (or below) is no limit.
func LimitText(n int64) string {
	if n <= 0 {
		return "unlimited"
	}
	return strconv.FormatInt(n, 10)
}

// KeyCounts is what one hub admitted of a router key (requests) and what
// they spent (tokens), as hubs sharing a database tell each other to hold
// the key's limits together.
type KeyCounts struct {
	Requests, Tokens int64
}

// Usage is what one router key (or model, or worker) used: requests
// answered and the tokens the engines reported for them. Key is "" when the
// router takes no keys (loopback without --require-keys).
type Usage struct {
	// Bucket is the start of the minute the usage was counted in, when it
	// is one minute's (as the router's recorder writes it); zero in totals.
	Bucket           time.Time `json:"bucket,omitzero"`
	Key              string    `json:"key,omitempty"`
	Model            string    `json:"model,omitempty"`
	Worker           string    `json:"worker,omitempty"`
	Requests         int64     `json:"requests"`
	PromptTokens     int64     `json:"prompt_tokens"`
	CachedTokens     int64     `json:"cached_tokens"`
	CompletionTokens int64     `json:"completion_tokens"`
}

// Event is a line of a node's or worker's history: launches, probes, drains,
// install output, admission results.
type Event struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Level   string    `json:"level"`   // "info", "warn", "error"
	Subject string    `json:"subject"` // a node name or a worker name NODE/MODEL
	Message string    `json:"message"`
}

// Bounds of an engine log read (`fleet logs -n`, checked by the command and
// again where the node's tail runs): an engine's log grows without end (vLLM
// logs a line per scheduler step), so no reader may ask for all of it.
const (
	DefaultLogLines = 200
	MaxLogLines     = 10000
)

// AuditEntry records who did what, when, to what, and how it ended.
type AuditEntry struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	User    string    `json:"user"`
	Action  string    `json:"action"` // "drain", "restart", "apply", "user add", …
	Target  string    `json:"target"`
	Outcome string    `json:"outcome"` // "ok", "denied", "failed: …"
	// Count is set on a line that stands for repeats: how many times the
	// user met this outcome of this action within a minute (a refusal, or
	// a failure that changed nothing), the target and outcome being the
	// first's; Last is when the last one was. An action's own line has 0.
	Count int       `json:"count,omitempty"`
	Last  time.Time `json:"last,omitzero"`
}

// OutcomeText is the outcome as the audit table shows it, with how many
// times it happened when the line stands for repeats.
func (a AuditEntry) OutcomeText() string {
	if a.Count <= 1 {
		return a.Outcome
	}
	return fmt.Sprintf("%s (%d times, the last at %s)", a.Outcome, a.Count, a.Last.Local().Format(time.TimeOnly))
}

// WorkerView is a worker as the console and `workers --json` show it: the
// stored worker plus its node's platform labels and the router's live figures.
type WorkerView struct {
	Worker
	Host     string `json:"host"`
	GPU      string `json:"gpu"`
	InFlight int    `json:"in_flight"`
	// Live figures at the worker's current load, from the router's measurements.
	TokPerSec float64 `json:"tok_s"`
	ITLms     float64 `json:"itl_ms"`
	// TTFTms is the measured median time to first token of the worker's
	// recent requests; PredictedTTFTms the scheduler's speed model's guess.
	TTFTms          float64 `json:"ttft_ms"`
	PredictedTTFTms float64 `json:"predicted_ttft_ms,omitempty"`
	// Recent history, oldest first, for sparklines.
	TTFTHistory []float64 `json:"ttft_history_ms,omitempty"`
	ITLHistory  []float64 `json:"itl_history_ms,omitempty"`
	// CacheHit is the share of prompt tokens the engine reported reused
	// from its prompt cache, over the requests the router sent it; nil
	// until it reported any.
	CacheHit *float64 `json:"cache_hit,omitempty"`
	// MemoryBytes is the engine's resident memory when known.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// Bench is the worker's latest bench sweep, one point per concurrency
	// level, for the console's chart of TTFT and tok/s against concurrency.
	Bench   []BenchPoint `json:"bench,omitempty"`
	BenchAt time.Time    `json:"bench_at,omitzero"`
	// AgentBench is the latest sweep of the agent split (long prompts,
	// short answers), shown beside the chat one.
	AgentBench   []BenchPoint `json:"agent_bench,omitempty"`
	AgentBenchAt time.Time    `json:"agent_bench_at,omitzero"`
	// EngineBin is where the worker's engine binary was found on its node
	// (the node's Platform.Engines), when it runs that binary.
	EngineBin string `json:"engine_bin,omitempty"`
}

// BenchPoint is one concurrency level of a bench sweep.
type BenchPoint struct {
	Concurrency         int     `json:"concurrency"`
	TotalTokPerSec      float64 `json:"total_tok_s"`
	PerRequestTokPerSec float64 `json:"per_request_tok_s"`
	TTFTp50ms           float64 `json:"ttft_p50_ms"`
}

// Snapshot is everything the console shows at one instant.
type Snapshot struct {
	At      time.Time    `json:"at"`
	Workers []WorkerView `json:"workers"`
	Nodes   []Node       `json:"nodes"`
	Models  []Model      `json:"models"`
	Events  []Event      `json:"events"`
	// Audit is the recent audit trail (who did what), newest last; the
	// console's events view shows it beside the events.
	Audit []AuditEntry `json:"audit,omitempty"`
	// Usage is the last 24 hours' usage by worker (Worker and Model set)
	// and, for admins, by API key (Key set); the console's usage view
	// shows it.
	Usage []Usage `json:"usage,omitempty"`
	// EnginePorts are the hub's engine ports (serve --engine-ports), which
	// nodes without ports: of their own use.
	EnginePorts PortRange `json:"engine_ports,omitzero"`
	// Hub is the hub answering, its role and the leader's name, when
	// several hubs share the fleet's PostgreSQL database (nil on SQLite).
	Hub *HubRole `json:"hub,omitempty"`
}

// HubRole is which hub answers and whether it leads.
type HubRole struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	Leader string `json:"leader"`
}

// IsLoopbackAddr reports whether a listen address (host:port) is reachable
// only from this machine. The hub relaxes nothing else on that basis: off
// loopback the router demands API keys and the console admits no key from
// the hub user's ~/.ssh by default.
func IsLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
