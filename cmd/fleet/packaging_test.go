package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnitVerifies: the unit the deb and rpm install, with and
// without the port-22 drop-in, passes `systemd-analyze verify` with not a
// single warning (verify exits 0 on ignored lines, so any output fails),
// and runs `fleet serve` as the fleet user with its state in /var/lib/fleet.
func TestSystemdUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("needs systemd-analyze (apt-get install systemd) to verify packaging/fleet.service")
	}
	unit, err := os.ReadFile("../../packaging/fleet.service")
	if err != nil {
		t.Fatal(err)
	}
	dropIn, err := os.ReadFile("../../packaging/port22.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"User=fleet\n", "StateDirectory=fleet\n", "ExecStart=/usr/bin/fleet --data /var/lib/fleet serve $FLEET_SERVE_ARGS\n", "KillMode=process\n"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("fleet.service lacks %q", want)
		}
	}
	if !strings.Contains(string(dropIn), "AmbientCapabilities=CAP_NET_BIND_SERVICE\n") {
		t.Errorf("port22.conf does not grant CAP_NET_BIND_SERVICE:\n%s", dropIn)
	}
	for _, withDropIn := range []bool{false, true} {
		dir := t.TempDir()
		// verify checks that ExecStart's binary exists: point it at this build.
		body := strings.ReplaceAll(string(unit), "/usr/bin/fleet", fleetBin)
		if err := os.WriteFile(filepath.Join(dir, "fleet.service"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if withDropIn {
			if err := os.MkdirAll(filepath.Join(dir, "fleet.service.d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "fleet.service.d", "port22.conf"), dropIn, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("systemd-analyze", "verify", "fleet.service")
		// The trailing colon keeps the system's own unit dirs (targets the
		// unit names) after the test's.
		cmd.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":")
		out, err := cmd.CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify fleet.service (drop-in %v): %v\n%s", withDropIn, err, out)
		}
	}
}
