package fleet

import (
	"strings"
	"testing"
)

func TestSanitize(t *testing.T) {
	tests := []struct{ in, want string }{
		{"ready on port 18000", "ready on port 18000"},
		{"bench:\nc\ttok/s\n1\t42.5", "bench:\nc\ttok/s\n1\t42.5"}, // multi-line events stay
		{"install: \x1b]0;pwned\a done", `install: \x1b]0;pwned\x07 done`},
		{"\x1b]52;c;ZWNobw==\x1b\\", `\x1b]52;c;ZWNobw==\x1b\`},
		{"a\x00b\rc\x7f", `a\x00b\x0dc\x7f`},
		{"csi \u009b31m red", `csi \u009b31m red`},
		{"name\u202etxt.exe", `name\u202etxt.exe`},
		{"bad \xff utf-8", "bad \uFFFD utf-8"},
		{"é ✓ 日本", "é ✓ 日本"},
	}
	for _, tt := range tests {
		got := Sanitize(tt.in)
		if got != tt.want {
			t.Errorf("Sanitize(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if Sanitize(got) != got {
			t.Errorf("Sanitize is not idempotent on %q", got)
		}
		for _, r := range got {
			if UnsafeRune(r) {
				t.Errorf("Sanitize(%q) = %q still holds %U", tt.in, got, r)
			}
		}
	}
	if s := strings.Repeat("x", 100); Sanitize(s) != s {
		t.Error("clean text changed")
	}
}
