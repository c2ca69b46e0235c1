package fleet

import (
	"strings"
	"testing"
	"time"
)

func TestPlatformLabels(t *testing.T) {
	rtx := GPU{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288}
	cases := []struct {
		name         string
		p            Platform
		gpu, host    string
		engine       EngineKind
		appleSilicon bool
	}{
		{"8x RTX 3060 rig", Platform{OS: "linux", Arch: "amd64", GPUs: []GPU{rtx, rtx, rtx, rtx, rtx, rtx, rtx, rtx}}, "8x RTX 3060", "Linux", EngineVLLM, false},
		{"one GPU under WSL", Platform{OS: "linux", WSL: true, GPUs: []GPU{{Name: "NVIDIA GeForce RTX 5060 Ti"}}}, "RTX 5060 Ti", "Windows/WSL", EngineVLLM, false},
		{"mixed GPUs", Platform{OS: "linux", GPUs: []GPU{rtx, {Name: "NVIDIA RTX 4090"}}}, "2 GPUs", "Linux", EngineVLLM, false},
		{"M1 Ultra", Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M1 Ultra"}, "Apple M1 Ultra", "macOS", EngineLlamaCpp, true},
		{"Intel Mac", Platform{OS: "darwin", Arch: "amd64", Chip: "Intel(R) Core(TM) i9"}, "CPU", "macOS", EngineLlamaCpp, false},
		{"CPU Linux", Platform{OS: "linux", Arch: "amd64"}, "CPU", "Linux", EngineLlamaCpp, false},
		{"not probed", Platform{}, "CPU", "?", EngineLlamaCpp, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.p.GPULabel(); got != c.gpu {
				t.Errorf("GPULabel = %q, want %q", got, c.gpu)
			}
			if got := c.p.HostLabel(); got != c.host {
				t.Errorf("HostLabel = %q, want %q", got, c.host)
			}
			if got := c.p.DefaultEngine(); got != c.engine {
				t.Errorf("DefaultEngine = %q, want %q", got, c.engine)
			}
			if got := c.p.AppleSilicon(); got != c.appleSilicon {
				t.Errorf("AppleSilicon = %v, want %v", got, c.appleSilicon)
			}
		})
	}
}

func TestRestartBackoff(t *testing.T) {
	want := map[int]time.Duration{0: 10 * time.Second, 1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second,
		5: 160 * time.Second, 6: 300 * time.Second, 7: 300 * time.Second, 100: 300 * time.Second}
	for n, d := range want {
		if got := RestartBackoff(n); got != d {
			t.Errorf("RestartBackoff(%d) = %s, want %s", n, got, d)
		}
	}
}

func TestRoles(t *testing.T) {
	cases := []struct {
		have, need Role
		ok         bool
	}{
		{RoleViewer, RoleViewer, true}, {RoleViewer, RoleOperator, false}, {RoleOperator, RoleOperator, true},
		{RoleOperator, RoleAdmin, false}, {RoleAdmin, RoleOperator, true}, {Role(""), RoleViewer, false},
		{Role("root"), RoleViewer, false},
		// An action missing from the table needs "": nobody has that.
		{RoleAdmin, Role(""), false}, {Role(""), Role(""), false},
	}
	for _, c := range cases {
		if got := c.have.Allows(c.need); got != c.ok {
			t.Errorf("%q.Allows(%q) = %v, want %v", c.have, c.need, got, c.ok)
		}
	}
}

func TestIsLoopbackAddr(t *testing.T) {
	cases := map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "[::1]:8080": true, "127.1.2.3:1": true,
		"0.0.0.0:8080": false, ":8080": false, "192.168.1.5:8080": false, "fleet.local:8080": false, "nonsense": false,
	}
	for addr, want := range cases {
		if got := IsLoopbackAddr(addr); got != want {
			t.Errorf("IsLoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestModelServesAliases(t *testing.T) {
	m := Model{ID: "qwen3-4b", Aliases: []string{"qwen3"}}
	for name, want := range map[string]bool{"qwen3-4b": true, "qwen3": true, "qwen3-8b": false, "": false} {
		if got := m.Serves(name); got != want {
			t.Errorf("Serves(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDialsDirect(t *testing.T) {
	tests := []struct {
		node Node
		want bool
	}{
		{Node{Address: "ops@rig.lan", Endpoint: "direct"}, true},
		{Node{Address: "ops@rig.lan"}, false},
		{Node{Address: "ops@rig.lan", Endpoint: "tunnel"}, false},
		{Node{Address: AddressLocal, Endpoint: "direct"}, false},
		{Node{Address: AddressSimPrefix + "m4max-llamacpp", Endpoint: "direct"}, false},
	}
	for _, tt := range tests {
		if got := tt.node.DialsDirect(); got != tt.want {
			t.Errorf("%+v: DialsDirect = %v, want %v", tt.node, got, tt.want)
		}
	}
}

func TestClip(t *testing.T) {
	for _, tt := range []struct {
		in   string
		max  int
		want string
	}{
		{"drain ultra", 64, "drain ultra"},
		{"abcdef", 6, "abcdef"},
		{"abcdefgh", 4, "abcd…(4 more bytes)"},
		// "é" is two bytes: the cut never splits it.
		{"aéé", 2, "a…(4 more bytes)"},
	} {
		if got := Clip(tt.in, tt.max); got != tt.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
	}
}

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in      string
		want    PortRange
		wantErr string
	}{
		{"18000-18999", PortRange{18000, 18999}, ""},
		{" 20000 - 20010 ", PortRange{20000, 20010}, ""},
		{"30000", PortRange{30000, 30000}, ""},
		{"1024-65535", PortRange{1024, 65535}, ""},
		{"80-90", PortRange{}, "from 1024 to 65535"},
		{"18000-70000", PortRange{}, "from 1024 to 65535"},
		{"19000-18000", PortRange{}, "write the lower port first, like 18000-19000"},
		{"18000:18999", PortRange{}, "like 18000-18999"},
		{"", PortRange{}, "MIN-MAX"},
		{"-18000", PortRange{}, "MIN-MAX"},
	}
	for _, tt := range tests {
		got, err := ParsePortRange(tt.in)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParsePortRange(%q) error %v; want one saying %q", tt.in, err, tt.wantErr)
		}
	}
	if s := (PortRange{18000, 18999}).String(); s != "18000-18999" {
		t.Errorf("String = %q", s)
	}
}

func TestGPUIndices(t *testing.T) {
	for _, tt := range []struct {
		in   []int
		want string
	}{
		{nil, ""}, {[]int{3}, "#3"}, {[]int{0, 1}, "#0,1"}, {[]int{0, 2}, "#0,2"},
		{[]int{0, 1, 2, 3}, "#0-3"}, {[]int{0, 1, 2, 5, 6}, "#0-2,5,6"}, {[]int{1, 3, 4, 5, 7}, "#1,3-5,7"},
	} {
		if got := GPUIndices(tt.in); got != tt.want {
			t.Errorf("GPUIndices(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
