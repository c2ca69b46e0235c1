package nodes

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"fleet"
	"fleet/enginectl"
)

// MaxLogFollow ends a `logs -f` nobody stopped, so a forgotten follow does
// not hold a session on the node forever. (The lines a read may ask for are
// bounded by fleet.MaxLogLines.)
const MaxLogFollow = 24 * time.Hour

// tailScript prints the last lines of a file on the node and, with $3 = f,
// follows it by name (-F), so the new log after a restart (node.sh moves the
// old one to .log.1) is followed too. The path arrives as data, and a
// leading ~/ means the node user's home. exec makes tail the process the
// transport started, so cancelling the command ends tail itself, not only
// a shell above it (the SSH transport kills the remote tree by that PID).
const tailScript = `p=$2; case $p in "~/"*) p=$HOME/${p#"~/"};; esac; [ -r "$p" ] || { echo "no log at $p yet" >&2; exit 1; }
if [ "$3" = f ]; then exec tail -n "$1" -F "$p"; fi
exec tail -n "$1" "$p"`

// WorkerLog writes the last lines of a worker's engine log to w.
func (m *Manager) WorkerLog(ctx context.Context, name string, lines int, w io.Writer) error {
	return m.StreamWorkerLog(ctx, name, lines, false, w)
}

// StreamWorkerLog writes the last lines of a worker's engine log to w and,
// with follow, keeps writing what the engine logs until ctx ends (at most
// MaxLogFollow). The log is read on the worker's node through its
// transport, where node.sh launched the engine with its output in it.
func (m *Manager) StreamWorkerLog(ctx context.Context, name string, lines int, follow bool, w io.Writer) error {
	m.mu.Lock()
	ws, ok := m.workers[name]
	following := !m.leading
	m.mu.Unlock()
	var p fleet.Placement
	switch {
	case ok:
		p = ws.placement
	case following:
		// A follower supervises no worker, but reaches its node all the
		// same: the log is where the worker's name puts it.
		node, model, found := strings.Cut(name, "/")
		if !found {
			return fmt.Errorf("no worker named %s: workers are named NODE/MODEL, see `fleet workers`", name)
		}
		p = fleet.Placement{Node: node, Model: model}
	default:
		return fmt.Errorf("no worker named %s", name)
	}
	node, t, _, up := m.nodeNamed(p.Node)
	if !up {
		return fmt.Errorf("node %s is %s; its logs cannot be read now", node.Name, node.State)
	}
	return tailLog(ctx, t, logPath(m.stateDir(t), node.Name, p.Model), lines, follow, w)
}

// tailLog runs tailScript on the node of t. A follow ends when ctx does:
// the transports kill the remote command (locally its process group, over
// SSH its process tree by PID from a second session), so no tail is left
// behind on the node.
func tailLog(ctx context.Context, t Transport, path string, lines int, follow bool, w io.Writer) error {
	if lines <= 0 {
		lines = fleet.DefaultLogLines
	}
	lines = min(lines, fleet.MaxLogLines)
	argv := []string{"sh", "-c", tailScript, "fleet-tail", strconv.Itoa(lines), path, ""}
	if !follow {
		return t.Run(ctx, argv, nil, w, w)
	}
	argv[len(argv)-1] = "f"
	// A deadline of its own, or the transport would apply its ten-minute
	// command timeout to a follow.
	fctx, cancel := context.WithTimeout(ctx, MaxLogFollow)
	defer cancel()
	err := t.Run(fctx, argv, nil, w, w)
	switch {
	case ctx.Err() != nil:
		return nil // the reader left: the normal end of a follow
	case fctx.Err() != nil:
		fmt.Fprintf(w, "fleet: stopped following after %s; run it again to go on\n", MaxLogFollow)
		return nil
	}
	return err
}

func logPath(stateDir, node, model string) string {
	if stateDir == "" {
		stateDir = "~/.fleet"
	}
	return filepath.Join(stateDir, enginectl.FileStem(node, model)+".log")
}
