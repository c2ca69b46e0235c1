package hub

import (
	"context"
	"fmt"
	"sync"
	"time"

	"fleet"
)

// A viewer's script sent 42,521 refused commands in 20 s, an audit line
// each: about 1.9 GB of audit rows an hour, until the disk was full and an
// operator's drain failed for want of room for its own audit line. So
// refusals (and failures that changed nothing) are audited as one line per
// user and action per refusalWindow, with a count; a user refused more than
// MaxRefusalsPerMinute times in a window gets no command through until it
// ends; and the audit log has a size cap (retention.go).
const (
	// refusalWindow is how long repeats of a refusal are one audit line.
	refusalWindow = time.Minute
	// MaxRefusalsPerMinute is how many refusals a user may meet within a
	// refusalWindow; past it the hub takes no command from them until the
	// window ends. A person mistyping meets a handful.
	MaxRefusalsPerMinute = 60
	// refusalFlushEvery is how often a line's growing count is written
	// while its repeats go on, so a hub killed mid-flood loses little.
	refusalFlushEvery = 10 * time.Second
	// maxRefusalLines bounds the lines held in memory (users × actions).
	maxRefusalLines = 10_000
)

type refusalKey struct{ user, action string }

// refusalLine is the audit line standing for a user's repeats of an action
// in the current window.
type refusalLine struct {
	id           int64
	start, last  time.Time
	flushed      time.Time
	count, saved int
}

// userRefusals counts a user's refusals in their current window.
type userRefusals struct {
	start time.Time
	n     int
}

// refusals collapses repeated refusals into counted audit lines and
// rate-limits the users who meet too many.
type refusals struct {
	// mu is held across the audit writes too: repeats of one line are
	// counted in order, and a flood waits on SQLite instead of racing it.
	mu    sync.Mutex
	now   func() time.Time
	lines map[refusalKey]*refusalLine
	users map[string]*userRefusals
}

func (r *refusals) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// throttled reports, for a user past MaxRefusalsPerMinute in their current
// window, when that window ends; zero otherwise.
func (r *refusals) throttled(user string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	ur, ok := r.users[user]
	if !ok {
		return time.Time{}
	}
	end := ur.start.Add(refusalWindow)
	if ur.n < MaxRefusalsPerMinute || !r.clock().Before(end) {
		return time.Time{}
	}
	return end
}

// refuse audits a refusal of u's action: the first of a window writes a
// line, its repeats count on it, and each counts towards u's rate limit.
func (g *guard) refuse(u fleet.User, action fleet.ActionName, target, outcome string) {
	g.noteRepeat(u, action, target, outcome, true)
}

// noteRepeat audits something u met that changed nothing (a refusal, a
// failure before acting) as a line that repeats within the window count on.
func (g *guard) noteRepeat(u fleet.User, action fleet.ActionName, target, outcome string, refusal bool) {
	r := &g.refused
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lines == nil {
		r.lines, r.users = map[refusalKey]*refusalLine{}, map[string]*userRefusals{}
	}
	now := r.clock()
	e := auditEntry(u, action, target, outcome)
	if refusal {
		ur := r.users[e.User]
		if ur == nil || !now.Before(ur.start.Add(refusalWindow)) {
			if len(r.users) >= maxRefusalLines {
				clear(r.users)
			}
			ur = &userRefusals{start: now}
			r.users[e.User] = ur
		}
		ur.n++
	}
	k := refusalKey{e.User, e.Action}
	if l, ok := r.lines[k]; ok {
		if now.Before(l.start.Add(refusalWindow)) {
			l.count++
			l.last = now
			if now.Sub(l.flushed) >= refusalFlushEvery {
				g.saveCountLocked(l, now)
			}
			return
		}
		g.saveCountLocked(l, now)
		delete(r.lines, k)
	}
	if len(r.lines) >= maxRefusalLines {
		g.flushRefusalsLocked()
		clear(r.lines)
	}
	e.At, e.Count, e.Last = now, 1, now
	id, err := g.store.BeginAudit(context.Background(), e)
	if err != nil {
		g.log.Error("could not write the audit line", "user", e.User, "action", e.Action, "target", e.Target, "err", err)
		return
	}
	r.lines[k] = &refusalLine{id: id, start: now, last: now, flushed: now, count: 1, saved: 1}
}

// saveCountLocked writes a line's count when it grew since it was written.
func (g *guard) saveCountLocked(l *refusalLine, now time.Time) {
	l.flushed = now
	if l.count == l.saved {
		return
	}
	if err := g.store.SetAuditCount(context.Background(), l.id, l.count, l.last); err != nil {
		g.log.Error("could not record how many times a refusal was repeated", "audit_id", l.id, "count", l.count, "err", err)
		return
	}
	l.saved = l.count
}

// flushRefusals writes every line's count, so a reader of the audit log
// sees them as they are, and forgets the lines whose window has ended.
func (g *guard) flushRefusals() {
	g.refused.mu.Lock()
	defer g.refused.mu.Unlock()
	g.flushRefusalsLocked()
}

func (g *guard) flushRefusalsLocked() {
	r := &g.refused
	now := r.clock()
	for k, l := range r.lines {
		g.saveCountLocked(l, now)
		if !now.Before(l.start.Add(refusalWindow)) && l.count == l.saved {
			delete(r.lines, k)
		}
	}
}

// throttle refuses every command of a user past MaxRefusalsPerMinute
// until their window ends, counting it as one more refusal.
func (g *guard) throttle(u fleet.User, action fleet.ActionName, target string) error {
	until := g.refused.throttled(u.Name)
	if until.IsZero() {
		return nil
	}
	g.refuse(u, action, target, fmt.Sprintf("denied: over %d refusals a minute", MaxRefusalsPerMinute))
	return fmt.Errorf("too many refused commands: %s met more than %d refusals within a minute, so the hub takes no command from %s until %s; "+
		"stop whatever sends them (a script retrying a command your role may not run?)",
		u.Name, MaxRefusalsPerMinute, u.Name, until.UTC().Format("15:04:05 UTC"))
}
