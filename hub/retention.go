package hub

import (
	"context"
	"log/slog"
	"time"

	"fleet/store"
)

// DefaultRetention is how long the tables that grow with every request
// (samples, usage minutes) and events are kept: a month of history at a
// hundred requests a second is about 260 million sample rows otherwise.
const DefaultRetention = 30 * 24 * time.Hour

// pruneInterval paces the prune: the cut moves by an hour at a time, which
// a month of retention does not notice.
const pruneInterval = time.Hour

// pruner keeps the database's history within its retention and the audit
// log within its cap; the hub composes one and runs it.
type pruner struct {
	store *store.Store
	log   *slog.Logger
	// guard's counted refusals are written before the audit log is cut.
	guard *guard
	// retention is how long history is kept (negative: all of it);
	// auditMaxRows the audit log's cap (negative: none).
	retention    time.Duration
	auditMaxRows int
}

func newPruner(st *store.Store, log *slog.Logger, g *guard, opts Options) *pruner {
	p := &pruner{store: st, log: log, guard: g, retention: opts.Retention, auditMaxRows: opts.AuditMaxRows}
	if p.retention == 0 {
		p.retention = DefaultRetention
	}
	if p.auditMaxRows == 0 {
		p.auditMaxRows = DefaultAuditMaxRows
	}
	return p
}

// DefaultAuditMaxRows caps the audit log: an audit line is at most about
// 1 KB (its user, target and outcome are clipped), so 50 MB at worst, and
// years of a team's actions.
const DefaultAuditMaxRows = 50_000

// run deletes history older than the retention, and audit lines
// past the audit log's cap, at start and then every interval, until ctx
// ends.
func (p *pruner) run(ctx context.Context, every time.Duration) {
	if p.retention < 0 && p.auditMaxRows < 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		p.once(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *pruner) once(ctx context.Context, now time.Time) {
	var cut time.Time
	if p.retention >= 0 {
		cut = now.Add(-p.retention)
		pruned, err := p.store.PruneHistory(ctx, cut)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				p.log.Warn("could not prune old history; it is tried again in an hour", "err", err)
			}
		case pruned.Samples+pruned.Usage+pruned.Events > 0:
			p.log.Info("pruned history older than the retention", "retention", p.retention,
				"samples", pruned.Samples, "usage_minutes", pruned.Usage, "events", pruned.Events)
		}
	}
	p.guard.flushRefusals()
	n, err := p.store.PruneAudit(ctx, cut, p.auditMaxRows)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			p.log.Warn("could not prune the audit log; it is tried again in an hour", "err", err)
		}
	case n > 0:
		p.log.Info("pruned the audit log: repeated refusals older than the retention, then the oldest lines past its cap (refusals first)",
			"lines", n, "max_lines", p.auditMaxRows)
	}
}
