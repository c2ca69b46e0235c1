package nodes

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
)

func TestShellQuote(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"plain words stay bare", []string{"llama-server", "-m", "/models/q.gguf", "--port", "18000"}, "llama-server -m /models/q.gguf --port 18000"},
		{"empty argument", []string{"echo", ""}, "echo ''"},
		{"spaces", []string{"echo", "two words"}, "echo 'two words'"},
		{"single quote", []string{"echo", "it's"}, `echo 'it'\''s'`},
		{"only a quote", []string{"'"}, `''\'''`},
		{"double quotes", []string{`say "hi"`}, `'say "hi"'`},
		{"command substitution", []string{"$(rm -rf /)"}, "'$(rm -rf /)'"},
		{"backticks", []string{"`id`"}, "'`id`'"},
		{"variable", []string{"$HOME"}, "'$HOME'"},
		{"glob", []string{"*.gguf"}, "'*.gguf'"},
		{"question glob", []string{"a?b"}, "'a?b'"},
		{"brackets", []string{"[ab]"}, "'[ab]'"},
		{"newline", []string{"a\nb"}, "'a\nb'"},
		{"tab", []string{"a\tb"}, "'a\tb'"},
		{"semicolon and pipe", []string{"a; b | c && d"}, "'a; b | c && d'"},
		{"redirect", []string{">/etc/passwd"}, "'>/etc/passwd'"},
		{"tilde expands so it is quoted", []string{"~/.fleet"}, "'~/.fleet'"},
		{"leading equals is quoted", []string{"=x"}, "'=x'"},
		{"flag with equals stays bare", []string{"--host=127.0.0.1"}, "--host=127.0.0.1"},
		{"json", []string{`{"enable_thinking":false}`}, `'{"enable_thinking":false}'`},
		{"backslash", []string{`a\b`}, `'a\b'`},
		{"hash", []string{"#comment"}, "'#comment'"},
		{"no arguments", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ShellQuote(tt.argv); got != tt.want {
				t.Errorf("ShellQuote(%q) = %q, want %q", tt.argv, got, tt.want)
			}
		})
	}
}

// TestShellQuoteRoundTrip feeds the quoted line to a real POSIX shell and
// checks that every argument arrives byte for byte, which is the property the
// SSH transport depends on.
func TestShellQuoteRoundTrip(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on PATH: cannot round-trip through a real shell")
	}
	hostile := [][]string{
		{"", "a b", "it's", "'", "''", `"`, "$(echo pwned)", "`echo pwned`", "$HOME", "*", "?", "[a]", "~", "a\nb", "\t", "x;y", "a|b", "&", "<", ">", `\`, "#", "!", "{a,b}", "=x", "ünïcödé"},
	}
	for _, args := range hostile {
		line := "printf '%s\\0' " + ShellQuote(args)
		var out bytes.Buffer
		cmd := exec.CommandContext(context.Background(), sh, "-c", line)
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("sh -c %q: %v", line, err)
		}
		got := strings.Split(strings.TrimSuffix(out.String(), "\x00"), "\x00")
		if len(got) != len(args) {
			t.Fatalf("got %d arguments %q, want %d %q", len(got), got, len(args), args)
		}
		for i := range args {
			if got[i] != args[i] {
				t.Errorf("argument %d: got %q, want %q", i, got[i], args[i])
			}
		}
	}
}
