package nodes

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"fleet"
)

// probeScript is the one detection script every node runs. It is constant,
// so no data is ever spliced into it; each section starts with a marker line
// and tolerates the command being absent (a Mac has no /proc, Linux has no
// vm_stat). On WSL nvidia-smi may live outside the non-interactive PATH.
// A failing nvidia-smi ("No devices were found", exit status 6) is told
// apart by its exit status, which is kept, with its output on both
// streams. Tests run it on captured machines (testdata/machines) in a
// node's userland (internal/nodeland), so it reads the real paths there too.
const probeScript = `exec 2>/dev/null
echo '@@fleet:uname'; uname -s; uname -m
echo '@@fleet:version'; cat /proc/version
echo '@@fleet:osrelease'; cat /proc/sys/kernel/osrelease
echo '@@fleet:meminfo'; cat /proc/meminfo
echo '@@fleet:cpuinfo'; grep -m1 '^model name' /proc/cpuinfo
smi=
if command -v nvidia-smi >/dev/null; then smi=nvidia-smi
elif [ -x /usr/lib/wsl/lib/nvidia-smi ]; then smi=/usr/lib/wsl/lib/nvidia-smi
fi
if [ -n "$smi" ]; then
echo '@@fleet:nvidia'; "$smi" --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits 2>&1
status=$?
echo '@@fleet:nvidiastatus'; echo "$status"
fi
echo '@@fleet:sysctl'; sysctl -n machdep.cpu.brand_string hw.memsize
echo '@@fleet:vmstat'; command -v vm_stat >/dev/null && vm_stat
echo '@@fleet:end'
exit 0
`

const sectionMarker = "@@fleet:"

// simulatedPlatform is implemented by transports of simulated nodes.
type simulatedPlatform interface {
	SimulatedPlatform() (fleet.Platform, bool)
}

// Probe learns a node's platform: OS, arch, WSL, chip, NVIDIA GPUs and
// memory. A sim node reports its profile's platform without running anything.
func Probe(ctx context.Context, t Transport) (fleet.Platform, error) {
	if s, ok := t.(simulatedPlatform); ok {
		if p, ok := s.SimulatedPlatform(); ok {
			return p, nil
		}
	}
	var out, errOut bytes.Buffer
	if err := t.Run(ctx, []string{"sh", "-c", probeScript}, nil, &out, &errOut); err != nil {
		return fleet.Platform{}, fmt.Errorf("probing node %s: %w", t.Name(), err)
	}
	p, err := ParseProbe(out.String())
	if err != nil {
		return fleet.Platform{}, fmt.Errorf("probing node %s: %w", t.Name(), err)
	}
	return p, nil
}

// ParseProbe turns the detection script's output into a platform.
func ParseProbe(out string) (fleet.Platform, error) {
	sec := splitSections(out)
	if _, ok := sec["end"]; !ok {
		return fleet.Platform{}, fmt.Errorf("detection script output is incomplete (no end marker); is the node's shell POSIX sh? got %q", truncate(out, 200))
	}
	uname := nonEmptyLines(sec["uname"])
	if len(uname) < 2 {
		return fleet.Platform{}, fmt.Errorf("uname printed %q, expected the kernel name and machine", sec["uname"])
	}
	p := fleet.Platform{OS: normalizeOS(uname[0]), Arch: normalizeArch(uname[1])}
	switch p.OS {
	case "linux":
		p.WSL = ParseWSL(sec["version"], sec["osrelease"])
		total, avail, err := ParseMeminfo(sec["meminfo"])
		if err != nil {
			return fleet.Platform{}, err
		}
		p.MemTotalBytes, p.MemFreeBytes = total, avail
		p.Chip = parseCPUInfoModel(sec["cpuinfo"])
		p.GPUs, p.GPUError = parseGPUs(sec)
	case "darwin":
		chip, memsize, err := ParseSysctl(sec["sysctl"])
		if err != nil {
			return fleet.Platform{}, err
		}
		p.Chip, p.MemTotalBytes = chip, memsize
		free, err := ParseVMStat(sec["vmstat"])
		if err != nil {
			return fleet.Platform{}, err
		}
		p.MemFreeBytes = free
	}
	p.Notes = platformNotes(p)
	return p, nil
}

