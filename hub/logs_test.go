package hub

import (
	"bytes"
	"strings"
	"testing"
)

// An engine's log reaches `fleet logs` a line at a time, sanitised for
// everyone and redacted for all but admins (vLLM logs its settings, the API
// key among them, when it starts), however its bytes were cut on the way.
func TestLogLinesSanitisedAndRedacted(t *testing.T) {
	log := "INFO non-default args: {'api_key': ['sk-logged-k3y']}\n\x1b]0;pwned\aready é\nlast line --api_key sk-2"
	for _, admin := range []bool{false, true} {
		var out bytes.Buffer
		lw := &logLines{w: &out, admin: admin}
		// Cut inside the escape and inside the é, as reads of a pipe may.
		for _, chunk := range []string{log[:60], log[60:68], log[68:]} {
			if _, err := lw.Write([]byte(chunk)); err != nil {
				t.Fatal(err)
			}
		}
		if err := lw.flush(); err != nil {
			t.Fatal(err)
		}
		got := out.String()
		if strings.ContainsAny(got, "\x1b\a\uFFFD") || !strings.Contains(got, `\x1b]0;pwned\x07ready é`+"\n") {
			t.Errorf("admin %v: log %q; want the escape written out and the é whole", admin, got)
		}
		if shows := strings.Contains(got, "sk-logged-k3y") || strings.Contains(got, "sk-2"); shows != admin {
			t.Errorf("admin %v: log shows the keys: %v\n%s", admin, shows, got)
		}
		if !strings.HasSuffix(got, "--api_key sk-2") && !strings.HasSuffix(got, "--api_key <redacted>") {
			t.Errorf("admin %v: the last line without a newline was lost: %q", admin, got)
		}
	}
}
