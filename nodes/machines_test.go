package nodes

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/nodeland"
)

// machinesDir holds the captured outputs of real machines.
var machinesDir = filepath.Join("..", "testdata", "machines")

// landNode is a node whose userland is a captured machine's, built by
// internal/nodeland: commands run there as that node's sshd would run them.
type landNode struct {
	*nodeland.Land
	name string
}

func (n landNode) Close() error { return nil }
func (n landNode) Name() string { return n.name }

// probeMachine runs the real probe (Probe, through a transport) on a
// captured machine of testdata/machines, in a node's userland: a Mac-like
// one for a folder without proc/ (sh is bash in POSIX mode, /proc hidden,
// macOS sshd's PATH), a Linux-like one otherwise (Debian's sh, its proc/
// over /proc, its usr/ over /usr); the folder's bin/ comes first on PATH.
func probeMachine(t *testing.T, name string) fleet.Platform {
	t.Helper()
	return probeMachineWith(t, name, false)
}

// probeMachineWith is probeMachine, with sh bash in POSIX mode on a Linux
// machine too when bashSh (Fedora's, RHEL's).
func probeMachineWith(t *testing.T, name string, bashSh bool) fleet.Platform {
	t.Helper()
	dir := filepath.Join(machinesDir, name)
	if _, err := os.Stat(filepath.Join(dir, "PROVENANCE")); err != nil {
		t.Fatalf("captured machine %s has no PROVENANCE: %v", name, err)
	}
	kind := nodeland.Linux
	if _, err := os.Stat(filepath.Join(dir, "proc")); errors.Is(err, fs.ErrNotExist) {
		kind = nodeland.Mac
	}
	land := nodeland.New(t, nodeland.Options{Kind: kind, Machine: dir, BashSh: bashSh})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Probe(ctx, landNode{land, name})
	if err != nil {
		t.Fatalf("the probe on %s: %v", name, err)
	}
	return p
}