// parseGPUs reads nvidia-smi's section. A failing nvidia-smi is a state of
// the node, not a failed probe: it yields no GPUs and what went wrong, with
// what to do, and the node serves on its CPU meanwhile.
func parseGPUs(sec map[string]string) ([]fleet.GPU, string) {
	out, ran := sec["nvidia"]
	if !ran {
		return nil, "" // no nvidia-smi: a CPU node
	}
	status := strings.TrimSpace(sec["nvidiastatus"])
	gpus, err := ParseNvidiaSMI(out)
	if status == "0" && err == nil {
		return gpus, ""
	}
	said := strings.Join(nonEmptyLines(out), "; ")
	what := fmt.Sprintf("nvidia-smi failed (exit status %s): %s", status, truncate(said, 300))
	if status == "0" {
		what = fmt.Sprintf("nvidia-smi printed what fleet cannot read: %v", err)
	}
	return nil, what + ". " + gpuAdvice(said) + "; the node serves on CPU until then, and vLLM is refused on it"
}

// gpuAdvice says what to do about what a failing nvidia-smi said.
func gpuAdvice(said string) string {
	switch {
	case strings.Contains(said, "Driver/library version mismatch"):
		return "The NVIDIA driver was upgraded while the old one is still loaded (unattended upgrades do this): reboot the node, or reinstall the driver"
	case strings.Contains(said, "No devices were found"):
		return "The driver sees no GPU: check that the GPU is seated and powered and that this driver supports it (`dmesg | grep NVRM` on the node), then reboot or reinstall the driver"
	case strings.Contains(said, "couldn't communicate with the NVIDIA driver"), strings.Contains(said, "Driver Not Loaded"):
		return "The NVIDIA driver is not loaded: reboot the node, or reinstall the driver"
	}
	return "Reboot the node, or reinstall the NVIDIA driver"
}

// platformNotes are what a probe found that changes what fleet does on the
// node, worded for its operator.
func platformNotes(p fleet.Platform) []string {
	var notes []string
	switch {
	case p.WSL && len(p.GPUs) > 0:
		notes = append(notes, "Windows/WSL2: its GPUs are the Windows driver's, seen through /usr/lib/wsl/lib; its memory is what WSL2 is given (.wslconfig), not the whole PC's")
	case p.WSL && p.GPUError == "":
		notes = append(notes, "Windows/WSL: no NVIDIA GPU seen (WSL2 sees the Windows driver's GPUs through /usr/lib/wsl/lib, WSL1 none): the node serves on CPU")
	}
	for _, g := range p.GPUs {
		if g.MemTotalMiB == 0 {
			notes = append(notes, g.Name+" reports no GPU memory of its own ([N/A]: unified memory): admission counts the system's available memory for it")
			break
		}
	}
	if p.OS == "darwin" && !p.AppleSilicon() {
		notes = append(notes, "Intel Mac: no Apple GPU, so llama.cpp runs on the CPU, and vllm-metal is refused (it needs Apple Silicon)")
	}
	return notes
}

func splitSections(out string) map[string]string {
	sections := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			sections[name] = body.String()
		}
		body.Reset()
	}
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), sectionMarker); ok {
			flush()
			name = rest
			continue
		}
		body.WriteString(line)
	}
	flush()
	return sections
}

func normalizeOS(s string) string {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "linux":
		return "linux"
	case "darwin":
		return "darwin"
	}
	return strings.ToLower(strings.TrimSpace(s))
}

func normalizeArch(s string) string {
	switch strings.TrimSpace(s) {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	}
	return strings.TrimSpace(s)
}

// ParseWSL reports a Windows Subsystem for Linux kernel: WSL1 says
// "Microsoft", WSL2 "microsoft-standard-WSL2". osrelease is the more precise
// source; /proc/version backs it up.
func ParseWSL(procVersion, osrelease string) bool {
	for _, s := range []string{osrelease, procVersion} {
		l := strings.ToLower(s)
		if strings.Contains(l, "microsoft") || strings.Contains(l, "wsl") {
			return true
		}
	}
	return false
}

