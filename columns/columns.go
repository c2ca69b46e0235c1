// Package columns defines each column of the worker table once: its header,
// its width in the console, and a pure function from a worker to its cell.
// The CLI's `workers` table and the console's worker table both pick their
// columns from here, so the two cannot show the same worker differently.
package columns

import (
	"fmt"
	"strings"

	"fleet"
)

// Column is one column of the worker table.
type Column struct {
	// Header is the console's title of the column; the CLI prints it in
	// capitals, as tabular commands do.
	Header string
	// Width is the console's fixed width in cells; 0 sizes the column to its
	// widest cell (and header), up to Max when Max is set.
	Width, Max int
	// Right aligns the cell to the right (figures).
	Right bool
	Cell  func(fleet.WorkerView) string
}

// The columns. A new one is added here and picked in the CLI's and the
// console's lists.
var (
	Node   = Column{Header: "Node", Max: 24, Cell: func(w fleet.WorkerView) string { return w.Node }}
	Model  = Column{Header: "Model", Max: 32, Cell: func(w fleet.WorkerView) string { return w.Model }}
	GPU    = Column{Header: "GPU", Max: gpuMax, Cell: GPUCell}
	Host   = Column{Header: "Host", Max: 11, Cell: func(w fleet.WorkerView) string { return w.Host }}
	Engine = Column{Header: "Engine", Max: 10, Cell: func(w fleet.WorkerView) string { return w.Engine.Label() }}
	Ctx    = Column{Header: "Ctx", Width: 5, Right: true, Cell: func(w fleet.WorkerView) string { return Tokens(w.Context) }}
	State  = Column{Header: "State", Cell: StateCell}
	Load   = Column{Header: "Load", Right: true, Cell: LoadCell}
	TokS   = Column{Header: "tok/s", Width: 6, Right: true, Cell: func(w fleet.WorkerView) string { return Rate(w.TokPerSec) }}
	TTFT   = Column{Header: "TTFT", Width: 6, Right: true, Cell: func(w fleet.WorkerView) string { return Millis(w.TTFTms) }}
	ITL    = Column{Header: "ITL", Width: 6, Right: true, Cell: func(w fleet.WorkerView) string { return Millis(w.ITLms) }}
	PID    = Column{Header: "PID", Right: true, Cell: PIDCell}
	Port   = Column{Header: "Port", Right: true, Cell: PortCell}
	Argv   = Column{Header: "Started with", Cell: func(w fleet.WorkerView) string { return strings.Join(w.Argv, " ") }}
)

// Table is the worker table's shared column set, in order: the CLI's
// `workers` and the console's worker table both show these, and then what
// only each shows (the CLI PID, Port and Started with; the console
// sparklines and Started with fitted to the window).
var Table = []Column{Node, Model, GPU, Host, Engine, Ctx, State, Load, TokS, TTFT, ITL}

const gpuMax = 18

// GPUCell is the node's GPUs and, after them, the indices of those the
// worker's engine was given ("8x RTX 3060 #2,3"). The indices are what
// tells two workers of one node apart, so a long GPU name is shortened to
// keep them within the column.
func GPUCell(w fleet.WorkerView) string {
	if len(w.GPUs) == 0 {
		return w.GPU
	}
	ids := fleet.GPUIndices(w.GPUs)
	label := []rune(w.GPU)
	if room := gpuMax - len(ids) - 1; len(label) > room {
		label = append(label[:max(room-1, 0)], '…')
	}
	return string(label) + " " + ids
}

// PIDCell is the engine's process ID, "-" when no engine process runs (a
// stopped or rejected worker).
func PIDCell(w fleet.WorkerView) string {
	if w.PID == 0 {
		return "-"
	}
	return fmt.Sprint(w.PID)
}

// PortCell is the port the engine listens on, "-" while no engine process
// runs: the port a stopped worker keeps for its next start answers nothing.
func PortCell(w fleet.WorkerView) string {
	if w.PID == 0 || w.Port == 0 {
		return "-"
	}
	return fmt.Sprint(w.Port)
}

// StateCell is the lifecycle state, with the progress of an engine's
// install or of its weights' download, and the operator's drain: a ready
// worker drained is "draining" while requests are in flight and "drained"
// once none are (the hub's event says so then), and a worker drained before
// it is ready (on probation, starting) says so beside its state, as it will
// take no requests once ready.
func StateCell(w fleet.WorkerView) string {
	state := string(w.State)
	// Installing: the engine's installer; starting: the engine's download
	// of its weights.
	if (w.State == fleet.WorkerInstalling || w.State == fleet.WorkerStarting) && w.Progress > 0 {
		state = fmt.Sprintf("%s %.0f%%", w.State, w.Progress)
	}
	switch w.State {
	case fleet.WorkerDraining:
		if w.InFlight == 0 {
			return "drained"
		}
	case fleet.WorkerPending, fleet.WorkerInstalling, fleet.WorkerStarting, fleet.WorkerProbation:
		if w.Drained {
			return state + ", drained"
		}
	}
	return state
}

// LoadCell is requests in flight over the worker's slots, "-" for slots
// not known.
func LoadCell(w fleet.WorkerView) string {
	if w.Slots <= 0 {
		return fmt.Sprintf("%d/-", w.InFlight)
	}
	return fmt.Sprintf("%d/%d", w.InFlight, w.Slots)
}

// Tokens is a context size: 16384 → "16k", 4000 → "4k", 0 → "-".
func Tokens(n int) string {
	switch {
	case n <= 0:
		return "-"
	case n%1024 == 0:
		return fmt.Sprintf("%dk", n/1024)
	case n >= 1000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// Rate is a tokens-per-second figure, one decimal below 100, "-" before
// any measurement.
func Rate(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// Millis is a latency in milliseconds, "-" before any measurement.
func Millis(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.1fms", v)
	case v < 1000:
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.1fs", v/1000)
}

// CLIHeader is the column's title in the CLI's table.
func (c Column) CLIHeader() string { return strings.ToUpper(c.Header) }
