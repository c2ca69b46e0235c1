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

// pruneHistory deletes history older than the retention at start and then
// every interval, until ctx ends.
func (h *Hub) pruneHistory(ctx context.Context, every time.Duration) {
	if h.retention() < 0 {
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
	p, err := h.store.PruneHistory(ctx, now.Add(-h.retention()))
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("could not prune old history; it is tried again in an hour", "err", err)
		}
		return
	}
	if p.Samples+p.Usage+p.Events > 0 {
		h.log.Info("pruned history older than the retention", "retention", h.retention(),
			"samples", p.Samples, "usage_minutes", p.Usage, "events", p.Events)
	}
}
