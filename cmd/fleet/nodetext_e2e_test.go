package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fleet"
)

// A node's installer that prints terminal escapes (a window title, OSC 52
// into the clipboard) reached `fleet events` raw. Through a real hub and
// node manager, with the engine's install run on the hub's own machine:
// the output arrives, written out ("\x1b]0;…"), in events, their JSON and
// the worker's reason, and no escape, raw or JSON-encoded, reaches a reader.
func TestInstallOutputReachesNoTerminalRaw(t *testing.T) {
	data := t.TempDir()
	bin := filepath.Join(t.TempDir(), "never", "llama-server")
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	fleetFile := `nodes:
  - name: hub
    address: local
models:
  - id: m
    context: 4096
    recipes:
      llamacpp:
        model: m.gguf
        bin: ` + bin + `
        install: |
          printf 'fetching \033]0;pwned\007 \033]52;c;cHduZWQ=\007 \302\2332J done\n'
          printf 'fatal: \033[2J\r\000 no such index\n' >&2
          exit 3
placements:
  - {model: m, node: hub, engine: llamacpp}
`
	if err := os.WriteFile(file, []byte(fleetFile), 0o600); err != nil {
		t.Fatal(err)
	}
	startFleetHub(t, data, freePort(t), file)

	var events string
	deadline := time.Now().Add(60 * time.Second)
	for {
		events, _ = fleetCmd(t, data, "events", "--limit", "500")
		// The installer's own output, written out: the "install command"
		// event before it holds "no such index" too, as the script's text.
		if strings.Contains(events, `\u009b2J done`) && strings.Contains(events, "install: \\x00 no such index") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the installer's output never reached the events:\n%s", events)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(events, `fetching \x1b]0;pwned\x07 \x1b]52;c;cHduZWQ=\x07 \u009b2J done`) {
		t.Errorf("the installer's line is not in the events, written out:\n%s", events)
	}
	eventsJSON, _ := fleetCmd(t, data, "events", "--json", "--limit", "500")
	workers, _ := fleetCmd(t, data, "workers", "--json")
	nodes, _ := fleetCmd(t, data, "nodes")
	for what, out := range map[string]string{"events": events, "events --json": eventsJSON, "workers --json": workers, "nodes": nodes} {
		if i := strings.IndexFunc(out, fleet.UnsafeRune); i >= 0 {
			t.Errorf("%s carries %q raw: %q", what, out[i:i+1], out[max(0, i-40):min(len(out), i+40)])
		}
		// JSON writes a control character as \u001b; decoded it is raw again.
		dec := json.NewDecoder(strings.NewReader(out))
		for {
			var v any
			if err := dec.Decode(&v); err != nil {
				break
			}
			if b, _ := json.Marshal(v); strings.Contains(string(b), `\u001b`) || strings.Contains(string(b), `\u0007`) || strings.Contains(string(b), `\u0000`) {
				t.Errorf("%s carries a control character in a JSON string: %s", what, b)
			}
		}
	}
}
