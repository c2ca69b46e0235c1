package hub

import (
	"context"
	"fmt"

	"fleet"
	"fleet/internal/mdns"
	"fleet/store"
)

// announce gives the console its LAN name (NAME.local, _ssh._tcp) when it
// listens off loopback and the announcement is on. A failure leaves the
// console served: it is still reachable by address.
func (h *Hub) announce() (stop func()) {
	if h.opts.SSHAddr == "" || h.opts.MDNSName == "" || fleet.IsLoopbackAddr(h.opts.SSHAddr) {
		return func() {}
	}
	a, err := mdns.Announce(h.opts.MDNSName, h.opts.SSHAddr, h.log.With("component", "mdns"))
	if err != nil {
		h.log.Warn("the console is not announced by mDNS; reach it by address", "err", err)
		return func() {}
	}
	h.log.Info("console announced by mDNS", "host", a.Host, "service", mdns.ServiceType, "addresses", a.IPs)
	h.mu.Lock()
	h.lanName = a.Host
	h.mu.Unlock()
	return func() {
		_ = a.Close()
		h.mu.Lock()
		h.lanName = ""
		h.mu.Unlock()
	}
}

// LANName is the console's announced name (e.g. "fleet.local"), or "" when
// it is not announced. Set before Run calls ready.
func (h *Hub) LANName() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lanName
}

// requireConsoleAdmins refuses a console off loopback that nobody could log
// in to: the loopback bootstrap (the hub user's own ~/.ssh keys) is not
// offered to a network, so the first admins must come from --admin-keys.
func requireConsoleAdmins(ctx context.Context, st *store.Store, opts Options) error {
	if opts.SSHAddr == "" || fleet.IsLoopbackAddr(opts.SSHAddr) || opts.AdminKeysFile != "" {
		return nil
	}
	n, err := st.CountUsers(ctx)
	if err != nil {
		return fmt.Errorf("counting console users: %w", err)
	}
	if n > 0 {
		return nil
	}
	return fmt.Errorf("the console would listen on %s, off loopback, but no console user exists and no --admin-keys was given, "+
		"so nobody could log in: pass --admin-keys FILE (an authorized_keys file, e.g. a copy of your ~/.ssh/id_ed25519.pub), "+
		"or start on loopback first and add people with 'fleet user add NAME --role admin < key.pub'", opts.SSHAddr)
}
