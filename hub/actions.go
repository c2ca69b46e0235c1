package hub

// The actions on workers and the fleet (drain, restart, apply, admit, trust),
// each run through the action table: authorized, audited, then done.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"fleet"
	"fleet/enginectl"
	"fleet/fleetfile"
	"fleet/nodes"
)

// authorize refuses (and audits the refusal of) an action the user's role
// does not allow.
func (h *Hub) authorize(u fleet.User, need fleet.Role, action, target string) error {
	if u.Role.Allows(need) {
		return nil
	}
	h.audit(u, action, target, "denied: needs "+string(need))
	return fmt.Errorf("permission denied: %s needs the %s role; you (%s) are %s", action, need, u.Name, roleName(u.Role))
}

func roleName(r fleet.Role) string {
	if r == "" {
		return "nobody"
	}
	return string(r)
}

// Act drains, undrains or restarts workers, after checking the role.
func (h *Hub) Act(ctx context.Context, u fleet.User, kind string, targets []string) (string, error) {
	target := strings.Join(targets, " ")
	switch kind {
	case "drain", "undrain", "restart", "stop", "start":
	default:
		return "", fmt.Errorf("unknown action %q: use drain, undrain, restart, stop or start", kind)
	}
	if err := h.authorize(u, fleet.ActionRole(kind), kind, target); err != nil {
		return "", err
	}
	names, err := h.resolve(targets)
	if err != nil {
		h.audit(u, kind, target, "failed: "+err.Error())
		return "", err
	}
	if kind == "stop" || kind == "start" {
		return h.stopStart(ctx, u, kind, names)
	}
	var msgs []string
	for _, name := range names {
		line, err := h.begin(u, kind, name)
		if err != nil {
			return strings.Join(msgs, "\n"), err
		}
		var msg string
		switch kind {
		case "drain":
			msg, err = h.drain(name)
		case "undrain":
			msg, err = h.undrain(name)
		case "restart":
			msg, err = h.restart(ctx, name)
		}
		line.endErr(err)
		if err != nil {
			return strings.Join(msgs, "\n"), err
		}
		msgs = append(msgs, msg)
	}
	return strings.Join(msgs, "\n"), nil
}

func (h *Hub) setDrained(name string, drained bool) (fleet.Worker, error) {
	h.mu.Lock()
	w, ok := h.workers[name]
	was := w.Drained
	if ok {
		w.Drained = drained
		h.workers[name] = w
	}
	h.mu.Unlock()
	if !ok {
		return w, fmt.Errorf("worker %s is gone", name)
	}
	if _, err := h.store.SaveWorker(context.Background(), w); err != nil {
		// Not recorded, not done: the flag people see goes back too.
		h.mu.Lock()
		if cur, ok := h.workers[name]; ok {
			cur.Drained = was
			h.workers[name] = cur
		}
		h.mu.Unlock()
		return w, fmt.Errorf("recording the drain flag of %s: %w; nothing was changed", name, err)
	}
	return w, nil
}

func (h *Hub) drain(name string) (string, error) {
	if _, err := h.setDrained(name, true); err != nil {
		return "", err
	}
	h.router.Drain(name)
	inflight := h.router.InFlight(name)
	h.onEvent(fleet.Event{Level: "info", Subject: name, Message: fmt.Sprintf("draining: no new requests; %d in flight", inflight)})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.opts.DrainTimeout)
		defer cancel()
		if err := h.router.WaitIdle(ctx, name); err != nil {
			h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: fmt.Sprintf("drain timed out after %s with %d requests still in flight", h.opts.DrainTimeout, h.router.InFlight(name))})
			return
		}
		h.onEvent(fleet.Event{Level: "info", Subject: name, Message: "drained: no requests in flight"})
	}()
	return fmt.Sprintf("draining %s: no new requests; %d in flight will finish (timeout %s)", name, inflight, h.opts.DrainTimeout), nil
}

func (h *Hub) undrain(name string) (string, error) {
	if _, err := h.setDrained(name, false); err != nil {
		return "", err
	}
	h.router.Undrain(name)
	h.onEvent(fleet.Event{Level: "info", Subject: name, Message: "undrained: taking requests"})
	return fmt.Sprintf("%s takes requests again", name), nil
}

func (h *Hub) restart(ctx context.Context, name string) (string, error) {
	if _, err := h.drain(name); err != nil {
		return "", err
	}
	wait, cancel := context.WithTimeout(ctx, h.opts.DrainTimeout)
	err := h.router.WaitIdle(wait, name)
	cancel()
	if err != nil {
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: "restart: drain timed out; stopping with requests in flight"})
	}
	if err := h.mgr.RestartWorker(ctx, name); err != nil {
		return "", fmt.Errorf("restarting %s: %w; it stays drained, so once it is ready again run `fleet undrain %s`", name, err, name)
	}
	if _, err := h.setDrained(name, false); err != nil {
		return "", err
	}
	h.router.Undrain(name)
	h.mu.Lock()
	w := h.workers[name]
	h.mu.Unlock()
	return fmt.Sprintf("restarted %s: %s", name, strings.Join(w.Argv, " ")), nil
}

