package nodes

import "strings"

// ShellQuote renders argv as one POSIX shell command line. It is the only
// place a command for a remote node is turned into text: every argument is
// either left bare (when it holds nothing a shell treats specially) or wrapped
// in single quotes, inside which a POSIX shell interprets nothing at all, so
// data can never become syntax. A single quote inside an argument closes the
// quoted run, adds an escaped quote and reopens it: ' → '\”.
//
// The remote login shell must be POSIX (sh, bash, dash, zsh, ksh); csh-family
// shells treat newlines and '!' inside single quotes differently.
func ShellQuote(argv []string) string {
	var b strings.Builder
	for i, arg := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quoteArg(arg))
	}
	return b.String()
}

func quoteArg(arg string) string {
	if arg == "" {
		return "''"
	}
	if isShellSafe(arg) {
		return arg
	}
	return "'" + strings.ReplaceAll(arg, "'", `'\''`) + "'"
}

// isShellSafe reports whether arg is made only of characters no POSIX shell
// gives a meaning to in any position, so it reads the same bare as quoted.
// '=' is excluded from the first byte so a bare word is never mistaken for an
// assignment, and '~' is excluded everywhere because it expands.
func isShellSafe(arg string) bool {
	for i := 0; i < len(arg); i++ {
		c := arg[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == '/' || c == ':' || c == ',' || c == '+' || c == '@' || c == '%':
		case c == '=' && i > 0:
		default:
			return false
		}
	}
	return true
}
