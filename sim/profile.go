// Package sim is a real HTTP server that behaves like a vLLM or a llama-server
// worker: the same endpoints, wire shapes, metrics names, slots and queueing,
// with decode speeds calibrated on the machines of the seed reports. The demo
// and the tests run it where no GPU or Mac is at hand.
package sim

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"fleet"
)

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

// SpeedPoint is one measured point of a speed curve: with Concurrency
// requests decoding at once, the engine produces TotalTokPerSec tokens per
// second over all of them.
type SpeedPoint struct {
	Concurrency    int
	TotalTokPerSec float64
}

// Profile is a simulated machine: what its probe reports and how fast its
// engine decodes and prefills.
type Profile struct {
	Name     string
	Mimic    fleet.EngineKind
	Platform fleet.Platform
	// Curve holds total decode throughput at increasing concurrency. Empty
	// means no delays at all (the instant profile).
	Curve []SpeedPoint
	// GrowthBeyondCurve is the exponent of total throughput growth past the
	// last point: 0 keeps it flat (llama.cpp slots gain nothing more), vLLM's
	// continuous batching keeps gaining gently.
	GrowthBeyondCurve float64
	// PromptTokPerSec is the prefill speed; 0 means prefill is free.
	PromptTokPerSec float64
	// Slots is the default number of concurrent sequences: llama-server's
	// --parallel, vLLM's --max-num-seqs.
	Slots int
	// KVCacheTokens is how many tokens the KV cache holds, for
	// vllm:kv_cache_usage_perc.
	KVCacheTokens int
	// LoadTime is the default time to load the model before serving.
	LoadTime time.Duration
}

// TotalTokPerSec is the total decode throughput with n requests decoding at
// once, interpolated linearly between the curve's points.
func (p Profile) TotalTokPerSec(n int) float64 {
	if len(p.Curve) == 0 {
		return math.Inf(1)
	}
	if n < 1 {
		n = 1
	}
	first := p.Curve[0]
	if n <= first.Concurrency {
		// Below the first point each request runs at the single-request speed.
		return first.TotalTokPerSec / float64(first.Concurrency) * float64(n)
	}
	for i := 1; i < len(p.Curve); i++ {
		lo, hi := p.Curve[i-1], p.Curve[i]
		if n <= hi.Concurrency {
			frac := float64(n-lo.Concurrency) / float64(hi.Concurrency-lo.Concurrency)
			return lo.TotalTokPerSec + frac*(hi.TotalTokPerSec-lo.TotalTokPerSec)
		}
	}
	last := p.Curve[len(p.Curve)-1]
	return last.TotalTokPerSec * math.Pow(float64(n)/float64(last.Concurrency), p.GrowthBeyondCurve)
}

// TokenDelay is the time between two tokens of one request while n requests
// decode at once; zero for a profile without delays.
func (p Profile) TokenDelay(n int) time.Duration {
	if len(p.Curve) == 0 {
		return 0
	}
	if n < 1 {
		n = 1
	}
	return time.Duration(float64(n) / p.TotalTokPerSec(n) * float64(time.Second))
}

// PrefillDelay is the time to process a prompt of the given length.
func (p Profile) PrefillDelay(promptTokens int) time.Duration {
	if p.PromptTokPerSec <= 0 || promptTokens <= 0 {
		return 0
	}
	return time.Duration(float64(promptTokens) / p.PromptTokPerSec * float64(time.Second))
}

func rtx3060Node(name string) fleet.Platform {
	gpus := make([]fleet.GPU, 8)
	for i := range gpus {
		gpus[i] = fleet.GPU{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288, MemFreeMiB: 12036}
	}
	return fleet.Platform{
		OS: "linux", Arch: "amd64", Chip: "AMD Ryzen Threadripper 3960X 24-Core Processor",
		GPUs: gpus, MemTotalBytes: 128 * gib, MemFreeBytes: 117 * gib, Profile: name,
	}
}

// profiles builds the table afresh on every call so no caller can change
// another's copy.
func profiles() []Profile {
	return []Profile{
		{
			Name: "rtx3060-vllm", Mimic: fleet.EngineVLLM, Platform: rtx3060Node("rtx3060-vllm"),
			Curve:             []SpeedPoint{{1, 90}, {2, 170}, {4, 320}},
			GrowthBeyondCurve: 0.8, PromptTokPerSec: 4000, Slots: 64, KVCacheTokens: 98304,
			LoadTime: 3 * time.Second,
		},
		{
			Name: "rtx5060ti-vllm", Mimic: fleet.EngineVLLM,
			Platform: fleet.Platform{
				OS: "linux", Arch: "amd64", WSL: true, Chip: "13th Gen Intel(R) Core(TM) i7-13700K",
				GPUs:          []fleet.GPU{{Name: "NVIDIA GeForce RTX 5060 Ti", MemTotalMiB: 16311, MemFreeMiB: 15007}},
				MemTotalBytes: 32 * gib, MemFreeBytes: 27 * gib, Profile: "rtx5060ti-vllm",
			},
			Curve:             []SpeedPoint{{1, 96}, {2, 180}, {4, 330}},
			GrowthBeyondCurve: 0.8, PromptTokPerSec: 5000, Slots: 32, KVCacheTokens: 131072,
			LoadTime: 3 * time.Second,
		},
		{
			Name: "m1ultra-llamacpp", Mimic: fleet.EngineLlamaCpp,
			Platform: fleet.Platform{
				OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra",
				MemTotalBytes: 64 * gib, MemFreeBytes: 41 * gib, Profile: "m1ultra-llamacpp",
			},
			Curve:           []SpeedPoint{{1, 80}, {2, 102}, {4, 139}},
			PromptTokPerSec: 250, Slots: 4, KVCacheTokens: 65536, LoadTime: time.Second,
		},
		{
			Name: "m4max-llamacpp", Mimic: fleet.EngineLlamaCpp,
			Platform: fleet.Platform{
				OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max",
				MemTotalBytes: 36 * gib, MemFreeBytes: 22 * gib, Profile: "m4max-llamacpp",
			},
			Curve:           []SpeedPoint{{1, 87}, {2, 130}, {4, 136}},
			PromptTokPerSec: 590, Slots: 4, KVCacheTokens: 65536, LoadTime: time.Second,
		},
		{
			Name: "m1ultra-27b-starved", Mimic: fleet.EngineLlamaCpp,
			Platform: fleet.Platform{
				OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra",
				MemTotalBytes: 64 * gib, MemFreeBytes: 6 * gib, Profile: "m1ultra-27b-starved",
			},
			Curve:           []SpeedPoint{{1, 10.7}, {2, 12.8}, {4, 15}},
			PromptTokPerSec: 50, Slots: 4, KVCacheTokens: 32768, LoadTime: 3 * time.Second,
		},
		{
			Name: "instant", Mimic: fleet.EngineLlamaCpp,
			Platform: fleet.Platform{
				OS: "linux", Arch: "amd64", Chip: "Simulated CPU",
				MemTotalBytes: 16 * gib, MemFreeBytes: 12 * gib, Profile: "instant",
			},
			Slots: 4, KVCacheTokens: 65536,
		},
	}
}

// ProfileNames lists the known profiles, sorted.
func ProfileNames() []string {
	ps := profiles()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	sort.Strings(names)
	return names
}

// LookupProfile returns the named profile.
func LookupProfile(name string) (Profile, error) {
	for _, p := range profiles() {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("unknown sim profile %q: use one of %s", name, strings.Join(ProfileNames(), ", "))
}
