package nodes

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"fleet"
)

const mib = 1 << 20

func TestParseProbeFixtures(t *testing.T) {
	tests := []struct {
		file      string
		os, arch  string
		wsl       bool
		chip      string
		gpus      int
		gpuLabel  string
		hostLabel string
		memTotal  uint64
		memFree   uint64
		usable    uint64
		engine    fleet.EngineKind
	}{
		{
			file: "macos-m1-ultra.txt", os: "darwin", arch: "arm64", chip: "Apple M1 Ultra",
			gpuLabel: "Apple M1 Ultra", hostLabel: "macOS",
			memTotal: 137438953472, memFree: (1000000 + 2000000 + 50000) * 16384,
			usable: (1000000 + 2000000 + 50000) * 16384 / 4 * 3, engine: fleet.EngineLlamaCpp,
		},
		{
			file: "macos-m4-max.txt", os: "darwin", arch: "arm64", chip: "Apple M4 Max",
			gpuLabel: "Apple M4 Max", hostLabel: "macOS",
			memTotal: 68719476736, memFree: (500000 + 1200000 + 30000) * 16384,
			usable: (500000 + 1200000 + 30000) * 16384 / 4 * 3, engine: fleet.EngineLlamaCpp,
		},
		{
			file: "macos-intel.txt", os: "darwin", arch: "amd64", chip: "Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz",
			gpuLabel: "CPU", hostLabel: "macOS",
			memTotal: 34359738368, memFree: (1000000 + 2000000 + 50000) * 4096,
			usable: (1000000 + 2000000 + 50000) * 4096 / 4 * 3, engine: fleet.EngineLlamaCpp,
		},
		{
			file: "linux-8x-rtx3060.txt", os: "linux", arch: "amd64", chip: "AMD Ryzen 9 5950X 16-Core Processor",
			gpus: 8, gpuLabel: "8x RTX 3060", hostLabel: "Linux",
			memTotal: 65842084 * 1024, memFree: 60123456 * 1024,
			// free MiB per GPU is 11954-i for i = 1..8
			usable: (8*11954 - 36) * mib, engine: fleet.EngineVLLM,
		},
		{
			file: "dgx-spark.txt", os: "linux", arch: "arm64",
			gpus: 1, gpuLabel: "GB10", hostLabel: "Linux",
			memTotal: 127535744 * 1024, memFree: 119000000 * 1024,
			usable: 119000000 * 1024, engine: fleet.EngineVLLM,
		},
		{
			file: "wsl-rtx5060ti.txt", os: "linux", arch: "amd64", wsl: true, chip: "13th Gen Intel(R) Core(TM) i7-13700K",
			gpus: 1, gpuLabel: "RTX 5060 Ti", hostLabel: "Windows/WSL",
			memTotal: 32803484 * 1024, memFree: 29001234 * 1024,
			usable: 15140 * mib, engine: fleet.EngineVLLM,
		},
		{
			file: "linux-cpu.txt", os: "linux", arch: "amd64", chip: "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
			gpuLabel: "CPU", hostLabel: "Linux",
			memTotal: 16314040 * 1024, memFree: 12001234 * 1024,
			usable: 12001234 * 1024, engine: fleet.EngineLlamaCpp,
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "probe", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			p, err := ParseProbe(string(raw))
			if err != nil {
				t.Fatalf("ParseProbe: %v", err)
			}
			if p.OS != tt.os || p.Arch != tt.arch || p.WSL != tt.wsl || p.Chip != tt.chip {
				t.Errorf("os/arch/wsl/chip = %q/%q/%v/%q, want %q/%q/%v/%q", p.OS, p.Arch, p.WSL, p.Chip, tt.os, tt.arch, tt.wsl, tt.chip)
			}
			if len(p.GPUs) != tt.gpus {
				t.Errorf("%d GPUs, want %d: %+v", len(p.GPUs), tt.gpus, p.GPUs)
			}
			if got := p.GPULabel(); got != tt.gpuLabel {
				t.Errorf("GPULabel = %q, want %q", got, tt.gpuLabel)
			}
			if got := p.HostLabel(); got != tt.hostLabel {
				t.Errorf("HostLabel = %q, want %q", got, tt.hostLabel)
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
		})
	}
}

