package hub

// The actions on workers and the fleet (drain, restart, apply, admit, trust),
// each run through the action table: authorized, audited, then done.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"fleet"
	"fleet/enginectl"
	"fleet/fleetfile"
	"fleet/nodes"
	"fleet/store"
)

// authorize looks the action up in the table (fleet.Actions) and refuses,
// auditing the refusal, one that is not there or that the user's role does
// not allow, and every action of a user past MaxRefusalsPerMinute. Every
// entry point of the hub that a user calls goes through it.
func (g *guard) authorize(u fleet.User, action fleet.ActionName, target string) (fleet.Action, error) {
	a, ok := fleet.LookupAction(action)
	if err := g.throttle(u, action, target); err != nil {
		return a, err
	}
	if !ok {
		g.refuse(u, action, target, "denied: not in the action table")
		return a, fmt.Errorf("permission denied: %q is not in the hub's action table, so nobody may do it", action)
	}
	if !u.Role.Allows(a.Role) {
		g.refuse(u, action, target, "denied: needs "+string(a.Role))
		return a, fmt.Errorf("permission denied: %s needs the %s role; you (%s) are %s", action, a.Role, u.Name, roleName(u.Role))
	}
	return a, nil
}

func roleName(r fleet.Role) string {
	if r == "" {
		return "nobody"
	}
	return string(r)
}

// Authorize is authorize for the command tree, which checks each command
// before it runs it.
func (h *Hub) Authorize(_ context.Context, u fleet.User, action fleet.ActionName, target string) error {
	_, err := h.guard.authorize(u, action, target)
	return err
}

// do is how an action runs: authorized by the table, its audit line written
// first when it is an audited one (and nothing done when that line cannot
// be written), then run, then its outcome recorded: "ok", "ok (note)" with
// the note run returns, or the error.
func (g *guard) do(u fleet.User, action fleet.ActionName, target string, run func() (note string, err error)) error {
	a, err := g.authorize(u, action, target)
	if err != nil {
		return err
	}
	return g.run(u, a, target, run)
}

// run is do for an action already authorized, once per target of an
// action on several. A read that fails is audited too, after the fact: it
// changed nothing, but someone tried.
func (g *guard) run(u fleet.User, a fleet.Action, target string, run func() (string, error)) error {
	line, err := g.begin(u, a, target)
	if err != nil {
		return err
	}
	note, err := run()
	switch {
	case !a.Audited:
		if err != nil {
			g.failed(u, a, target, err)
		}
	case err == nil && note != "":
		line.end("ok (" + note + ")")
	default:
		line.endErr(err)
	}
	return err
}

// failed audits an authorized action that failed before it changed
// anything: a read, or an action stopped before it reached any of its
// targets (an unknown name).
func (g *guard) failed(u fleet.User, a fleet.Action, target string, err error) {
	g.noteRepeat(u, a.Name, target, "failed: "+err.Error(), false)
}

// guardForRuns is the guard as admission's Runs ask for it
// (admission.Guard): the same checks and audit lines as every other action.
type guardForRuns struct{ g *guard }

func (r guardForRuns) Authorize(u fleet.User, action fleet.ActionName, target string) (fleet.Action, error) {
	return r.g.authorize(u, action, target)
}

func (r guardForRuns) Run(u fleet.User, a fleet.Action, target string, run func() (string, error)) error {
	return r.g.run(u, a, target, run)
}

func (r guardForRuns) Do(u fleet.User, action fleet.ActionName, target string, run func() (string, error)) error {
	return r.g.do(u, action, target, run)
}

func (r guardForRuns) Refuse(u fleet.User, action fleet.ActionName, target, outcome string) {
	r.g.refuse(u, action, target, outcome)
}

func (r guardForRuns) Failed(u fleet.User, a fleet.Action, target string, err error) {
	r.g.failed(u, a, target, err)
}

// Act does a per-worker action of the table (fleet.Action.PerWorker:
// drain, undrain, restart, stop, start) to workers: one audit line per
// worker.
func (h *Hub) Act(ctx context.Context, u fleet.User, kind fleet.ActionName, targets []string) (string, error) {
	target := strings.Join(targets, " ")
	op, ok := h.workerOp(kind)
	if !ok {
		return "", fmt.Errorf("unknown action %q: use %s", kind, perWorkerNames())
	}
	a, err := h.guard.authorize(u, kind, target)
	if err != nil {
		return "", err
	}
	names, err := h.state.Resolve(targets)
	if err != nil {
		h.guard.failed(u, a, target, err)
		return "", err
	}
	if op == nil {
		return h.stopStart(ctx, u, a, names)
	}
	var msgs []string
	for _, name := range names {
		err := h.guard.run(u, a, name, func() (string, error) {
			msg, err := h.cluster.onLeader(ctx, u, kind, name, nil, func() (string, error) { return op(ctx, name) })
			if err == nil {
				msgs = append(msgs, msg)
			}
			return "", err
		})
		if err != nil {
			return strings.Join(msgs, "\n"), err
		}
	}
	return strings.Join(msgs, "\n"), nil
}