// Apply makes the declared fleet match a fleet file.
func (h *Hub) Apply(ctx context.Context, u fleet.User, filename string, data []byte, dryRun bool) (string, error) {
	action := "apply"
	if dryRun {
		action = "apply --dry-run"
	}
	if err := h.authorize(u, fleet.RoleAdmin, action, filename); err != nil {
		return "", err
	}
	if dryRun {
		plan, err := h.apply(ctx, filename, data, true)
		if err != nil {
			h.audit(u, action, filename, "failed: "+err.Error())
		}
		return plan, err
	}
	line, err := h.begin(u, action, filename)
	if err != nil {
		return "", err
	}
	plan, err := h.apply(ctx, filename, data, false)
	line.endErr(err)
	return plan, err
}

func (h *Hub) apply(ctx context.Context, filename string, data []byte, dryRun bool) (string, error) {
	next, err := fleetfile.Parse(filename, data)
	if err != nil {
		return "", err
	}
	if err := fleetfile.RefuseRedacted(filename, next); err != nil {
		return "", err
	}
	// A dry run validates exactly as an apply does, launch checks included.
	for _, m := range next.Models {
		if err := enginectl.CheckRecipes(m); err != nil {
			return "", fmt.Errorf("%s: %w; nothing was changed", filename, err)
		}
	}
	cur, err := h.store.LoadFleet(ctx)
	if err != nil {
		return "", err
	}
	plan := fleetfile.Diff(cur, next)
	if dryRun {
		if plan.Empty() {
			return "no changes\n", nil
		}
		return plan.String(), nil
	}
	if !plan.Empty() {
		if err := h.store.ApplyFleet(ctx, next); err != nil {
			return "", err
		}
	}
	if h.mgr != nil { // nil while Open applies the start-up file
		applied, err := h.store.LoadFleet(ctx)
		if err != nil {
			return "", err
		}
		h.mu.Lock()
		h.models = applied.Models
		h.placements = applied.Placements
		for _, n := range applied.Nodes {
			if old, ok := h.nodes[n.Name]; ok && n.Platform == nil {
				n.Platform = old.Platform
			}
			h.nodes[n.Name] = n
		}
		for name := range h.nodes {
			if !slices.ContainsFunc(applied.Nodes, func(n fleet.Node) bool { return n.Name == name }) {
				delete(h.nodes, name)
			}
		}
		h.mu.Unlock()
		if err := h.router.SetModels(applied.Models); err != nil {
			// The fleet file's validation makes this unreachable; say so loudly if not.
			h.log.Error("the router refused the applied models; it keeps the previous ones", "err", err)
		}
		h.mgr.SetDesired(applied)
		h.syncRouter()
		h.referencesMoved(ctx, cur, applied)
	}
	if plan.Empty() {
		return "no changes\n", nil
	}
	return plan.String(), nil
}

// Export prints the declared fleet as a fleet file; recipe env values are
// redacted for everyone but admins (see fleet.RedactModels).
func (h *Hub) Export(ctx context.Context, u fleet.User) ([]byte, error) {
	f, err := h.store.LoadFleet(ctx)
	if err != nil {
		return nil, err
	}
	if !u.Role.Allows(fleet.RoleAdmin) {
		f.Models = fleet.RedactModels(f.Models)
	}
	return fleetfile.Marshal(f)
}

// ForceAdmit overrides a failed admission check (operator; audited).
func (h *Hub) ForceAdmit(ctx context.Context, u fleet.User, worker string) (string, error) {
	if err := h.authorize(u, fleet.RoleOperator, "admit --force", worker); err != nil {
		return "", err
	}
	names, err := h.resolve([]string{worker})
	if err != nil {
		h.audit(u, "admit --force", worker, "failed: "+err.Error())
		return "", err
	}
	for _, name := range names {
		line, err := h.begin(u, "admit --force", name)
		if err != nil {
			return "", err
		}
		if err := h.mgr.ForceAdmit(ctx, name); err != nil {
			line.endErr(err)
			return "", fmt.Errorf("admitting %s: %w", name, err)
		}
		line.end("ok")
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: "admitted by " + u.Name + " over its failed admission check"})
	}
	return fmt.Sprintf("admitted %s over its admission check", strings.Join(names, ", ")), nil
}

// TrustNode forgets a node's pinned host key so the next connection pins the
// key the node presents now (admin; audited). It is how an operator accepts
// a reinstalled machine after the hub refused its changed key.
func (h *Hub) TrustNode(ctx context.Context, u fleet.User, node string) (string, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "node trust", node); err != nil {
		return "", err
	}
	n, err := h.store.Node(ctx, node)
	if err != nil {
		h.audit(u, "node trust", node, "failed: "+err.Error())
		return "", err
	}
	line, err := h.begin(u, "node trust", node)
	if err != nil {
		return "", err
	}
	if err := h.store.SetNodeHostKey(ctx, node, ""); err != nil {
		line.endErr(err)
		return "", err
	}
	h.mgr.RetryNode(node)
	was := "none pinned"
	if n.HostKey != "" {
		was = nodes.HostKeyFingerprint(n.HostKey)
	}
	line.end("ok (was " + was + ")")
	h.onEvent(fleet.Event{Level: "warn", Subject: node, Message: u.Name + " cleared the pinned host key; the next connection pins the key the node presents"})
	return fmt.Sprintf("node %s: pinned host key cleared; connecting again now, and that connection records the new one", node), nil
}
