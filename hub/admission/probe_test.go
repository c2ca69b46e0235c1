package admission

import (
	"strings"
	"testing"

	"fleet"
)

// shape, shape pin and bench reach any worker whose engine runs, rejected
// ones included; on one whose engine is down they say so and what to do.
func TestWorkerTargetByEngineState(t *testing.T) {
	fl := &testFleet{}
	_, runs := newTestJudge(t, fl)
	tests := []struct {
		name    string
		w       fleet.Worker
		wantErr string // "" = reachable
	}{
		{"ready", fleet.Worker{State: fleet.WorkerReady, PID: 42, Port: 18000}, ""},
		{"rejected, engine up", fleet.Worker{State: fleet.WorkerRejected, PID: 42, Port: 18000, Reason: "shape: differs"}, ""},
		{"on probation", fleet.Worker{State: fleet.WorkerProbation, PID: 42, Port: 18000}, ""},
		{"rejected, engine stopped", fleet.Worker{State: fleet.WorkerRejected, Port: 18000, Reason: "shape: differs; its engine was stopped after 10m0s rejected"},
			"worker max/qwen3-4b is rejected and its engine is down (shape: differs; its engine was stopped after 10m0s rejected); nothing answers to measure: 'start max/qwen3-4b' launches it again"},
		{"rejected before launch", fleet.Worker{State: fleet.WorkerRejected, Reason: "memory: qwen3-4b needs 90.0 GB"},
			"is rejected and its engine is down (memory: qwen3-4b needs 90.0 GB)"},
		{"failed", fleet.Worker{State: fleet.WorkerFailed, Port: 18000, Reason: "engine PID 7 exited"},
			"worker max/qwen3-4b is failed and its engine is not answering (engine PID 7 exited); wait until it is ready"},
		{"starting", fleet.Worker{State: fleet.WorkerStarting, PID: 42, Port: 18000}, "is starting and its engine is not answering"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := tt.w
			w.Node, w.Model = "max", "qwen3-4b"
			fl.put(w)
			_, _, err := runs.workerTarget("max")
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("not reachable: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}