// ParseMeminfo returns MemTotal and MemAvailable from /proc/meminfo, in
// bytes. Kernels older than 3.14 lack MemAvailable: it is then estimated as
// MemFree + Buffers + Cached, which over-counts slightly.
func ParseMeminfo(s string) (total, available uint64, err error) {
	fields := map[string]uint64{}
	for line := range strings.Lines(s) {
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, convErr := strconv.ParseUint(f[0], 10, 64)
		if convErr != nil {
			continue
		}
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			n *= 1024
		}
		fields[strings.TrimSpace(key)] = n
	}
	total, ok := fields["MemTotal"]
	if !ok {
		return 0, 0, fmt.Errorf("/proc/meminfo has no MemTotal line: got %q", truncate(s, 200))
	}
	available, ok = fields["MemAvailable"]
	if !ok {
		available = fields["MemFree"] + fields["Buffers"] + fields["Cached"]
	}
	return total, available, nil
}

// ParseNvidiaSMI reads `nvidia-smi --query-gpu=name,memory.total,memory.free
// --format=csv,noheader,nounits`: one "name, total MiB, free MiB" line per
// GPU, in index order. Unified-memory parts (DGX Spark, Jetson) print [N/A]
// for the memory figures, which become zero; callers fall back to system
// memory. Anything else (an error nvidia-smi printed) is an error.
func ParseNvidiaSMI(s string) ([]fleet.GPU, error) {
	var gpus []fleet.GPU
	for _, line := range nonEmptyLines(s) {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			return nil, fmt.Errorf("nvidia-smi line %q: expected name, memory.total, memory.free", line)
		}
		// A GPU name could hold a comma; the two memory figures are the last fields.
		name := strings.TrimSpace(strings.Join(f[:len(f)-2], ","))
		total, err := parseMiB(f[len(f)-2])
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi line %q: memory.total: %w", line, err)
		}
		free, err := parseMiB(f[len(f)-1])
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi line %q: memory.free: %w", line, err)
		}
		gpus = append(gpus, fleet.GPU{Name: name, MemTotalMiB: total, MemFreeMiB: free})
	}
	return gpus, nil
}

func parseMiB(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") { // [N/A], [Not Supported], [Unknown Error]
		return 0, nil
	}
	s = strings.TrimSpace(strings.TrimSuffix(s, "MiB"))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number of MiB", s)
	}
	return n, nil
}

// ParseSysctl reads `sysctl -n machdep.cpu.brand_string hw.memsize`: the
// chip's brand string, then installed memory in bytes.
func ParseSysctl(s string) (chip string, memsize uint64, err error) {
	lines := nonEmptyLines(s)
	if len(lines) < 2 {
		return "", 0, fmt.Errorf("sysctl printed %q, expected machdep.cpu.brand_string and hw.memsize", truncate(s, 200))
	}
	memsize, err = strconv.ParseUint(lines[len(lines)-1], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("sysctl hw.memsize %q is not a number of bytes", lines[len(lines)-1])
	}
	return strings.Join(lines[:len(lines)-1], " "), memsize, nil
}

var vmStatPageSize = regexp.MustCompile(`page size of (\d+) bytes`)

// ParseVMStat returns what macOS can hand out without swapping: pages free +
// inactive + speculative, times the page size read from vm_stat's header
// (16384 on Apple Silicon, 4096 on Intel; assuming 4096 under-counts 4×).
func ParseVMStat(s string) (uint64, error) {
	m := vmStatPageSize.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("vm_stat output has no \"page size of N bytes\" header: got %q", truncate(s, 200))
	}
	pageSize, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil || pageSize == 0 {
		return 0, fmt.Errorf("vm_stat page size %q is not a number", m[1])
	}
	want := map[string]bool{"Pages free": true, "Pages inactive": true, "Pages speculative": true}
	var pages uint64
	seen := 0
	for line := range strings.Lines(s) {
		key, rest, ok := strings.Cut(line, ":")
		if !ok || !want[strings.TrimSpace(key)] {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), "."), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("vm_stat line %q: not a page count", strings.TrimSpace(line))
		}
		pages += n
		seen++
	}
	if seen == 0 {
		return 0, fmt.Errorf("vm_stat output has no Pages free/inactive/speculative lines")
	}
	return pages * pageSize, nil
}

func parseCPUInfoModel(s string) string {
	_, model, ok := strings.Cut(s, ":")
	if !ok {
		return ""
	}
	return strings.TrimSpace(model)
}

// MemoryNeed is the memory an engine of m is predicted to take: the model's
// memory_gb (in GiB, as fleet.GiB writes memory), 0 when it declares none.
func MemoryNeed(m fleet.Model) uint64 {
	if m.MemoryGB <= 0 {
		return 0
	}
	return uint64(m.MemoryGB * (1 << 30))
}

func nonEmptyLines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