// workerOp is what a per-worker action of the table does to one worker;
// ok is false for an action that is not one. stop and start have a nil op:
// they run on all their workers at once (stopStart).
func (h *Hub) workerOp(kind fleet.ActionName) (op func(ctx context.Context, name string) (string, error), ok bool) {
	if a, _ := fleet.LookupAction(kind); !a.PerWorker {
		return nil, false
	}
	switch kind {
	case fleet.ActionDrain:
		return func(_ context.Context, name string) (string, error) { return h.drain(name) }, true
	case fleet.ActionUndrain:
		return func(_ context.Context, name string) (string, error) { return h.undrain(name) }, true
	case fleet.ActionRestart:
		return h.restart, true
	case fleet.ActionStop, fleet.ActionStart:
		return nil, true
	}
	return nil, false
}

// perWorkerNames lists the per-worker actions of the table for an error:
// "drain, undrain, restart, stop or start".
func perWorkerNames() string {
	var names []string
	for _, a := range fleet.Actions() {
		if a.PerWorker {
			names = append(names, string(a.Name))
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func (h *Hub) setDrained(name string, drained bool) (fleet.Worker, error) {
	h.saveMu.Lock()
	defer h.saveMu.Unlock()
	h.state.mu.Lock()
	w, ok := h.state.workers[name]
	was := w.Drained
	if ok {
		w.Drained = drained
		h.state.workers[name] = w
	}
	h.state.mu.Unlock()
	if !ok {
		return w, fmt.Errorf("worker %s is gone", name)
	}
	if _, err := h.store.SaveWorker(context.Background(), w); err != nil {
		// Not recorded, not done: the flag people see goes back too.
		h.state.mu.Lock()
		if cur, ok := h.state.workers[name]; ok {
			cur.Drained = was
			h.state.workers[name] = cur
		}
		h.state.mu.Unlock()
		return w, fmt.Errorf("recording the drain flag of %s: %w; nothing was changed", name, err)
	}
	return w, nil
}

func (h *Hub) drain(name string) (string, error) {
	if _, err := h.setDrained(name, true); err != nil {
		return "", err
	}
	h.fault("drain.recorded")
	h.router.Drain(name)
	inflight := h.router.InFlight(name)
	h.onEvent(fleet.Event{Level: "info", Subject: name, Message: fmt.Sprintf("draining: no new requests; %d in flight", inflight)})
	h.detached.goDetached(context.Background(), func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, h.opts.DrainTimeout)
		defer cancel()
		if err := h.cluster.waitIdle(ctx, name); err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				return // the hub is closing
			}
			h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: fmt.Sprintf("drain timed out after %s: %v", h.opts.DrainTimeout, err)})
			return
		}
		h.onEvent(fleet.Event{Level: "info", Subject: name, Message: "drained: no requests in flight"})
	})
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
	err := h.cluster.waitIdle(wait, name)
	cancel()
	if err != nil {
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: fmt.Sprintf("restart: drain timed out after %s; stopping with requests in flight: %v", h.opts.DrainTimeout, err)})
	}
	if err := h.mgr.RestartWorker(ctx, name); err != nil {
		return "", fmt.Errorf("restarting %s: %w; it stays drained, so once it is ready again run `fleet undrain %s`", name, err, name)
	}
	if _, err := h.setDrained(name, false); err != nil {
		return "", err
	}
	h.router.Undrain(name)
	h.state.mu.Lock()
	w := h.state.workers[name]
	h.state.mu.Unlock()
	return fmt.Sprintf("restarted %s: %s", name, strings.Join(w.Argv, " ")), nil
}

// Apply makes the declared fleet match a fleet file.
func (h *Hub) Apply(ctx context.Context, u fleet.User, filename string, data []byte, dryRun bool) (plan string, err error) {
	action := fleet.ActionApply
	if dryRun {
		action = fleet.ActionApplyDryRun
	}
	err = h.guard.do(u, action, filename, func() (string, error) {
		if dryRun {
			plan, err = h.apply(ctx, filename, data, true)
			return "", err
		}
		plan, err = h.cluster.onLeader(ctx, u, action, filename, applyArgs{File: filename, Data: data}, func() (string, error) {
			return h.apply(ctx, filename, data, false)
		})
		return "", err
	})
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
	if err := h.cluster.checkMachines(ctx, next); err != nil {
		return "", fmt.Errorf("%s: %w; nothing was changed", filename, err)
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
		if h.mgr != nil {
			h.fault("apply.stored")
		}
	}
	if h.mgr != nil { // nil while Open applies the start-up file
		applied, err := h.store.LoadFleet(ctx)
		if err != nil {
			return "", err
		}
		h.state.mu.Lock()
		h.state.models = applied.Models
		h.state.placements = applied.Placements
		for _, n := range applied.Nodes {
			if old, ok := h.state.nodes[n.Name]; ok && n.Platform == nil {
				n.Platform = old.Platform
			}
			h.state.nodes[n.Name] = n
		}
		for name := range h.state.nodes {
			if !slices.ContainsFunc(applied.Nodes, func(n fleet.Node) bool { return n.Name == name }) {
				delete(h.state.nodes, name)
			}
		}
		h.state.mu.Unlock()
		if err := h.router.SetModels(applied.Models); err != nil {
			// The fleet file's validation makes this unreachable; say so loudly if not.
			h.log.Error("the router refused the applied models; it keeps the previous ones", "err", err)
		}
		h.mgr.SetDesired(applied)
		h.syncRouter()
		h.judge.ReferencesMoved(ctx, cur, applied)
	}
	if plan.Empty() {
		return "no changes\n", nil
	}
	return plan.String(), nil
}

