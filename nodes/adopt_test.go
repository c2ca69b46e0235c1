package nodes

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fleet"
)

// A launch on a local or sim node is looked for under this hub's data dir
// and every other hub's on the machine (a former leader's launch); on a
// node whose engine files are not the hub's (SSH), under the node's own.
func TestLaunchPIDPathsLookUnderTheOtherHubsDataDirs(t *testing.T) {
	ctx := context.Background()
	own, other := t.TempDir(), t.TempDir()
	pidIn := func(data string) string {
		return filepath.Join(NodeStateDir(data, "rig"), "rig-qwen3-4b.pid")
	}
	local, err := Open(ctx, fleet.Node{Name: "rig", Address: "local"}, Options{DataDir: own})
	if err != nil {
		t.Fatal(err)
	}
	var noStateDir struct{ Transport } // as an SSH node: its engine files are the node's
	down := errors.New("database down")
	tests := []struct {
		name    string
		t       Transport
		others  func(context.Context) ([]string, error)
		want    []string
		wantErr string
	}{
		{"one hub", local, nil, []string{pidIn(own)}, ""},
		{"a former leader's data dir", local, func(context.Context) ([]string, error) { return []string{other}, nil }, []string{pidIn(own), pidIn(other)}, ""},
		{"its own dir once", local, func(context.Context) ([]string, error) { return []string{own, other, other}, nil }, []string{pidIn(own), pidIn(other)}, ""},
		{"the hubs unknown", local, func(context.Context) ([]string, error) { return nil, down }, nil, "reading the other hubs' data dirs: database down"},
		{"an SSH node", noStateDir, func(context.Context) ([]string, error) { return []string{other}, nil }, []string{"~/.fleet/rig-qwen3-4b.pid"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager(ManagerOptions{DataDir: own, OtherDataDirs: tc.others})
			got, err := m.launchPIDPaths(ctx, tc.t, "rig", "qwen3-4b")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v; want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("pid paths %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
