package router

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Health checking is apart from selection, as Caddy keeps its health checks
// beside its selection policies: selection only reads whether a backend is
// cooling down; a backend that cools down (recordFailure) gets its own
// checker, which asks its /health every Cooldown until it answers, and then
// gives it back to selection. A checker ends when its backend leaves the
// router's set (a restarted engine is a new backend, which the hub vouches
// for).

// healthCheckTimeout bounds one /health request.
const healthCheckTimeout = 3 * time.Second

// checkHealth waits out b's cooldown and checks its health, again after
// each failed check, until one passes or b is no longer routed to.
func (r *Router) checkHealth(b *backend) {
	for {
		wait, cooling := r.pool.cooling(b)
		if !cooling {
			return
		}
		if wait > 0 {
			time.Sleep(wait)
			continue // the backend may have gone or been reset meanwhile
		}
		ctx, cancel := context.WithTimeout(context.Background(), healthCheckTimeout)
		err := r.healthCheck(ctx, b)
		cancel()
		r.pool.checked(b, err)
		if err != nil {
			r.log.Info("backend still failing its health check", "backend", b.cfg.Name, "err", err)
			continue
		}
		r.log.Info("backend passed its health check and takes traffic again", "backend", b.cfg.Name)
		r.sched.dispatch(b.cfg.Model)
		return
	}
}

func (r *Router) healthCheck(ctx context.Context, b *backend) error {
	u := b.base
	u.Path = "/health"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("building the health check: %w", err)
	}
	resp, err := b.transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("checking %s: %w", b.cfg.Addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("checking %s: /health answered %s", b.cfg.Addr, resp.Status)
	}
	return nil
}
