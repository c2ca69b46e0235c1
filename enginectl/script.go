package enginectl

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"strings"
)

// nodeScript is the only shell code enginectl runs on a node. It is a
// fixed text: the operation and all data arrive as positional parameters
// ($1 = operation), so the transport's single quoting of argv is the only
// quoting there is. It must run under any POSIX sh on Linux (with or without
// procps) and macOS (no setsid(1), no /proc).
//
// FLEET_ENGINECTL_NO_PROC and FLEET_ENGINECTL_NO_SETSID force the fallbacks
// macOS takes, so Linux tests exercise them too.
//
// It lives in node.sh so that shellcheck reads it as the shell it is.
//
//go:embed node.sh
var nodeScript string

// runScript runs one operation of nodeScript and returns its stdout.
func runScript(ctx context.Context, r Runner, op string, args ...string) ([]byte, error) {
	argv := append([]string{"sh", "-c", nodeScript, "fleet-enginectl", op}, args...)
	var stdout, stderr bytes.Buffer
	err := r.Run(ctx, argv, nil, &stdout, &stderr)
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			return stdout.Bytes(), fmt.Errorf("%s on the node: %s: %w", op, msg, err)
		}
		return stdout.Bytes(), fmt.Errorf("%s on the node: %w", op, err)
	}
	return stdout.Bytes(), nil
}
