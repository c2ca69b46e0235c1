package nodes

import (
	"context"
	"math"
	"time"

	"fleet"
	"fleet/enginectl"
)

// downloadPollInterval is how often a starting engine's log is read for
// download progress.
const downloadPollInterval = time.Second

// watchDownload follows a starting engine's download of its weights, as its
// log shows it (llama-server -hf, vLLM's Hugging Face download): the
// percent goes on the worker as an install's does, and the bar into its
// events at every tenth. The returned func stops it and clears the figure.
func (m *Manager) watchDownload(ctx context.Context, ws *workerState, t Transport, proc enginectl.Process) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(downloadPollInterval)
		defer tick.Stop()
		lastPct, lastTenth := -1.0, -1.0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tail, err := enginectl.LogTailBytes(ctx, t, proc, 4096)
			if err != nil {
				continue
			}
			pct, line, ok := enginectl.DownloadProgress(tail)
			if !ok || math.Floor(pct) == lastPct {
				continue
			}
			lastPct = math.Floor(pct)
			m.update(ws, func(w *fleet.Worker) {
				if w.State == fleet.WorkerStarting {
					w.Progress = lastPct
				}
			})
			if tenth := math.Floor(pct / 10); tenth != lastTenth {
				lastTenth = tenth
				m.workerEvent(ws, "info", "download: "+line)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		m.update(ws, func(w *fleet.Worker) { w.Progress = 0 })
	}
}
