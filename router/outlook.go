package router

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"fleet"
)

// Outlook is what the router is told about a model's workers that are not in
// its ready set, so that it can tell a model whose workers are on their way
// (requests wait in the queue) from one that has none that could serve
// (requests get 503 at once, saying why).
type Outlook struct {
	// Coming counts workers that become ready without anyone acting:
	// placed but not started yet (pending), installing, starting, or on
	// probation.
	Coming int
	// ComingContext is the largest context among the coming workers, 0
	// when none says it: a request too long for the ready set waits for a
	// coming worker that holds it.
	ComingContext int
	// Down counts the other workers by state (failed, rejected, stopped):
	// none of them serves until someone acts.
	Down map[fleet.WorkerState]int
}

// comingStates are the worker states that lead to ready on their own.
var comingStates = []fleet.WorkerState{fleet.WorkerPending, fleet.WorkerInstalling, fleet.WorkerStarting, fleet.WorkerProbation}

// Coming says whether a worker in state s becomes ready without anyone
// acting.
func Coming(s fleet.WorkerState) bool { return slices.Contains(comingStates, s) }

// OutlookOf counts states into an Outlook; ready and draining workers are the
// ready set's business and are not counted.
func OutlookOf(states []fleet.WorkerState) Outlook {
	var o Outlook
	for _, s := range states {
		switch {
		case Coming(s):
			o.Coming++
		case s == fleet.WorkerReady || s == fleet.WorkerDraining:
		default:
			if o.Down == nil {
				o.Down = map[fleet.WorkerState]int{}
			}
			o.Down[s]++
		}
	}
	return o
}

// SetOutlook replaces every model's outlook. A model absent from the map
// has no worker placed. Requests queued for a model that no longer has a
// worker that could serve get their 503 now rather than at their timeout.
func (r *Router) SetOutlook(byModel map[string]Outlook) {
	for _, m := range r.sched.setOutlook(byModel) {
		r.sched.dispatch(m)
	}
}

// waitForWorker is the schedError of a model with no worker ready but one
// coming (or draining, which an undrain brings back): the request queues.
func waitForWorker(model string, coming, drained int) *schedError {
	return &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true, wait: true,
		msg: fmt.Sprintf("model %q has no ready worker yet (%s)", model, comingText(coming, drained))}
}

func comingText(coming, drained int) string {
	var parts []string
	if coming > 0 {
		parts = append(parts, fmt.Sprintf("%d starting", coming))
	}
	if drained > 0 {
		parts = append(parts, fmt.Sprintf("%d draining", drained))
	}
	return strings.Join(parts, ", ")
}

// noWorkerLocked is the schedError of a model that has no ready worker and
// none that could become ready: it says which case this is.
func (s *scheduler) noWorkerLocked(model string) *schedError {
	o := s.outlooks[model]
	var msg string
	if len(o.Down) == 0 {
		msg = fmt.Sprintf("model %q has no worker placed; place it on a node in the fleet file (fleet apply)", model)
	} else {
		var parts []string
		for _, s := range slices.Sorted(maps.Keys(o.Down)) {
			parts = append(parts, fmt.Sprintf("%d %s", o.Down[s], s))
		}
		msg = fmt.Sprintf("model %q has no worker that can become ready: %s; see 'fleet workers' and 'fleet events' for why", model, strings.Join(parts, ", "))
	}
	return &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true, msg: msg}
}
