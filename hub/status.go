package hub

import (
	"context"
	"fmt"
	"time"

	"fleet"
)

// statusNodeOrder and statusWorkerOrder order `status` lines: healthy first, then
// on the way, then in trouble.
var (
	statusNodeOrder   = []string{string(fleet.NodeUp), "drained", string(fleet.NodeUnknown), string(fleet.NodeUnreachable)}
	statusWorkerOrder = []string{
		string(fleet.WorkerReady), string(fleet.WorkerDraining), string(fleet.WorkerProbation), string(fleet.WorkerStarting),
		string(fleet.WorkerInstalling), string(fleet.WorkerPending), string(fleet.WorkerStopped), string(fleet.WorkerFailed), string(fleet.WorkerRejected),
	}
)

// Status is `fleet status`: the hub, its addresses, and the fleet counted.
func (h *Hub) Status(ctx context.Context, u fleet.User) (fleet.HubStatus, error) {
	var st fleet.HubStatus
	err := h.guard.do(u, fleet.ActionStatus, "", func() (string, error) {
		// Status is what an operator reaches for when something is wrong,
		// the database included: what the hub holds in memory is answered
		// from there, and what it cannot read says so on its own line.
		if err := h.countKeys(ctx, &st); err != nil {
			st.KeysError = fmt.Sprintf("the database did not answer (%v)", err)
		}
		snap := h.snapshot(ctx)
		h.mu.Lock()
		started, addr, lan := h.started, h.httpAddr, h.lanName
		h.mu.Unlock()
		st.Version = h.opts.Version
		if u.Role.Allows(fleet.RoleAdmin) {
			st.DataDir = h.opts.DataDir // a path on the hub's machine: for those who run it
			if h.opts.DatabaseURL != "" {
				st.Database = h.DatabaseName() // without its password
			}
		}
		if st.Version == "" {
			st.Version = "dev"
		}
		if !started.IsZero() {
			st.StartedAt, st.UptimeSeconds = started, time.Since(started).Seconds()
		}
		if addr != "" {
			st.Router = "http://" + addr + "/v1"
		}
		st.KeysRequired = h.opts.RequireKeys || !fleet.IsLoopbackAddr(h.opts.HTTPAddr)
		st.Console, st.ConsoleName = h.opts.SSHAddr, lan
		st.EnginePorts = snap.EnginePorts.String()

		nodes := map[string]string{}
		for _, n := range snap.Nodes {
			s := string(n.State)
			if n.Drained && n.State == fleet.NodeUp {
				s = "drained"
			}
			nodes[n.Name] = s
		}
		workers := map[string]string{}
		ready, placed := map[string]int{}, map[string]int{}
		for _, w := range snap.Workers {
			workers[w.Name()] = string(w.State)
			placed[w.Model]++
			if w.State == fleet.WorkerReady {
				ready[w.Model]++
			}
		}
		st.Nodes, st.Workers = fleet.CountStates(nodes, statusNodeOrder), fleet.CountStates(workers, statusWorkerOrder)
		h.cluster.hubsStatus(ctx, &st)
		st.Models = []fleet.ModelStatus{}
		for _, m := range snap.Models {
			st.Models = append(st.Models, fleet.ModelStatus{ID: m.ID, Aliases: m.Aliases, Context: m.Context, Ready: ready[m.ID], Workers: placed[m.ID]})
		}
		return "", nil
	})
	return st, err
}

// statusReadTimeout bounds each of status's reads of the database, so that
// one that does not answer (a partition drops the packets) delays status
// by that much, not by the driver's connect timeout.
const statusReadTimeout = 2 * time.Second

// countKeys counts the live API keys in the database; when it does not
// answer, in the hub's own copy if it keeps one (a hub that checks keys).
func (h *Hub) countKeys(ctx context.Context, st *fleet.HubStatus) error {
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	keys, err := h.store.APIKeys(ctx)
	if err != nil {
		st.Keys, st.KeysFromMemory = h.ledger.keys.count()
		return err
	}
	for _, k := range keys {
		if k.Revoked.IsZero() {
			st.Keys++
		}
	}
	return nil
}
