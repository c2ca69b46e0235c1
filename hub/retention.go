package hub

import (
	"context"
	"time"
)

// DefaultRetention is how long the tables that grow with every request
// (samples, usage minutes) and events are kept: a month of history at a
// hundred requests a second is about 260 million sample rows otherwise.
const DefaultRetention = 30 * 24 * time.Hour

// pruneInterval paces the prune: the cut moves by an hour at a time, which
// a month of retention does not notice.
const pruneInterval = time.Hour

func (h *Hub) retention() time.Duration {
	if h.opts.Retention == 0 {
		return DefaultRetention
	}
	return h.opts.Retention
}

// DefaultAuditMaxRows caps the audit log: an audit line is at most about
// 1 KB (its user, target and outcome are clipped), so 50 MB at worst, and
// years of a team's actions.
const DefaultAuditMaxRows = 50_000

func (h *Hub) auditMaxRows() int {
	if h.opts.AuditMaxRows == 0 {
		return DefaultAuditMaxRows
	}
	return h.opts.AuditMaxRows
}

// pruneHistory deletes history older than the retention, and audit lines
// past the audit log's cap, at start and then every interval, until ctx
// ends.
func (h *Hub) pruneHistory(ctx context.Context, every time.Duration) {
	if h.retention() < 0 && h.auditMaxRows() < 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		h.pruneOnce(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *Hub) pruneOnce(ctx context.Context, now time.Time) {
	var cut time.Time
	if h.retention() >= 0 {
		cut = now.Add(-h.retention())
		p, err := h.store.PruneHistory(ctx, cut)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				h.log.Warn("could not prune old history; it is tried again in an hour", "err", err)
			}
		case p.Samples+p.Usage+p.Events > 0:
			h.log.Info("pruned history older than the retention", "retention", h.retention(),
				"samples", p.Samples, "usage_minutes", p.Usage, "events", p.Events)
		}
	}
	h.flushRefusals()
	n, err := h.store.PruneAudit(ctx, cut, h.auditMaxRows())
	switch {
	case err != nil:
		if ctx.Err() == nil {
			h.log.Warn("could not prune the audit log; it is tried again in an hour", "err", err)
		}
	case n > 0:
		h.log.Info("pruned the audit log: repeated refusals older than the retention, then the oldest lines past its cap (refusals first)",
			"lines", n, "max_lines", h.auditMaxRows())
	}
}
