package themes

import (
	"strings"
	"testing"

	"fleet"
)

func TestNamed(t *testing.T) {
	tests := []struct {
		name     string
		wantName string
		wantErr  string
	}{
		{"dark", "dark", ""},
		{"Light", "light", ""},
		{" high-contrast ", "high-contrast", ""},
		{"solarized", "", `unknown theme "solarized": choose one of dark, high-contrast, light`},
		{"", "", "unknown theme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th, err := Named(tt.name)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Named(%q) error = %v, want it to contain %q", tt.name, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Named(%q): %v", tt.name, err)
			}
			if th.Name != tt.wantName {
				t.Fatalf("Named(%q).Name = %q, want %q", tt.name, th.Name, tt.wantName)
			}
		})
	}
}

func TestForBackground(t *testing.T) {
	if got := ForBackground(true); got.Name != "dark" || !got.Dark {
		t.Fatalf("ForBackground(true) = %q dark=%v", got.Name, got.Dark)
	}
	if got := ForBackground(false); got.Name != "light" || got.Dark {
		t.Fatalf("ForBackground(false) = %q dark=%v", got.Name, got.Dark)
	}
}

// Every theme must give distinguishable styles to states an operator acts on:
// a failed worker must not look like a ready one.
func TestStatesAreDistinct(t *testing.T) {
	for _, name := range Names() {
		th, err := Named(name)
		if err != nil {
			t.Fatal(err)
		}
		ready := th.State(fleet.WorkerReady).Render("x")
		failed := th.State(fleet.WorkerFailed).Render("x")
		draining := th.State(fleet.WorkerDraining).Render("x")
		if ready == failed || ready == draining || failed == draining {
			t.Errorf("theme %s: ready %q, failed %q, draining %q must differ", name, ready, failed, draining)
		}
		if th.Selected.Render("row") == th.Text.Render("row") {
			t.Errorf("theme %s: the selected row looks like any row", name)
		}
	}
}
