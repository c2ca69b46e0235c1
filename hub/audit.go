package hub

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"fleet"
	"fleet/store"
)

// What one audit line keeps of text a caller chose (a target typed, an
// error quoting it): a 120 KB argument must not make a 120 KB row.
const (
	auditUserBytes    = 128
	auditTargetBytes  = 256
	auditOutcomeBytes = 512
)

// guard is the one way in for whatever a user asks of the hub: it looks the
// action up in the table (fleet.Actions), refuses, and audits the refusal
// of, what the user's role does not allow, writes an audited action's line
// before the action runs (do, in actions.go), and collapses repeated
// refusals into counted lines (refusals.go). The hub and each part it
// composes (Admin, …) share one guard.
type guard struct {
	store *store.Store
	log   *slog.Logger
	// refused collapses repeated refusals into counted audit lines and
	// rate-limits the users who meet too many.
	refused refusals
}

func auditEntry(u fleet.User, action fleet.ActionName, target, outcome string) fleet.AuditEntry {
	// Sanitized: a target is what someone typed, an outcome may quote a node.
	return fleet.AuditEntry{At: time.Now(), User: fleet.Clip(u.Name, auditUserBytes), Action: fleet.Sanitize(string(action)),
		Target: fleet.Sanitize(fleet.Clip(target, auditTargetBytes)), Outcome: fleet.Sanitize(fleet.Clip(outcome, auditOutcomeBytes))}
}

// auditStarted is the outcome of an action's audit line while it runs
// (until the hub's next start, should it die before the action ends:
// auditInterrupted).
const auditStarted = "started"

// auditInterrupted is the outcome of an action's audit line that a hub
// stopped (killed, or its machine lost) left started.
const auditInterrupted = "interrupted: the hub stopped before this action ended; `fleet workers` and `fleet events` show what it did"

// interruptedBefore names this run of hub as the writer of audit lines from
// now on, and marks the lines a run before it left started as interrupted:
// what was under way when a hub died is not under way any more.
func (g *guard) interruptedBefore(ctx context.Context, hub, instance string) error {
	g.store.SetAuditOrigin(hub, instance)
	n, err := g.store.InterruptAudit(ctx, auditStarted, auditInterrupted)
	if err != nil {
		return err
	}
	if n > 0 {
		g.log.Warn("audit lines of actions the hub's last run left unfinished are marked interrupted", "lines", n)
	}
	return nil
}

// auditLine is the audit line of an action under way.
type auditLine struct {
	g      *guard
	id     int64
	action fleet.ActionName
	target string
}

// begin writes the audit line of an audited action before the action, so
// that an action whose audit cannot be written (a full disk, a broken
// database) does not happen: on error the caller must change nothing. An
// action the table does not audit gets a line that records nothing.
func (g *guard) begin(u fleet.User, a fleet.Action, target string) (*auditLine, error) {
	if !a.Audited {
		return nil, nil
	}
	e := auditEntry(u, a.Name, target, auditStarted)
	id, err := g.store.BeginAudit(context.Background(), e)
	if err != nil {
		g.log.Error("refused an action whose audit line could not be written", "user", e.User, "action", a.Name, "target", e.Target, "err", err)
		return nil, fmt.Errorf("%s %s was not done: its audit line could not be written (%w); nothing was changed. "+
			"Check that the database %s answers and has room (a full disk, a stopped PostgreSQL), then try again", a.Name, e.Target, err, g.store.Path())
	}
	return &auditLine{g: g, id: id, action: a.Name, target: e.Target}, nil
}

// end records how the action ended. The action has happened, so a failure
// here cannot undo it; the line still says who started what.
func (l *auditLine) end(outcome string) {
	if l == nil {
		return
	}
	if err := l.g.store.SetAuditOutcome(context.Background(), l.id, fleet.Sanitize(fleet.Clip(outcome, auditOutcomeBytes))); err != nil {
		l.g.log.Error("could not record how an audited action ended; its audit line says "+auditStarted,
			"action", l.action, "target", l.target, "outcome", fleet.Clip(outcome, auditOutcomeBytes), "err", err)
	}
}

// endErr ends the line with "ok" or the error.
func (l *auditLine) endErr(err error) {
	if err != nil {
		l.end("failed: " + err.Error())
		return
	}
	l.end("ok")
}

// audit writes an audit line as it is (the SSH server's first admins);
// a failure to write it is logged. Actions write theirs first, with begin
// (through do); refusals and failures that changed nothing go through
// refuse and noteRepeat, which count repeats on one line.
func (g *guard) audit(u fleet.User, action fleet.ActionName, target, outcome string) {
	e := auditEntry(u, action, target, outcome)
	if err := g.store.AddAudit(context.Background(), e); err != nil {
		g.log.Error("could not write the audit line", "user", e.User, "action", action, "target", e.Target, "err", err)
	}
}

// auditSSH writes a line the SSH server audits itself (a login refused, the
// first admin added); its action may be outside the table.
func (g *guard) auditSSH(e fleet.AuditEntry) {
	g.audit(fleet.User{Name: e.User}, fleet.ActionName(e.Action), e.Target, e.Outcome)
}
