package fleet

import (
	"fmt"
	"unicode/utf8"
)

// Clip bounds s to about max bytes for storing or logging, cutting at a
// rune boundary and saying how much was left out, so text a user typed
// (an argument, a name in an error) cannot grow an audit row or a log line.
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d more bytes)", s[:cut], len(s)-cut)
}
