package hub

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSecondHubIsRefusedBeforeTouchingTheStore: a hub asked to apply the
// demo on a data dir another hub holds must be refused before it writes the
// demo over that hub's fleet.
func TestSecondHubIsRefusedBeforeTouchingTheStore(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, withoutMax(t), 0o600); err != nil {
		t.Fatal(err)
	}
	first, err := openHub(t, Options{DataDir: dir, FleetFile: file})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	before, err := first.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	audits := lastAuditID(t, first)

	second, err := openHub(t, Options{DataDir: dir, Demo: true})
	if err == nil {
		second.Close()
		t.Fatal("a second hub opened the data dir of a running one")
	}
	for _, want := range []string{"another hub", "pid", dir, "--data"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	after, err := first.Export(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the refused hub rewrote the stored fleet:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := auditSince(t, first, audits); len(got) != 0 {
		t.Errorf("the refused hub left audit lines: %+v", got)
	}

	// Once the first hub is gone, the dir is free again.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := openHub(t, Options{DataDir: dir})
	if err != nil {
		t.Fatalf("after the first hub closed: %v", err)
	}
	again.Close()
}

// TestEmptyDatabaseFileIsSaidToBeInitialised: a zero-length fleet.db is
// what a lost database can leave; the hub starts, and says what it did.
func TestEmptyDatabaseFileIsSaidToBeInitialised(t *testing.T) {
	for _, tt := range []struct {
		name  string
		empty bool
	}{{"zero-length file", true}, {"no file", false}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.empty {
				if err := os.WriteFile(filepath.Join(dir, "fleet.db"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			h, err := openHub(t, Options{DataDir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			h.Close()
			said := strings.Contains(logs.String(), "database file was empty (0 bytes): initialised")
			if said != tt.empty {
				t.Errorf("logged the empty-database line: %v, want %v; logs:\n%s", said, tt.empty, logs.String())
			}
		})
	}
}

// TestUnknownPolicyChangesNothing: a mistyped --policy is refused by the
// router's constructor before the fleet file is applied, so the store is
// left as it was.
func TestUnknownPolicyChangesNothing(t *testing.T) {
	dir := t.TempDir()
	h, err := openHub(t, Options{DataDir: dir, Demo: true, Policy: "fastest"})
	if err == nil {
		h.Close()
		t.Fatal("a hub opened with the unknown policy \"fastest\"")
	}
	for _, want := range []string{"--policy", `"fastest"`, "round-robin"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	again, err := openHub(t, Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if nodes, err := again.store.Nodes(t.Context()); err != nil || len(nodes) != 0 {
		t.Errorf("the refused hub stored nodes %v (err %v); want none", nodes, err)
	}
}

// A disk that fills up while the hub copies itself to DATA/bin/fleet leaves
// no half-written DATA/bin/fleet.new behind: the failed start says why and
// takes its partial copy with it. /dev/full answers every write with ENOSPC,
// as a full disk does.
func TestInstallSelfOnAFullDiskLeavesNoPartialCopy(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system to stand in for a full disk")
	}
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "bin"), 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(data, "bin", "fleet.new")
	if err := os.Symlink("/dev/full", tmp); err != nil {
		t.Fatal(err)
	}
	_, err := installSelf(data)
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("installSelf on a full disk: %v, want an ENOSPC error", err)
	}
	if _, serr := os.Lstat(tmp); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("after the failed install %s is still there (%v)", tmp, serr)
	}
	if _, serr := os.Lstat(filepath.Join(data, "bin", "fleet")); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("a failed install left bin/fleet (%v)", serr)
	}
}
