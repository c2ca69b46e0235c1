package nodes

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"fleet"
)

const mib = 1 << 20

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