// The probe on the captured outputs of real machines, each in a node's
// userland as its sshd would run it: what each is found to be, its memory
// with the page size vm_stat gives, and the failures of nvidia-smi as
// states of the node (no GPU, what went wrong, what to do) rather than a
// probe that fails.
func TestProbeOnCapturedMachines(t *testing.T) {
	const kib = 1024
	tests := []struct {
		machine   string
		os, arch  string
		wsl       bool
		chip      string
		gpuLabel  string
		hostLabel string
		gpuFree   []int64 // MiB, per GPU in index order
		memTotal  uint64
		memFree   uint64
		usable    uint64 // what admission counts on
		engine    fleet.EngineKind
		gpuError  []string // all in Platform.GPUError; none: no error
		note      string   // in one of Platform.Notes; "": no notes
	}{
		{
			machine: "mac-m4-max", os: "darwin", arch: "arm64", chip: "Apple M4 Max",
			gpuLabel: "Apple M4 Max", hostLabel: "macOS",
			// free + inactive + speculative pages of 16 KiB
			memTotal: 68719476736, memFree: (3857 + 443760 + 1075) * 16384, engine: fleet.EngineLlamaCpp,
			usable: (3857 + 443760 + 1075) * 16384 / 4 * 3, // Metal's working-set limit keeps a quarter
		},
		{
			// A vm_stat without a "Pages speculative" line.
			machine: "mac-m3-max", os: "darwin", arch: "arm64", chip: "Apple M3 Max",
			gpuLabel: "Apple M3 Max", hostLabel: "macOS",
			memTotal: 38654705664, memFree: (61996 + 377102) * 16384, engine: fleet.EngineLlamaCpp,
			usable: (61996 + 377102) * 16384 / 4 * 3,
		},
		{
			machine: "mac-intel", os: "darwin", arch: "amd64", chip: "Intel(R) Core(TM) i7-6700K CPU @ 4.00GHz",
			gpuLabel: "CPU", hostLabel: "macOS",
			// pages of 4 KiB: counted as 16 KiB they would be 4× this
			memTotal: 34359738368, memFree: (6127229 + 628646 + 430715) * 4096, engine: fleet.EngineLlamaCpp,
			usable: (6127229 + 628646 + 430715) * 4096 / 4 * 3,
			note:   "Intel Mac: no Apple GPU",
		},
		{
			machine: "nvidia-8x3090", os: "linux", arch: "amd64",
			gpuLabel: "8x RTX 3090", hostLabel: "Linux",
			gpuFree:  []int64{6167, 7412, 24556, 24558, 24558, 24558, 24558, 24558},
			memTotal: 131451992 * kib, memFree: 122634812 * kib, engine: fleet.EngineVLLM,
			usable: (6167 + 7412 + 24556 + 5*24558) * mib, // free GPU memory, summed
		},
		{
			// No MemAvailable: MemFree (+ Buffers + Cached, absent) stands for it.
			machine: "dgx-spark-gb10", os: "linux", arch: "arm64",
			gpuLabel: "GB10", hostLabel: "Linux", gpuFree: []int64{0},
			memTotal: 125489508 * kib, memFree: 7789944 * kib, engine: fleet.EngineVLLM,
			usable: 7789944 * kib, // no GPU memory of its own: the system's
			note:   "NVIDIA GB10 reports no GPU memory of its own",
		},
		{
			// nvidia-smi only in /usr/lib/wsl/lib, not on PATH.
			machine: "wsl2-rtx5080", os: "linux", arch: "amd64", wsl: true, chip: "AMD Ryzen 7 9800X3D 8-Core Processor",
			gpuLabel: "RTX 5080", hostLabel: "Windows/WSL", gpuFree: []int64{15165},
			memTotal: 31635538 * kib, memFree: 29779558 * kib, engine: fleet.EngineVLLM,
			usable: 15165 * mib,
			note:   "Windows/WSL2: its GPUs are the Windows driver's",
		},
		{
			machine: "nvidia-no-devices", os: "linux", arch: "amd64",
			gpuLabel: "CPU (GPU failed)", hostLabel: "Linux",
			memTotal: 8028488 * kib, memFree: 3412188 * kib, engine: fleet.EngineLlamaCpp,
			usable:   3412188 * kib, // on CPU: MemAvailable
			gpuError: []string{"exit status 6", "No devices were found", "reboot or reinstall the driver", "serves on CPU until then"},
		},
		{
			machine: "nvidia-driver-mismatch", os: "linux", arch: "amd64",
			gpuLabel: "CPU (GPU failed)", hostLabel: "Linux",
			memTotal: 65843852 * kib, memFree: 55479564 * kib, engine: fleet.EngineLlamaCpp,
			usable:   55479564 * kib,
			gpuError: []string{"exit status 18", "Driver/library version mismatch; NVML library version: 535.161", "reboot the node, or reinstall the driver", "serves on CPU until then", "vLLM is refused"},
		},
	}
	entries, err := os.ReadDir(machinesDir)
	if err != nil {
		t.Fatal(err)
	}
	var folders, tabled []string
	for _, e := range entries {
		if e.IsDir() {
			folders = append(folders, e.Name())
		}
	}
	for _, tt := range tests {
		tabled = append(tabled, tt.machine)
	}
	slices.Sort(tabled)
	if !slices.Equal(folders, tabled) {
		t.Errorf("testdata/machines holds %q, this table %q: every captured machine needs its expected platform here", folders, tabled)
	}
	for _, tt := range tests {
		t.Run(tt.machine, func(t *testing.T) {
			p := probeMachine(t, tt.machine)
			if p.OS != tt.os || p.Arch != tt.arch || p.WSL != tt.wsl || p.Chip != tt.chip {
				t.Errorf("os/arch/wsl/chip = %q/%q/%v/%q, want %q/%q/%v/%q", p.OS, p.Arch, p.WSL, p.Chip, tt.os, tt.arch, tt.wsl, tt.chip)
			}
			if got := p.GPULabel(); got != tt.gpuLabel {
				t.Errorf("GPULabel = %q, want %q", got, tt.gpuLabel)
			}
			if got := p.HostLabel(); got != tt.hostLabel {
				t.Errorf("HostLabel = %q, want %q", got, tt.hostLabel)
			}
			var free []int64
			for _, g := range p.GPUs {
				free = append(free, g.MemFreeMiB)
			}
			if !slices.Equal(free, tt.gpuFree) {
				t.Errorf("GPU free MiB = %v, want %v", free, tt.gpuFree)
			}
			if p.MemTotalBytes != tt.memTotal || p.MemFreeBytes != tt.memFree {
				t.Errorf("memory total/free = %d/%d, want %d/%d", p.MemTotalBytes, p.MemFreeBytes, tt.memTotal, tt.memFree)
			}
			if got := p.UsableMemory(); got != tt.usable {
				t.Errorf("UsableMemory = %d, want %d", got, tt.usable)
			}
			if got := p.DefaultEngine(); got != tt.engine {
				t.Errorf("DefaultEngine = %q, want %q", got, tt.engine)
			}
			if len(tt.gpuError) == 0 && p.GPUError != "" {
				t.Errorf("GPUError = %q, want none", p.GPUError)
			}
			for _, want := range tt.gpuError {
				if !strings.Contains(p.GPUError, want) {
					t.Errorf("GPUError = %q, want it to say %q", p.GPUError, want)
				}
			}
			notes := strings.Join(p.Notes, "\n")
			if tt.note == "" && notes != "" || !strings.Contains(notes, tt.note) {
				t.Errorf("notes = %q, want %q", notes, tt.note)
			}
			if tt.os == "linux" {
				// A Mac's sh is bash already; a Linux box's may be too.
				if b := probeMachineWith(t, tt.machine, true); !reflect.DeepEqual(b, p) {
					t.Errorf("with sh bash in POSIX mode the probe found %+v, with dash %+v", b, p)
				}
			}
		})
	}
}

