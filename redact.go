package fleet

import (
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Redacted stands in for a secret a reader may not see.
const Redacted = "<redacted>"

// Recipe env: values are secrets (an HF_TOKEN, an API key): which of them
// are is not knowable from the name, so all of them are. Only admins, who
// can apply a fleet file and so set them, see them; everyone else sees the
// names with Redacted as the value, and events and logs never carry them.
// The same holds for the values of the engine flags that take a secret
// (secretFlags), in recipe args and in a worker's command line.

// secretFlags are the engine flags whose value is a secret: vLLM's and
// llama-server's --api-key, llama-server's Hugging Face token.
var secretFlags = []string{"--api-key", "--hf-token", "-hft"}

// IsSecretFlag reports whether arg is a flag whose value is a secret,
// given as "--flag" (value in the next word) or "--flag=value".
func IsSecretFlag(arg string) (flag string, inline bool) {
	for _, f := range secretFlags {
		if arg == f {
			return f, false
		}
		if strings.HasPrefix(arg, f+"=") {
			return f, true
		}
	}
	return "", false
}

// redactSecretArgs replaces the values of secret flags in args (a copy).
func redactSecretArgs(args []string) []string {
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		switch f, inline := IsSecretFlag(out[i]); {
		case f == "":
		case inline:
			out[i] = f + "=" + Redacted
		case i+1 < len(out):
			out[i+1] = Redacted
			i++
		}
	}
	return out
}

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
			if len(r.Args) > 0 {
				r.Args = redactSecretArgs(r.Args)
			}
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

// RedactArgv returns argv for a log line or a non-admin's worker table,
// with the values of the NAME=VALUE words an `env` word puts before a
// command, and those of secret flags, replaced by Redacted.
func RedactArgv(argv []string) []string {
	if argv == nil {
		return nil
	}
	out := redactSecretArgs(argv)
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

// secretFlagText is a secret flag and its value in a line of text (a launch
// event's command line, an installer's output), the value quoted or not.
var secretFlagText = regexp.MustCompile(`(^|\s)(` + strings.Join(func() []string {
	q := make([]string, len(secretFlags))
	for i, f := range secretFlags {
		q[i] = regexp.QuoteMeta(f)
	}
	return q
}(), "|") + `)(=|\s+)('[^']*'|"[^"]*"|\S+)`)

// urlCredentials is a URL's user:password@ and its query, where downloads
// and package indexes carry their tokens and signatures.
var urlCredentials = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#@]+@)?([^\s?#]*)(\?[^\s#]*)?`)

// RedactText returns a line an engine, an installer or the hub wrote with
// the credentials it may carry replaced by Redacted: secret flag values,
// and URLs' user info and query strings (signed download URLs, index
// tokens). The rest of the line, the URL's host and path included, stays.
func RedactText(s string) string {
	s = secretFlagText.ReplaceAllString(s, "$1$2$3"+Redacted)
	return urlCredentials.ReplaceAllStringFunc(s, func(u string) string {
		m := urlCredentials.FindStringSubmatch(u)
		out := m[1]
		if m[2] != "" {
			out += Redacted + "@"
		}
		out += m[3]
		if m[4] != "" {
			out += "?" + Redacted
		}
		return out
	})
}

// RedactEvents returns events with their messages passed through
// RedactText; the input is not modified.
func RedactEvents(evs []Event) []Event {
	if evs == nil {
		return nil
	}
	out := make([]Event, len(evs))
	for i, e := range evs {
		e.Message = RedactText(e.Message)
		out[i] = e
	}
	return out
}

// RedactSnapshot returns the snapshot as a non-admin may see it: recipe env
// values and secret flag values replaced by Redacted, in the models and in
// each worker's command line, and credentials in the events' messages. The
// input is not modified.
func RedactSnapshot(s Snapshot) Snapshot {
	s.Models = RedactModels(s.Models)
	s.Events = RedactEvents(s.Events)
	if s.Workers != nil {
		ws := make([]WorkerView, len(s.Workers))
		for i, w := range s.Workers {
			w.Argv, w.LaunchArgv = RedactArgv(w.Argv), RedactArgv(w.LaunchArgv)
			ws[i] = w
		}
		s.Workers = ws
	}
	return s
}
