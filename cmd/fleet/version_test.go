package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestVersion: `fleet version` and `fleet --version` print what goreleaser's
// ldflags set (-X main.version=… -X main.commit=… -X main.date=…).
func TestVersion(t *testing.T) {
	old := [3]string{version, commit, date}
	t.Cleanup(func() { version, commit, date = old[0], old[1], old[2] })
	version, commit, date = "1.4.0", "5bcc150", "2026-11-30T17:00:00Z"
	want := "fleet 1.4.0 (commit 5bcc150, built 2026-11-30T17:00:00Z)\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		if code != 0 || out.String() != want {
			t.Errorf("fleet %s: exit %d, %q (stderr %q); want %q", args[0], code, out.String(), errb.String(), want)
		}
	}
}