// Failure 3 of issue 27: a node whose nvidia-smi fails (the driver upgraded
// under the loaded module) is up, shows a CPU platform with what is wrong,
// an event says what to do, and a llama.cpp worker serves on it.
func TestFailingGPUIsANodeStateWithAnEvent(t *testing.T) {
	mismatch := probeMachine(t, "nvidia-driver-mismatch")
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.SimPlatform = func(string) (fleet.Platform, error) { return mismatch, nil }
	})
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "rig"))
	h.run()

	h.waitReady("rig/qwen3-4b")
	if !h.rec.eventLike("node up: Linux, CPU (GPU failed)") {
		t.Errorf("no node up event shows the failed GPU:\n%s", h.rec.dump())
	}
	if !h.rec.eventLike("Driver/library version mismatch; NVML library version: 535.161. The NVIDIA driver was upgraded while the old one is still loaded (unattended upgrades do this): reboot the node, or reinstall the driver; the node serves on CPU until then") {
		t.Errorf("no event says what is wrong and what to do:\n%s", h.rec.dump())
	}
	h.rec.mu.Lock()
	last := h.rec.nodes[len(h.rec.nodes)-1]
	h.rec.mu.Unlock()
	if last.State != fleet.NodeUp || last.Platform == nil || last.Platform.GPUError == "" || len(last.Platform.GPUs) != 0 {
		t.Errorf("node rig = %s %+v, want up with no GPU and the GPU error", last.State, last.Platform)
	}
}

// A GPU that fails while its node stays up (an unattended driver upgrade)
// is warned about once per failure, and its recovery (a reboot) told.
func TestPlatformEventsOnAGPUThatFailsAndRecovers(t *testing.T) {
	mismatch, noDevices, healthy := probeMachine(t, "nvidia-driver-mismatch"), probeMachine(t, "nvidia-no-devices"), probeMachine(t, "nvidia-8x3090")
	rec := &recorder{}
	m := &Manager{opts: ManagerOptions{OnEvent: rec.event}}
	steps := []struct {
		prev, now *fleet.Platform
		cameUp    bool
		want      []string // the events' level and start, in order
	}{
		{nil, &healthy, true, []string{"info node up: Linux, 8x RTX 3090, 157.2 GiB usable (at most 24.0 GiB on one GPU)"}},
		{&healthy, &healthy, false, nil},
		{&healthy, &mismatch, false, []string{"warn nvidia-smi failed (exit status 18)"}},
		{&mismatch, &mismatch, false, nil},
		{&mismatch, &noDevices, false, []string{"warn nvidia-smi failed (exit status 6)"}},
		{&noDevices, &healthy, false, []string{"info nvidia-smi answers again: 8x RTX 3090"}},
		{&healthy, &mismatch, true, []string{"info node up: Linux, CPU (GPU failed)", "warn nvidia-smi failed (exit status 18)"}},
	}
	for i, s := range steps {
		rec.events = nil
		m.platformEvents(fleet.Node{Name: "rig", Platform: s.now}, s.prev, s.cameUp)
		var got []string
		for _, e := range rec.events {
			got = append(got, e.Level+" "+e.Message)
		}
		if len(got) != len(s.want) {
			t.Errorf("step %d: events %q, want %q", i, got, s.want)
			continue
		}
		for j := range got {
			if !strings.HasPrefix(got[j], s.want[j]) {
				t.Errorf("step %d: event %q, want it to start %q", i, got[j], s.want[j])
			}
		}
	}
}