// Export prints the declared fleet as a fleet file. Admins get it whole,
// secrets included: they can set every one of them with apply anyway, and
// an export is their backup, which must restore the fleet as it was.
// Everyone else gets the secrets as fleet.Redacted (fleet.RedactModels),
// and the file says so in a comment at its top, since apply refuses it
// until each placeholder is replaced: no round trip loses a secret silently.
func (h *Hub) Export(ctx context.Context, u fleet.User) (data []byte, err error) {
	err = h.guard.do(u, fleet.ActionExport, "", func() (string, error) {
		f, err := h.store.LoadFleet(ctx)
		if err != nil {
			return "", err
		}
		admin := u.Role.Allows(fleet.RoleAdmin)
		if !admin {
			f.Models = fleet.RedactModels(f.Models)
		}
		data, err = fleetfile.Marshal(f)
		if err != nil || admin {
			return "", err
		}
		if n := bytes.Count(data, []byte(fleet.Redacted)); n > 0 {
			note := fmt.Sprintf("# Exported for %s (%s): %d secret value(s) below are shown as %s (recipe env values,\n"+
				"# secret flags like --api-key, credentials in URLs and install scripts). apply refuses this file\n"+
				"# until each is replaced by the real value; an admin's export has them.\n", u.Name, u.Role, n, fleet.Redacted)
			data = append([]byte(fleet.Sanitize(note)), data...)
		}
		return "", nil
	})
	return data, err
}

// ForceAdmit overrides a failed admission check (operator; audited).
func (h *Hub) ForceAdmit(ctx context.Context, u fleet.User, worker string) (string, error) {
	a, err := h.guard.authorize(u, fleet.ActionForceAdmit, worker)
	if err != nil {
		return "", err
	}
	names, err := h.state.Resolve([]string{worker})
	if err != nil {
		h.guard.failed(u, a, worker, err)
		return "", err
	}
	for _, name := range names {
		err := h.guard.run(u, a, name, func() (string, error) {
			_, err := h.cluster.onLeader(ctx, u, a.Name, name, nil, func() (string, error) { return "", forceAdmit(ctx, h.mgr, name) })
			return "", err
		})
		if err != nil {
			return "", err
		}
		h.onEvent(fleet.Event{Level: "warn", Subject: name, Message: "admitted by " + u.Name + " over its failed admission check"})
	}
	return fmt.Sprintf("admitted %s over its admission check", strings.Join(names, ", ")), nil
}

// TrustNode forgets a node's pinned host key so the next connection pins the
// key the node presents now (admin; audited). It is how an operator accepts
// a reinstalled machine after the hub refused its changed key.
func (h *Hub) TrustNode(ctx context.Context, u fleet.User, node string) (string, error) {
	err := h.guard.do(u, fleet.ActionNodeTrust, node, func() (string, error) {
		return h.cluster.onLeader(ctx, u, fleet.ActionNodeTrust, node, nil, func() (string, error) {
			return clearHostKey(ctx, h.store, h.mgr, node)
		})
	})
	if err != nil {
		return "", err
	}
	h.onEvent(fleet.Event{Level: "warn", Subject: node, Message: u.Name + " cleared the pinned host key; the next connection pins the key the node presents"})
	return fmt.Sprintf("node %s: pinned host key cleared; connecting again now, and that connection records the new one", node), nil
}

// forceAdmit admits a worker over its failed admission check.
func forceAdmit(ctx context.Context, mgr *nodes.Manager, name string) error {
	if err := mgr.ForceAdmit(ctx, name); err != nil {
		return fmt.Errorf("admitting %s: %w", name, err)
	}
	return nil
}

// clearHostKey forgets node's pinned host key and connects again, which
// pins the key the node presents now; it says which key was pinned.
func clearHostKey(ctx context.Context, st *store.Store, mgr *nodes.Manager, node string) (string, error) {
	n, err := st.Node(ctx, node)
	if err != nil {
		return "", err
	}
	if err := st.SetNodeHostKey(ctx, node, ""); err != nil {
		return "", err
	}
	mgr.RetryNode(node)
	if n.HostKey == "" {
		return "was none pinned", nil
	}
	return "was " + nodes.HostKeyFingerprint(n.HostKey), nil
}
