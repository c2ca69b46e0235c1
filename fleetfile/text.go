package fleetfile

import (
	"github.com/goccy/go-yaml/ast"

	"fleet"
)

// multiLineFields are the fleet file's strings that may hold several lines
// (and tabs): an install: script. Every other string is one line.
var multiLineFields = []string{"install"}

// checkText refuses a string holding a character a terminal acts on: YAML's
// escapes ("\e]0;…\a", "\x1b]52;…", "\0", "\u202e") put in a value what the
// raw-byte check of checkNesting cannot see, and a model's name, args or env
// reach every viewer's table. A newline or a tab is refused too, except in
// multiLineFields.
func (d *decoder) checkText(n ast.Node, where, field, s string) bool {
	multi := false
	for _, f := range multiLineFields {
		multi = multi || field == f
	}
	for i, r := range s {
		bad := fleet.UnsafeRune(r) || (!multi && (r == '\n' || r == '\t'))
		if !bad {
			continue
		}
		what := "a line break or tab, which only install: may hold"
		if fleet.UnsafeRune(r) {
			what = "a control character, which a terminal would act on"
		}
		// The value is not quoted: an env value is a secret.
		d.errorf(n, where, "%s holds %s (%U at byte %d of the value); remove it", field, what, r, i)
		return false
	}
	return true
}
