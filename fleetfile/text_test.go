package fleetfile

import (
	"strings"
	"testing"
)

// escapeFleet is a one-model fleet file with line 8 (the recipe's model),
// line 9 (args) and line 11 (an env value) to be filled in.
const escapeFleet = `nodes:
  - {name: ultra, address: sim:m1ultra-llamacpp}
models:
  - id: %ID%
    context: 4096
    recipes:
      llamacpp:
        model: %MODEL%
        args: [%ARG%]
        env:
          HF_TOKEN: %ENV%
        install: %INSTALL%
placements:
  - {model: m, node: ultra}
`

func escapeFile(id, model, arg, env, install string) []byte {
	r := strings.NewReplacer("%ID%", id, "%MODEL%", model, "%ARG%", arg, "%ENV%", env, "%INSTALL%", install)
	return []byte(r.Replace(escapeFleet))
}

// YAML's escapes put control characters in a value that the file's bytes do
// not hold (the raw-byte check sees "\e", not ESC): a model name, an arg or
// an env value carrying an OSC retitled the terminal of everyone listing
// the models. Each is refused with its line; a newline or a tab only
// install: may hold.
func TestEscapesInStringsRefused(t *testing.T) {
	ok := func(id, model, arg, env, install string) []byte { return escapeFile(id, model, arg, env, install) }
	tests := []struct {
		name string
		file []byte
		want string // "" for accepted
	}{
		{"clean", ok("m", "q.gguf", "--jinja", "hf_x", `"pip install x"`), ""},
		{"install over lines", ok("m", "q.gguf", "--jinja", "hf_x", "|\n          set -e\n          \tpip install x\n"), ""},
		{"OSC title in the model", ok("m", `"q\e]0;pwned\a.gguf"`, "--jinja", "hf_x", `x`), "esc.yaml:8: model m: recipe llamacpp: model holds a control character"},
		{"OSC 52 in an arg", ok("m", "q.gguf", `"\x1b]52;c;ZWNobyBwd25lZA==\a"`, "hf_x", `x`), "esc.yaml:9: model m: recipe llamacpp: each item of args holds a control character"},
		{"NUL in an env value", ok("m", "q.gguf", "--jinja", `"hf\0x"`, `x`), "esc.yaml:11: model m: recipe llamacpp: env HF_TOKEN holds a control character, which a terminal would act on (U+0000 at byte 2"},
		{"CSI (C1) in an env value", ok("m", "q.gguf", "--jinja", `"hf\u009b31m"`, `x`), "esc.yaml:11: model m: recipe llamacpp: env HF_TOKEN holds a control character, which a terminal would act on (U+009B at byte 2"},
		{"bidi override in the id", ok(`"m\u202e"`, "q.gguf", "--jinja", "hf_x", `x`), "esc.yaml:4: model 1: id holds a control character"},
		{"newline in an arg", ok("m", "q.gguf", `"--a\n--b"`, "hf_x", `x`), "esc.yaml:9: model m: recipe llamacpp: each item of args holds a line break or tab, which only install: may hold"},
		{"tab in an env value", ok("m", "q.gguf", "--jinja", `"a\tb"`, `x`), "esc.yaml:11: model m: recipe llamacpp: env HF_TOKEN holds a line break or tab"},
		{"ESC in install", ok("m", "q.gguf", "--jinja", "hf_x", `"echo \e[2J"`), "esc.yaml:12: model m: recipe llamacpp: install holds a control character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("esc.yaml", tt.file)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Parse refused a clean file: %v\n%s", err, tt.file)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Parse = %v\nwant an error containing %q\n%s", err, tt.want, tt.file)
			case err != nil && strings.ContainsAny(err.Error(), "\x1b\x00\a\u009b\u202e"):
				t.Errorf("the error itself carries the control character: %q", err)
			}
		})
	}
}
