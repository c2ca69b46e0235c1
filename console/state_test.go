package console

import (
	"testing"

	"fleet"
)

func TestStateCellShowsInstallProgress(t *testing.T) {
	cases := []struct {
		w    fleet.WorkerView
		want string
	}{
		{fleet.WorkerView{Worker: fleet.Worker{State: fleet.WorkerInstalling, Progress: 42.4}}, "installing 42%"},
		{fleet.WorkerView{Worker: fleet.Worker{State: fleet.WorkerInstalling}}, "installing"},
		{fleet.WorkerView{Worker: fleet.Worker{State: fleet.WorkerReady, Progress: 100}}, "ready"},
	}
	for _, c := range cases {
		if got := stateCell(c.w); got != c.want {
			t.Errorf("stateCell(%s, %.1f) = %q, want %q", c.w.State, c.w.Progress, got, c.want)
		}
	}
}
