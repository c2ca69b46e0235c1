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
const probeScript = `exec 2>/dev/null
echo '@@fleet:uname'; uname -s; uname -m
echo '@@fleet:version'; cat /proc/version
echo '@@fleet:osrelease'; cat /proc/sys/kernel/osrelease
echo '@@fleet:meminfo'; cat /proc/meminfo
echo '@@fleet:cpuinfo'; grep -m1 '^model name' /proc/cpuinfo
echo '@@fleet:nvidia'
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits
elif [ -x /usr/lib/wsl/lib/nvidia-smi ]; then /usr/lib/wsl/lib/nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits
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
		gpus, err := ParseNvidiaSMI(sec["nvidia"])
		if err != nil {
			return fleet.Platform{}, err
		}
		p.GPUs = gpus
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
	return p, nil
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
// GPU. Unified-memory parts (DGX Spark, Jetson) print [N/A] for the memory
// figures, which become zero; callers fall back to system memory.
func ParseNvidiaSMI(s string) ([]fleet.GPU, error) {
	var gpus []fleet.GPU
	for _, line := range nonEmptyLines(s) {
		if strings.HasPrefix(line, "NVIDIA-SMI has failed") || strings.Contains(line, "command not found") {
			continue
		}
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
