package hub

import (
	"bytes"
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
	return h.guard.do(u, fleet.ActionLogs, target, func() (string, error) {
		names, err := h.state.Resolve([]string{target})
		if err != nil {
			return "", err
		}
		if target == "all" || len(names) > 1 {
			sort.Strings(names)
			return "", fmt.Errorf("logs reads one worker's log and %q names %d: name one of %s", target, len(names), listOrNone(names))
		}
		lw := &logLines{w: w, admin: u.Role.Allows(fleet.RoleAdmin)}
		err = h.mgr.StreamWorkerLog(ctx, names[0], lines, follow, lw)
		if ferr := lw.flush(); err == nil {
			err = ferr
		}
		return "", err
	})
}

// maxLogLineBytes bounds what logLines holds of a line without a newline.
const maxLogLineBytes = 64 << 10

// logLines passes an engine's log to the reader a line at a time, each
// sanitised (fleet.Sanitize: the engine's text enters the hub here) and,
// for all but admins, redacted: vLLM logs its settings, --api-key's
// value included, when it starts.
type logLines struct {
	w     io.Writer
	admin bool
	buf   []byte
}

func (l *logLines) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if err := l.line(l.buf[:i+1]); err != nil {
			return len(p), err
		}
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > maxLogLineBytes {
		return len(p), l.flush()
	}
	return len(p), nil
}

func (l *logLines) line(b []byte) error {
	s := fleet.Sanitize(string(b))
	if !l.admin {
		s = fleet.RedactText(s)
	}
	_, err := io.WriteString(l.w, s)
	return err
}

// flush writes what is left of a line without a newline.
func (l *logLines) flush() error {
	if len(l.buf) == 0 {
		return nil
	}
	err := l.line(l.buf)
	l.buf = l.buf[:0]
	return err
}
