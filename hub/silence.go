package hub

import (
	"context"
	"time"
)

// linkCheckTimeout is how long a node may take to answer the keepalive sent
// when one of its workers gave a request no first byte in time. A node on a
// working network answers in milliseconds.
const linkCheckTimeout = 2 * time.Second

// onNodeSuspect hands the node manager's suspicion of a node (it missed a
// keepalive; reason "" when it answers again) to the router for each of
// the node's workers.
func (h *Hub) onNodeSuspect(node, reason string) {
	h.state.mu.Lock()
	var names []string
	for name, w := range h.state.workers {
		if w.Node == node {
			names = append(names, name)
		}
	}
	h.state.mu.Unlock()
	for _, name := range names {
		h.router.SetSuspect(name, reason)
	}
}

// checkWorkerNode asks the node of a worker that left a request without a
// first byte whether it is still there. If it answers, the worker was only
// slow and takes requests again at once; if not, the node is suspect and
// every one of its workers gets no new requests until it answers
// (onNodeSuspect).
func (h *Hub) checkWorkerNode(worker string) {
	h.state.mu.Lock()
	w, ok := h.state.workers[worker]
	h.state.mu.Unlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*linkCheckTimeout)
	defer cancel()
	if err := h.mgr.CheckNode(ctx, w.Node, linkCheckTimeout); err != nil {
		h.log.Warn("a worker's node did not answer a keepalive after a request got no first byte", "worker", worker, "node", w.Node, "err", err)
		return
	}
	h.router.SetSuspect(worker, "")
}
