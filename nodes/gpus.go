package nodes

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"fleet"
)

// GPUDemand is what a vLLM recipe asks of its node's GPUs: one copy of the
// weights spread over TensorParallel × PipelineParallel GPUs, DataParallel
// copies of it, on the GPUs its CUDA_VISIBLE_DEVICES names (all of them
// when Visible is nil).
type GPUDemand struct {
	TensorParallel, PipelineParallel, DataParallel int
	Visible                                        []int
}

// PerCopy is how many GPUs one copy of the weights is spread over.
func (d GPUDemand) PerCopy() int { return d.TensorParallel * d.PipelineParallel }

// Total is how many GPUs the engine takes.
func (d GPUDemand) Total() int { return d.PerCopy() * d.DataParallel }

// String is the demand as an operator wrote it: "tensor-parallel 2 ×
// pipeline-parallel 1", with "× data-parallel N" when N > 1.
func (d GPUDemand) String() string {
	s := fmt.Sprintf("tensor-parallel %d × pipeline-parallel %d", d.TensorParallel, d.PipelineParallel)
	if d.DataParallel > 1 {
		s += fmt.Sprintf(" × data-parallel %d", d.DataParallel)
	}
	return s
}

// vllmParallelFlags are vLLM's flags for how many GPUs it spreads over, by
// long and short spelling.
var vllmParallelFlags = map[string]string{
	"--tensor-parallel-size": "tp", "-tp": "tp",
	"--pipeline-parallel-size": "pp", "-pp": "pp",
	"--data-parallel-size": "dp", "-dp": "dp",
}

// RecipeGPUDemand reads a vLLM recipe's parallel sizes (--tensor-parallel-size,
// --pipeline-parallel-size, --data-parallel-size or -tp/-pp/-dp, "N" or
// "=N"; 1 when absent) and its env's CUDA_VISIBLE_DEVICES. The error says
// which value fleet cannot read.
func RecipeGPUDemand(r fleet.Recipe) (GPUDemand, error) {
	d := GPUDemand{TensorParallel: 1, PipelineParallel: 1, DataParallel: 1}
	for i := 0; i < len(r.Args); i++ {
		flag, value, inline := strings.Cut(r.Args[i], "=")
		which, ok := vllmParallelFlags[flag]
		if !ok {
			continue
		}
		if !inline {
			if i+1 == len(r.Args) {
				return d, fmt.Errorf("recipe argument %s has no value; write it as %s N", flag, flag)
			}
			i++
			value = r.Args[i]
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			return d, fmt.Errorf("recipe argument %s %q is not a whole number of GPUs (1 or more)", flag, value)
		}
		switch which {
		case "tp":
			d.TensorParallel = n
		case "pp":
			d.PipelineParallel = n
		case "dp":
			d.DataParallel = n
		}
	}
	if v, ok := r.Env["CUDA_VISIBLE_DEVICES"]; ok {
		d.Visible = []int{}
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 {
				return d, fmt.Errorf("recipe env CUDA_VISIBLE_DEVICES=%q: fleet reads GPU indices only, as nvidia-smi numbers them (like 0,1); write those instead of UUIDs", v)
			}
			d.Visible = append(d.Visible, n)
		}
	}
	return d, nil
}

// PlaceOnGPUs picks the GPUs of a node (platform p) a vLLM engine takes: the
// first d.Total() GPUs, in index order, among those d allows and taken does
// not hold, with need/d.PerCopy() bytes free each. Other engines' use shows
// in the free figures of a fresh probe; taken are the GPUs of engines it
// cannot see yet (being launched) or at all (simulated nodes). On a
// unified-memory part, whose GPUs report no memory, it picks without
// figures: the caller checks system memory. The error starts "memory:" and
// gives the per-GPU figure and what to do.
func PlaceOnGPUs(p fleet.Platform, node, model string, need uint64, d GPUDemand, taken []int) ([]int, error) {
	candidates := d.Visible
	if candidates == nil {
		candidates = make([]int, len(p.GPUs))
		for i := range candidates {
			candidates[i] = i
		}
	}
	for _, i := range candidates {
		if i >= len(p.GPUs) {
			return nil, fmt.Errorf("memory: %s's recipe sets CUDA_VISIBLE_DEVICES to GPU %d, and %s has GPUs 0 to %d; name GPUs it has", model, i, node, len(p.GPUs)-1)
		}
	}
	count := d.Total()
	if count > len(candidates) {
		return nil, fmt.Errorf("memory: %s asks for %d GPUs (%s) and %s has %d it may use (%s); lower the parallel sizes or place the model on a node with more GPUs",
			model, count, d, node, len(candidates), p.GPULabel())
	}
	perGPU := need / uint64(d.PerCopy())
	if need%uint64(d.PerCopy()) != 0 {
		perGPU++
	}
	unified := false
	for _, i := range candidates {
		unified = unified || p.GPUs[i].MemTotalMiB == 0
	}
	var fits []int
	var most uint64
	for _, i := range candidates {
		if slices.Contains(taken, i) {
			continue
		}
		free := uint64(max(p.GPUs[i].MemFreeMiB, 0)) << 20
		most = max(most, free)
		if unified || free >= perGPU {
			fits = append(fits, i)
		}
	}
	if len(fits) >= count {
		return fits[:count], nil
	}
	on := "one GPU"
	if count > 1 {
		on = fmt.Sprintf("each of %d GPUs", count)
	}
	why := fmt.Sprintf("%s's GPUs have at most %s free each (%s)", node, fleet.GiB(most), p.GPULabel())
	if len(fits) > 0 {
		verb := "have"
		if len(fits) == 1 {
			verb = "has"
		}
		why = fmt.Sprintf("only %d of %s's GPUs %s that free (%s)", len(fits), node, verb, fleet.GPUIndices(fits))
	}
	if held := intersect(candidates, taken); len(held) > 0 {
		why += fmt.Sprintf("; GPUs %s are held by other engines", fleet.GPUIndices(held))
	}
	return nil, fmt.Errorf("memory: %s needs %s on %s (%s) but %s; spread it over more GPUs (--tensor-parallel-size), free memory on the node, or place the model elsewhere",
		model, fleet.GiB(perGPU), on, d, why)
}

func intersect(a, b []int) []int {
	var out []int
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// gpuEnv is the environment that confines an engine to gpus: CUDA numbers
// them in PCI bus order, as nvidia-smi does, only with CUDA_DEVICE_ORDER
// set (its default puts the fastest first).
func gpuEnv(env map[string]string, gpus []int) map[string]string {
	if len(gpus) == 0 {
		return env
	}
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = strconv.Itoa(g)
	}
	out["CUDA_VISIBLE_DEVICES"] = strings.Join(ids, ",")
	out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
	return out
}
