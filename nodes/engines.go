package nodes

import (
	"context"

	"fleet"
	"fleet/enginectl"
)

// locateEngines records on p where each engine that can run on the node is
// found there (Homebrew, ~/.local/bin, a venv off PATH), for `fleet nodes`.
// A node whose engines cannot be looked for is still up: that is logged,
// and p has none.
func (m *Manager) locateEngines(ctx context.Context, node string, t Transport, p *fleet.Platform) {
	found, err := enginectl.LocateEngines(ctx, t, *p)
	if err != nil {
		m.logger.Warn("cannot tell which engines the node has", "node", node, "err", err)
		return
	}
	if len(found) > 0 {
		p.Engines = found
	}
}