func TestParseNvidiaSMI(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []fleet.GPU
		wantErr string
	}{
		{"none", "", nil, ""},
		{"one", "NVIDIA GeForce RTX 3060, 12288, 11000\n", []fleet.GPU{{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288, MemFreeMiB: 11000}}, ""},
		{"unified memory", "NVIDIA GB10, [N/A], [N/A]\n", []fleet.GPU{{Name: "NVIDIA GB10"}}, ""},
		{"not supported", "Orin, [Not Supported], [Not Supported]", []fleet.GPU{{Name: "Orin"}}, ""},
		{"units left on", "NVIDIA A100-SXM4-80GB, 81920 MiB, 80000 MiB", []fleet.GPU{{Name: "NVIDIA A100-SXM4-80GB", MemTotalMiB: 81920, MemFreeMiB: 80000}}, ""},
		{"crlf and blank lines", "\r\nNVIDIA L4, 23034, 22000\r\n\r\n", []fleet.GPU{{Name: "NVIDIA L4", MemTotalMiB: 23034, MemFreeMiB: 22000}}, ""},
		// A failure nvidia-smi prints is not a GPU line; ParseProbe turns it
		// into the platform's GPUError (TestProbeOnCapturedMachines).
		{"driver failure is an error", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", nil, "expected name, memory.total, memory.free"},
		{"too few fields", "NVIDIA L4, 23034", nil, "expected name, memory.total, memory.free"},
		{"garbage figure", "NVIDIA L4, lots, 1", nil, "memory.total"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseNvidiaSMI(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("GPU %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParseVMStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    uint64
		wantErr string
	}{
		{"apple silicon page size", "Mach Virtual Memory Statistics: (page size of 16384 bytes)\nPages free: 10.\nPages active: 999.\nPages inactive: 20.\nPages speculative: 3.\n", 33 * 16384, ""},
		{"intel page size", "Mach Virtual Memory Statistics: (page size of 4096 bytes)\nPages free: 10.\nPages inactive: 20.\nPages speculative: 3.\n", 33 * 4096, ""},
		{"purgeable and wired are not free", "Mach Virtual Memory Statistics: (page size of 16384 bytes)\nPages free: 1.\nPages wired down: 1000.\nPages purgeable: 1000.\n", 16384, ""},
		{"no header", "Pages free: 10.\n", 0, "page size"},
		{"no page lines", "Mach Virtual Memory Statistics: (page size of 16384 bytes)\n", 0, "no Pages free"},
		{"bad count", "Mach Virtual Memory Statistics: (page size of 16384 bytes)\nPages free: many.\n", 0, "not a page count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVMStat(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseVMStat = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name         string
		in           string
		total, avail uint64
		wantErr      bool
	}{
		{"available", "MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable: 60 kB\n", 100 * 1024, 60 * 1024, false},
		{"old kernel estimates", "MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 5 kB\nCached: 20 kB\n", 100 * 1024, 35 * 1024, false},
		{"no total", "MemFree: 10 kB\n", 0, 0, true},
		{"empty", "", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total, avail, err := ParseMeminfo(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if total != tt.total || avail != tt.avail {
				t.Errorf("got %d/%d, want %d/%d", total, avail, tt.total, tt.avail)
			}
		})
	}
}

func TestParseWSL(t *testing.T) {
	tests := []struct {
		version, osrelease string
		want               bool
	}{
		{"Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com)", "4.4.0-19041-Microsoft", true},
		{"Linux version 5.15.167.4-microsoft-standard-WSL2", "5.15.167.4-microsoft-standard-WSL2", true},
		{"", "6.6.36.6-microsoft-standard-WSL2", true},
		{"Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)", "6.8.0-45-generic", false},
		{"", "", false},
	}
	for _, tt := range tests {
		if got := ParseWSL(tt.version, tt.osrelease); got != tt.want {
			t.Errorf("ParseWSL(%q, %q) = %v, want %v", tt.version, tt.osrelease, got, tt.want)
		}
	}
}

func TestParseProbeRejectsTruncatedOutput(t *testing.T) {
	for _, in := range []string{"", "@@fleet:uname\nLinux\n", "fish: Unknown command\n"} {
		if _, err := ParseProbe(in); err == nil {
			t.Errorf("ParseProbe(%q) succeeded; want an error", in)
		}
	}
}

// TestProbeLocal runs the real detection script on this machine.
func TestProbeLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := Open(ctx, fleet.Node{Name: "here", Address: "local"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Probe(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if p.OS != runtime.GOOS || p.Arch != runtime.GOARCH {
		t.Errorf("probe says %s/%s, this test runs on %s/%s", p.OS, p.Arch, runtime.GOOS, runtime.GOARCH)
	}
	if p.MemTotalBytes == 0 || p.MemFreeBytes == 0 || p.MemFreeBytes > p.MemTotalBytes {
		t.Errorf("implausible memory: total %d, free %d", p.MemTotalBytes, p.MemFreeBytes)
	}
	if p.UsableMemory() == 0 {
		t.Error("UsableMemory is zero on a running machine")
	}
}

func TestProbeSimReportsProfilePlatform(t *testing.T) {
	profiles := map[string]fleet.Platform{
		"m4max-llamacpp": {OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max", MemTotalBytes: 64 << 30, MemFreeBytes: 40 << 30},
	}
	lookup := func(name string) (fleet.Platform, error) {
		p, ok := profiles[name]
		if !ok {
			return fleet.Platform{}, os.ErrNotExist
		}
		return p, nil
	}
	ctx := context.Background()
	tr, err := Open(ctx, fleet.Node{Name: "max", Address: "sim:m4max-llamacpp"}, Options{SimPlatform: lookup, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Probe(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if p.Chip != "Apple M4 Max" || p.HostLabel() != "macOS" || p.Profile != "m4max-llamacpp" {
		t.Errorf("sim probe = %+v", p)
	}
	if _, err := Open(ctx, fleet.Node{Name: "x", Address: "sim:nope"}, Options{SimPlatform: lookup}); err == nil || !strings.Contains(err.Error(), `sim profile "nope"`) {
		t.Errorf("unknown profile: err = %v", err)
	}
}
