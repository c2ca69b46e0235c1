package hub

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A fleet file nested deeper than any fleet file means is refused before
// the YAML parser runs, by `serve --fleet` and by apply alike, and changes
// nothing.
func TestDeepFleetFileRefused(t *testing.T) {
	deep := "nodes: " + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "\n"
	path := filepath.Join(t.TempDir(), "deep.yaml")
	if err := os.WriteFile(path, []byte(deep), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := openHub(t, Options{FleetFile: path})
	if err == nil {
		h.Close()
		t.Fatal("serve --fleet accepted a file nested 100,000 deep")
	}
	if !strings.Contains(err.Error(), "deep.yaml:1: collections nest more than 12 deep") {
		t.Errorf("serve --fleet: %v; want the nesting refusal with file and line", err)
	}

	h = newHub(t, Options{})
	before, err := h.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Apply(t.Context(), admin, "deep.yaml", []byte(deep), false); err == nil || !strings.Contains(err.Error(), "nest more than 12 deep") {
		t.Fatalf("apply of a file nested 100,000 deep: %v; want the nesting refusal", err)
	}
	after, err := h.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the refused apply changed the fleet:\n%s\nto\n%s", before, after)
	}
}
