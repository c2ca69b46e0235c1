package nodes

import (
	"context"
	"fmt"
	"io"
	"strconv"
)

// tailScript prints the last lines of a file on the node; the path arrives
// as data, and a leading ~/ means the node user's home.
const tailScript = `p=$2; case $p in "~/"*) p=$HOME/${p#"~/"};; esac; [ -r "$p" ] || { echo "no log at $p yet" >&2; exit 1; }; tail -n "$1" "$p"`

// WorkerLog writes the last lines of a worker's engine log to w.
func (m *Manager) WorkerLog(ctx context.Context, name string, lines int, w io.Writer) error {
	m.mu.Lock()
	ws, ok := m.workers[name]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("no worker named %s", name)
	}
	node, t, _, up := m.nodeFor(ws)
	if !up {
		return fmt.Errorf("node %s is %s; its logs cannot be read now", node.Name, node.State)
	}
	path := logPath(m.stateDir(t), node.Name, ws.placement.Model)
	if lines <= 0 {
		lines = 50
	}
	return t.Run(ctx, []string{"sh", "-c", tailScript, "fleet-tail", strconv.Itoa(lines), path}, nil, w, w)
}
