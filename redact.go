package fleet

import (
	"maps"
	"strings"
)

// Redacted stands in for a secret a reader may not see.
const Redacted = "<redacted>"

// Recipe env: values are secrets (an HF_TOKEN, an API key): which of them
// are is not knowable from the name, so all of them are. Only admins, who
// can apply a fleet file and so set them, see them; everyone else sees the
// names with Redacted as the value, and events and logs never carry them.

// RedactModels returns models with every recipe env value replaced by
// Redacted; the input is not modified.
func RedactModels(models []Model) []Model {
	out := make([]Model, len(models))
	for i, m := range models {
		out[i] = m
		if len(m.Recipes) == 0 {
			continue
		}
		out[i].Recipes = make(map[EngineKind]Recipe, len(m.Recipes))
		for k, r := range m.Recipes {
			if len(r.Env) > 0 {
				r.Env = maps.Clone(r.Env)
				for name := range r.Env {
					r.Env[name] = Redacted
				}
			}
			out[i].Recipes[k] = r
		}
	}
	return out
}

// RedactArgv returns argv for a log line, with the values of the NAME=VALUE
// words an `env` word puts before a command replaced by Redacted.
func RedactArgv(argv []string) []string {
	out := make([]string, len(argv))
	copy(out, argv)
	inEnv := false
	for i, a := range out {
		switch {
		case a == "env":
			inEnv = true
		case inEnv && strings.Contains(a, "="):
			name, _, _ := strings.Cut(a, "=")
			out[i] = name + "=" + Redacted
		default:
			inEnv = false
		}
	}
	return out
}
