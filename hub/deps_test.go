package hub

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDependencies keeps two edges out of the build graph: the hub linking
// the whole simulated engine to look up a profile (sim/profiles is enough),
// and the command tree importing the store for a type (fleet.APIKey is the
// shared one).
func TestDependencies(t *testing.T) {
	tests := []struct{ pkg, mustNot string }{
		{"fleet/hub", "fleet/sim"},
		{"fleet/cli", "fleet/store"},
	}
	for _, tt := range tests {
		out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", tt.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tt.pkg, err)
		}
		if slices.Contains(strings.Fields(string(out)), tt.mustNot) {
			t.Errorf("%s depends on %s again", tt.pkg, tt.mustNot)
		}
	}
}
