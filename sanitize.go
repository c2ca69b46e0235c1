package fleet

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Sanitize returns text that came from outside the hub (a node's install
// output, an engine's log line or version, a node's error or probe answer,
// something a user typed) fit for a terminal: control characters, which a
// terminal obeys (ESC starts the sequences that retitle a window, write the
// clipboard with OSC 52 or move the cursor; CR overwrites a line), and the
// bidirectional overrides that reorder what is shown, are written out as
// escapes ("\x1b", "\u202e") so that a reader sees them without their effect;
// bytes that are not UTF-8 become U+FFFD. Newlines and tabs stay: events may
// be several lines (a bench table), and neither moves anything a line shows.
// The hub passes every text from nodes and engines through it where it
// enters the hub, so no terminal and no JSON reader downstream gets it raw.
func Sanitize(s string) string {
	if clean(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x80 && UnsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case UnsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// UnsafeRune reports whether a terminal would act on r instead of showing
// it: a control character (C0 but newline and tab, DEL, C1) or a
// bidirectional embedding, override or isolate.
func UnsafeRune(r rune) bool {
	if r == '\n' || r == '\t' {
		return false
	}
	return unicode.IsControl(r) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

// clean reports whether s needs no sanitising, without allocating.
func clean(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || UnsafeRune(r) {
			return false
		}
		i += n
	}
	return true
}

// SanitizeLines sanitises each of lines in place and returns them.
func SanitizeLines(lines []string) []string {
	for i, l := range lines {
		lines[i] = Sanitize(l)
	}
	return lines
}
