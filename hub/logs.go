package hub

import (
	"context"
	"fmt"
	"io"
	"sort"

	"fleet"
)

// Logs writes the last lines of a worker's engine log, read on its node
// through the node's transport, and with follow what it logs next until ctx
// ends. A node name stands for its worker when it has only one.
func (h *Hub) Logs(ctx context.Context, u fleet.User, target string, lines int, follow bool, w io.Writer) error {
	return h.do(u, "logs", target, func() (string, error) {
		names, err := h.resolve([]string{target})
		if err != nil {
			return "", err
		}
		if target == "all" || len(names) > 1 {
			sort.Strings(names)
			return "", fmt.Errorf("logs reads one worker's log and %q names %d: name one of %s", target, len(names), listOrNone(names))
		}
		return "", h.mgr.StreamWorkerLog(ctx, names[0], lines, follow, w)
	})
}
