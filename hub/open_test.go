package hub

import (
	"strings"
	"testing"
)

// TestOpenRefusesAnOpenRouter: a router reachable from the network with no
// API key to check would be a free inference endpoint on the LAN, so Open
// refuses it and says how to get a key.
func TestOpenRefusesAnOpenRouter(t *testing.T) {
	tests := []struct {
		name        string
		addr        string
		requireKeys bool
		// keys is the API keys the data dir already holds: "live" or "revoked".
		keys    []string
		refused bool
	}{
		{name: "all interfaces without a key", addr: "0.0.0.0:0", refused: true},
		{name: "a LAN name without a key", addr: "hub.example:8080", refused: true},
		{name: "loopback with RequireKeys without a key", addr: "127.0.0.1:0", requireKeys: true, refused: true},
		{name: "all interfaces with only a revoked key", addr: "0.0.0.0:0", keys: []string{"revoked"}, refused: true},
		{name: "all interfaces with a live key", addr: "0.0.0.0:0", keys: []string{"revoked", "live"}},
		{name: "loopback with RequireKeys and a live key", addr: "127.0.0.1:0", requireKeys: true, keys: []string{"live"}},
		{name: "loopback without a key", addr: "127.0.0.1:0"},
		{name: "IPv6 loopback without a key", addr: "[::1]:0"},
		{name: "localhost without a key", addr: "localhost:0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if len(tt.keys) > 0 {
				// Keys are made the only way there is: on a loopback hub.
				h, err := openHub(t, Options{DataDir: dir})
				if err != nil {
					t.Fatal(err)
				}
				for i, k := range tt.keys {
					name := "client" + string(rune('a'+i))
					if _, err := h.CreateKey(t.Context(), admin, name); err != nil {
						t.Fatal(err)
					}
					if k == "revoked" {
						if err := h.RevokeKey(t.Context(), admin, name); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := h.Close(); err != nil {
					t.Fatal(err)
				}
			}

			h, err := openHub(t, Options{DataDir: dir, HTTPAddr: tt.addr, RequireKeys: tt.requireKeys, Demo: true})
			if err == nil {
				t.Cleanup(func() { h.Close() })
			}
			if !tt.refused {
				if err != nil {
					t.Fatalf("Open on %s: %v", tt.addr, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Open on %s with keys %v succeeded; want a refusal", tt.addr, tt.keys)
			}
			// A hub that will not start leaves the stored fleet as it was:
			// the demo it was asked to apply is not there.
			again, err2 := openHub(t, Options{DataDir: dir})
			if err2 != nil {
				t.Fatal(err2)
			}
			t.Cleanup(func() { again.Close() })
			if f, err2 := again.store.LoadFleet(t.Context()); err2 != nil || len(f.Nodes) != 0 {
				t.Errorf("after the refused start the store holds %d nodes (%v), want none", len(f.Nodes), err2)
			}
			// The error must say what is wrong and what to type next.
			for _, want := range []string{tt.addr, "none exists", "127.0.0.1", "fleet key create", "--http " + tt.addr} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Open on %s: %q does not say %q", tt.addr, err, want)
				}
			}
		})
	}
}
