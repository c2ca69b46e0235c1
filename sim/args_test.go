package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, o Options)
		wantErr string
	}{
		{
			name: "hub llama launch line",
			args: strings.Fields("--mimic llamacpp --profile m4max-llamacpp -- -m Qwen3-4B-Q4_K_M.gguf -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18001 -np 4 --kv-unified --jinja --reasoning-format none"),
			check: func(t *testing.T, o Options) {
				want := Options{Mimic: fleet.EngineLlamaCpp, Host: "127.0.0.1", Port: 18001, ModelPath: "Qwen3-4B-Q4_K_M.gguf",
					Ctx: 16384, TotalCtx: 16384, Slots: 4, KVUnified: true, Jinja: true, ReasoningFormat: ReasoningNone}
				got := Options{Mimic: o.Mimic, Host: o.Host, Port: o.Port, ModelPath: o.ModelPath, Ctx: o.Ctx, TotalCtx: o.TotalCtx,
					Slots: o.Slots, KVUnified: o.KVUnified, Jinja: o.Jinja, ReasoningFormat: o.ReasoningFormat}
				if !equalOptions(got, want) || o.ModelID() != "qwen3-4b" || o.Profile.Name != "m4max-llamacpp" {
					t.Errorf("got %+v (model %q), want %+v", got, o.ModelID(), want)
				}
			},
		},
		{
			name: "explicit -np without --kv-unified splits the context",
			args: strings.Fields("--profile m1ultra-llamacpp -- -m w.gguf -c 2048 -np 2"),
			check: func(t *testing.T, o Options) {
				if o.Ctx != 1024 || o.TotalCtx != 2048 || o.Slots != 2 {
					t.Errorf("ctx %d total %d slots %d, want 1024/2048/2", o.Ctx, o.TotalCtx, o.Slots)
				}
			},
		},
		{
			name: "llama defaults: auto slots keep the whole context, jinja on, reasoning auto, port 8080",
			args: strings.Fields("--profile m4max-llamacpp -- -m w.gguf -c 8192 -ngl 99 --flash-attn on --no-mmap --metrics"),
			check: func(t *testing.T, o Options) {
				if o.Ctx != 8192 || o.Slots != 4 || !o.Jinja || o.ReasoningFormat != ReasoningAuto || o.Port != 8080 || !o.MetricsEnabled {
					t.Errorf("got %+v", o)
				}
				if o.ModelID() != "w.gguf" {
					t.Errorf("model id %q, want the -m path", o.ModelID())
				}
			},
		},
		{
			name: "llama -np auto is a unified KV cache whatever -no-kvu says; --no-cache-idle-slots",
			args: strings.Fields("--profile m4max-llamacpp -- -m w.gguf -no-kvu --no-cache-idle-slots"),
			check: func(t *testing.T, o Options) {
				if !o.KVUnified || !o.NoCacheIdleSlots {
					t.Errorf("kv unified %v, no cache idle slots %v; want both", o.KVUnified, o.NoCacheIdleSlots)
				}
			},
		},
		{
			name: "llama explicit -np keeps a split KV cache; idle slots cached by default",
			args: strings.Fields("--profile m4max-llamacpp -- -m w.gguf -np 2 --no-cache-idle-slots --cache-idle-slots"),
			check: func(t *testing.T, o Options) {
				if o.KVUnified || o.NoCacheIdleSlots {
					t.Errorf("kv unified %v, no cache idle slots %v; want neither", o.KVUnified, o.NoCacheIdleSlots)
				}
			},
		},
		{
			name: "llama --no-jinja, deepseek-legacy, chat template kwargs, inline values",
			args: []string{"--profile", "instant", "--", "--no-jinja", "--reasoning-format=deepseek-legacy", "--alias=a,b",
				"--chat-template-kwargs", `{"enable_thinking":false}`, "--unknown-flag", "value", "-c", "4096"},
			check: func(t *testing.T, o Options) {
				if o.Jinja || o.ReasoningFormat != ReasoningDeepSeekLegacy || o.ThinkingByDefault || !slices.Equal(o.ServedNames, []string{"a", "b"}) || o.Ctx != 4096 {
					t.Errorf("got %+v", o)
				}
			},
		},
		{
			name: "vllm recipe",
			args: strings.Fields("--mimic vllm --profile rtx3060-vllm -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b qwen3 --max-model-len 16K --host 127.0.0.1 --port 18002 --tensor-parallel-size 1 --data-parallel-size 3 --max-num-seqs 48 --reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes --enable-force-include-usage --gpu-memory-utilization 0.9"),
			check: func(t *testing.T, o Options) {
				if o.ModelPath != "Qwen/Qwen3-4B-AWQ" || !slices.Equal(o.ServedNames, []string{"qwen3-4b", "qwen3"}) || o.Ctx != 16384 ||
					o.Port != 18002 || o.Slots != 48 || o.ReasoningParser != "qwen3" || !o.AutoToolChoice || o.ToolCallParser != "hermes" ||
					!o.ForceIncludeUsage || !o.MetricsEnabled {
					t.Errorf("got %+v", o)
				}
			},
		},
		{
			name: "vllm defaults",
			args: strings.Fields("--profile rtx5060ti-vllm -- serve Qwen/Qwen3-4B-AWQ"),
			check: func(t *testing.T, o Options) {
				if o.Mimic != fleet.EngineVLLM || o.ModelID() != "Qwen/Qwen3-4B-AWQ" || o.Port != 8000 || o.Slots != 32 ||
					o.Ctx != defaultTrainCtx || o.ReasoningParser != "" || o.AutoToolChoice {
					t.Errorf("got %+v", o)
				}
			},
		},
		{
			name: "cold start: the profile's, or the flag's",
			args: strings.Fields("--profile m4max-llamacpp --cold-start 0s -- -m w.gguf"),
			check: func(t *testing.T, o Options) {
				if p, _ := LookupProfile("m4max-llamacpp"); p.ColdStart <= 0 || o.ColdStart != 0 {
					t.Errorf("profile cold start %v, flag --cold-start 0s gave %v; want a profile default and 0", p.ColdStart, o.ColdStart)
				}
				if d, _ := ParseArgs(strings.Fields("--profile m4max-llamacpp -- -m w.gguf")); d.ColdStart != 2*time.Second {
					t.Errorf("default cold start %v, want the profile's 2s", d.ColdStart)
				}
			},
		},
		{
			name: "sim flags win over engine flags",
			args: strings.Fields("--mimic vllm --profile instant --port 0 --host ::1 --served-name x --ctx 2048 --slots 3 --seed 9 --load-time 250ms -- serve m --port 9000 --max-model-len 4096"),
			check: func(t *testing.T, o Options) {
				if o.Port != 0 || o.Host != "::1" || o.ModelID() != "x" || o.Ctx != 2048 || o.Slots != 3 || o.Seed != 9 || o.LoadTime != 250*time.Millisecond {
					t.Errorf("got %+v", o)
				}
			},
		},
		{name: "no profile", args: []string{"--mimic", "vllm"}, wantErr: "--profile is required"},
		{name: "unknown profile", args: []string{"--profile", "nope"}, wantErr: "m4max-llamacpp"},
		{name: "bad mimic", args: []string{"--profile", "instant", "--mimic", "ollama"}, wantErr: "use vllm or llamacpp"},
		{name: "engine args without --", args: []string{"--profile", "instant", "-m", "w"}, wantErr: `after "--"`},
		{name: "bad context", args: []string{"--profile", "instant", "--", "-c", "lots"}, wantErr: "not a context size"},
		{name: "bad reasoning format", args: []string{"--profile", "instant", "--", "--reasoning-format", "hidden"}, wantErr: "not one of none"},
		{name: "bad port", args: []string{"--profile", "instant", "--", "--port", "70000"}, wantErr: "not a port number"},
		{name: "flag without value", args: []string{"--profile", "instant", "--", "-m"}, wantErr: "needs a value"},
		{name: "bad load time", args: []string{"--profile", "instant", "--load-time", "soon"}, wantErr: "not a duration"},
		{name: "bad cold start", args: []string{"--profile", "instant", "--cold-start", "-1s"}, wantErr: "--cold-start \"-1s\" is not a duration"},
		{name: "auto tool choice without parser", args: strings.Fields("--mimic vllm --profile instant -- serve m --enable-auto-tool-choice"), wantErr: "needs --tool-call-parser"},
		{name: "bad kwargs", args: []string{"--profile", "instant", "--", "--chat-template-kwargs", "{"}, wantErr: "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseArgs(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func equalOptions(a, b Options) bool {
	return a.Mimic == b.Mimic && a.Host == b.Host && a.Port == b.Port && a.ModelPath == b.ModelPath && a.Ctx == b.Ctx &&
		a.TotalCtx == b.TotalCtx && a.Slots == b.Slots && a.KVUnified == b.KVUnified && a.Jinja == b.Jinja &&
		a.ReasoningFormat == b.ReasoningFormat
}

func TestProfiles(t *testing.T) {
	if _, err := LookupProfile("missing"); err == nil || !strings.Contains(err.Error(), "rtx3060-vllm") {
		t.Errorf("LookupProfile error should list the known names, got %v", err)
	}
	tests := []struct {
		profile string
		n       int
		total   float64
	}{
		{"m4max-llamacpp", 1, 87}, {"m4max-llamacpp", 2, 130}, {"m4max-llamacpp", 3, 133}, {"m4max-llamacpp", 4, 136},
		{"m4max-llamacpp", 8, 136}, // llama.cpp: flat past the last point
		{"m1ultra-llamacpp", 4, 139}, {"m1ultra-27b-starved", 2, 12.8},
		{"rtx3060-vllm", 1, 90}, {"rtx3060-vllm", 4, 320},
	}
	for _, tt := range tests {
		p, err := LookupProfile(tt.profile)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.TotalTokPerSec(tt.n); math.Abs(got-tt.total) > 1e-9 {
			t.Errorf("%s total at %d = %v, want %v", tt.profile, tt.n, got, tt.total)
		}
	}
	gpu, _ := LookupProfile("rtx3060-vllm")
	if gpu.TotalTokPerSec(8) <= gpu.TotalTokPerSec(4) {
		t.Error("vLLM throughput should keep growing past the last point")
	}
	for _, name := range ProfileNames() {
		p, _ := LookupProfile(name)
		if p.Platform.Profile != name || p.Platform.OS == "" || p.Platform.MemTotalBytes == 0 {
			t.Errorf("profile %s has an incomplete platform: %+v", name, p.Platform)
		}
	}
	inst, _ := LookupProfile("instant")
	if inst.TokenDelay(4) != 0 || inst.PrefillDelay(1000) != 0 {
		t.Error("instant must have no delays")
	}
	ultra, _ := LookupProfile("m1ultra-llamacpp")
	if got := ultra.Platform.GPULabel(); got != "Apple M1 Ultra" {
		t.Errorf("GPU label %q", got)
	}
	rig, _ := LookupProfile("rtx3060-vllm")
	if got := rig.Platform.GPULabel(); got != "8x RTX 3060" {
		t.Errorf("GPU label %q", got)
	}
}

// TestScanEngineArgs: the one loop both mimics read their engine's argv
// with, on a table of one flag of each kind: what each token becomes.
func TestScanEngineArgs(t *testing.T) {
	var got []string
	record := func(what string) func(a *engineArgs, name string, vals []string) error {
		return func(a *engineArgs, name string, vals []string) error {
			got = append(got, fmt.Sprintf("%s %s %q", what, name, vals))
			return nil
		}
	}
	table := engineFlags{}.
		flag(engineFlag{valueFlag, record("value")}, "-v", "--value").
		flag(engineFlag{switchFlag, record("switch")}, "--on").
		flag(engineFlag{listFlag, record("list")}, "--names")
	positional := func(a *engineArgs, tok string) { got = append(got, "positional "+tok) }
	for _, tc := range []struct {
		name, args string
		positional bool
		want       []string
		wantErr    string
	}{
		{"value as the next token", "-v 3", false, []string{`value -v ["3"]`}, ""},
		{"value inline", "--value=a=b", false, []string{`value --value ["a=b"]`}, ""},
		{"a negative number is a value", "-v -1", false, []string{`value -v ["-1"]`}, ""},
		{"missing value", "-v --on", false, nil, "engine flag -v needs a value"},
		{"value at the end", "-v", false, nil, "engine flag -v needs a value"},
		{"switch ignores an inline value", "--on=1 --on", false, []string{`switch --on []`, `switch --on []`}, ""},
		{"list takes tokens up to the next flag", "--names a b --on", false, []string{`list --names ["a" "b"]`, `switch --on []`}, ""},
		{"list with an inline first", "--names=a b", false, []string{`list --names ["a" "b"]`}, ""},
		{"list stops at a negative number", "--names a -1", false, []string{`list --names ["a"]`}, ""},
		{"empty list", "--names --on", false, []string{`list --names []`, `switch --on []`}, ""},
		{"unknown flag skips its value", "--other x -v 1", false, []string{`value -v ["1"]`}, ""},
		{"unknown flag before a flag skips nothing", "--other --on", false, []string{`switch --on []`}, ""},
		{"unknown inline flag skips nothing more", "--other=x y --on", true, []string{"positional y", `switch --on []`}, ""},
		{"positionals ignored without a taker", "m -v 1", false, []string{`value -v ["1"]`}, ""},
		{"positionals to the taker", "m -v 1 n", true, []string{"positional m", `value -v ["1"]`, "positional n"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			var pos func(*engineArgs, string)
			if tc.positional {
				pos = positional
			}
			err := scanEngineArgs(strings.Fields(tc.args), &engineArgs{Options: &Options{}}, table, pos)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
