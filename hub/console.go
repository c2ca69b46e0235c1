package hub

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"fleet"
	"fleet/console"
)

// consoleSource is one SSH user's view of the hub for the console: the
// snapshot it renders and the actions its keys trigger, as that user.
type consoleSource struct {
	h *Hub
	u fleet.User
}

// ConsoleSource gives user u's console its data and actions.
func (h *Hub) ConsoleSource(u fleet.User) console.Source { return consoleSource{h: h, u: u} }

func (s consoleSource) Snapshot() fleet.Snapshot {
	ctx := context.Background()
	snap := s.h.Snapshot(ctx, s.u)
	if s.u.Role.Allows(fleet.ActionRole(fleet.ActionAudit)) {
		s.h.guard.flushRefusals()
		if audit, err := s.h.store.Audit(ctx, 100); err == nil {
			if !s.u.Role.Allows(fleet.RoleAdmin) {
				audit = fleet.RedactAudit(audit)
			}
			snap.Audit = audit
		}
	}
	// Key names only for those who may list them.
	snap.Usage = s.h.ledger.recentUsage(ctx, s.u.Role.Allows(fleet.ActionRole(fleet.ActionUsageByKey)))
	return snap
}

// Do returns at once for actions that take long (the console follows their
// progress in the snapshots); shape answers with the diff to show. What it
// returns is shown in the console as text, so it is sanitised, and redacted
// for all but admins: an error may quote a node or an install script.
func (s consoleSource) Do(ctx context.Context, a console.Action) (string, error) {
	msg, err := s.do(ctx, a)
	clean := func(t string) string {
		t = fleet.Sanitize(t)
		if !s.u.Role.Allows(fleet.RoleAdmin) {
			t = fleet.RedactText(t)
		}
		return t
	}
	if err != nil {
		err = errors.New(clean(err.Error()))
	}
	return clean(msg), err
}

func (s consoleSource) do(ctx context.Context, a console.Action) (string, error) {
	switch a.Kind {
	case fleet.ActionDrain, fleet.ActionUndrain:
		return s.h.Act(ctx, s.u, a.Kind, a.Targets)
	case fleet.ActionRestart:
		if _, err := s.h.guard.authorize(s.u, fleet.ActionRestart, strings.Join(a.Targets, " ")); err != nil {
			return "", err
		}
		s.h.detached.goDetached(ctx, func(ctx context.Context) {
			if _, err := s.h.Act(ctx, s.u, fleet.ActionRestart, a.Targets); err != nil && ctx.Err() == nil {
				s.h.onEvent(fleet.Event{Level: "error", Subject: strings.Join(a.Targets, " "), Message: "restart failed: " + err.Error()})
			}
		})
		return fmt.Sprintf("restarting %s: drain, stop, launch (see its state and events)", strings.Join(a.Targets, ", ")), nil
	case fleet.ActionShape:
		if _, err := s.h.guard.authorize(s.u, fleet.ActionShape, strings.Join(a.Targets, " ")); err != nil {
			return "", err
		}
		if len(a.Targets) != 2 {
			return "", fmt.Errorf("shape compares two workers: mark two with space, then press s")
		}
		r, err := s.h.runs.Shape(ctx, s.u, a.Targets[0], a.Targets[1])
		if err != nil {
			return "", err
		}
		// Plain: the console colours it. Colour codes in the answer would
		// be sanitised into text and printed, not obeyed.
		return r.Text(a.Width, false), nil
	case fleet.ActionBench:
		if _, err := s.h.guard.authorize(s.u, fleet.ActionBench, strings.Join(a.Targets, " ")); err != nil {
			return "", err
		}
		for _, t := range a.Targets {
			// Detached, as a restart is: it outlives the key press, not the hub.
			s.h.detached.goDetached(ctx, func(ctx context.Context) {
				res, err := s.h.runs.Bench(ctx, s.u, t, fleet.BenchOptions{Split: a.Split}, nil)
				if err != nil {
					if ctx.Err() != nil {
						return // the hub is closing
					}
					s.h.onEvent(fleet.Event{Level: "error", Subject: t, Message: "bench failed: " + err.Error()})
					return
				}
				word := "bench"
				if a.Split == console.SplitAgent {
					word = "agent bench"
				}
				s.h.onEvent(fleet.Event{Level: "info", Subject: t, Message: word + ":\n" + res.Text()})
			})
		}
		return fmt.Sprintf("bench started on %s; the table lands in its events", strings.Join(a.Targets, ", ")), nil
	}
	return "", fmt.Errorf("unknown action %q", a.Kind)
}

// Refused audits a console key the user's role does not allow, as the
// hub's refusal of the same command over SSH exec is audited.
func (s consoleSource) Refused(kind fleet.ActionName, targets []string) {
	_, _ = s.h.guard.authorize(s.u, kind, strings.Join(targets, " "))
}

// WorkerLog is the detail's log, shown only to whom `fleet logs` is: an
// engine's log can hold prompts. Not audited: the detail asks every few
// seconds, and a viewer opening a worker is not trying to read its log.
func (s consoleSource) WorkerLog(ctx context.Context, worker string, lines int) ([]string, error) {
	if need := fleet.ActionRole(fleet.ActionLogs); !s.u.Role.Allows(need) {
		return nil, fmt.Errorf("the engine log needs the %s role (it can hold prompts); you are %s", need, roleName(s.u.Role))
	}
	ls, err := s.h.WorkerLog(ctx, worker, lines)
	if err == nil && !s.u.Role.Allows(fleet.RoleAdmin) {
		for i, l := range ls {
			ls[i] = fleet.RedactText(l)
		}
	}
	return ls, err
}
