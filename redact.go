package fleet

import (
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Redacted stands in for a secret a reader may not see.
const Redacted = "<redacted>"

// One rule says what a secret is, and every place a non-admin reads applies
// it (RedactSnapshot, RedactModels, RedactEvents, RedactText, RedactArgv):
//
//   - every recipe env value: which of them are tokens the name cannot tell;
//   - the value of a secret flag (IsSecretFlag), in every spelling an
//     engine's parser takes: vLLM's argparse reads "_" as "-" and takes any
//     unambiguous prefix ("--api_key", "--api-k=…"), and its --api-key takes
//     a list ("--api-key k1 k2"); llama-server takes the next word whatever
//     it is;
//   - the value of an environment variable set in a command line or script
//     (after an `env` word, or NAME=VALUE with an upper-case NAME, as in
//     `export HF_TOKEN=…` or `HF_TOKEN=… hf download`);
//   - a URL's user info and query (signed download URLs, index tokens);
//   - a bearer token ("Authorization: Bearer …");
//   - a secret's value where a program names it as a setting, in any case
//     and with "-", "_" or nothing between the words: api_key=…, API-Key: …,
//     apiKey=…, and settings logged as a dict or JSON (vLLM's
//     "non-default args: {'api_key': ['…']}").
//
// Only admins, who can apply a fleet file and so set all of these, see them;
// everyone else sees the names with Redacted, which apply refuses as a value.

// secretLongFlags are the long flags whose value is a secret, with the
// shortest prefix of each that vLLM's argparse (allow_abbrev, its default)
// still reads as that flag: --api-key (vLLM, llama-server), --hf-token
// (vLLM, llama-server) and --token (`hf download`, `huggingface-cli login`
// in install scripts). "--api" is not one: vLLM also has --api-server-count.
var secretLongFlags = []struct {
	name     string
	shortest int
}{
	{"api-key", len("api-k")},
	{"hf-token", len("hf-t")},
	{"token", len("token")},
}

// secretShortFlags are single-dash secret flags: llama-server's -hft.
var secretShortFlags = []string{"-hft"}

// isSecretFlagName reports whether a flag as written ("--api_key",
// "--API-K", "-hft") names a secret flag.
func isSecretFlagName(name string) bool {
	if slices.Contains(secretShortFlags, name) {
		return true
	}
	long, ok := strings.CutPrefix(name, "--")
	if !ok || long == "" {
		return false
	}
	// Lower case too: no engine reads --API-KEY, but hiding one costs nothing.
	long = strings.ToLower(strings.ReplaceAll(long, "_", "-"))
	for _, f := range secretLongFlags {
		if len(long) >= f.shortest && strings.HasPrefix(f.name, long) {
			return true
		}
	}
	return false
}

// IsSecretFlag reports whether arg is a flag whose value is a secret, given
// as "--flag" (value in the next words) or "--flag=value"; flag is the flag
// as written.
func IsSecretFlag(arg string) (flag string, inline bool) {
	name, _, inline := strings.Cut(arg, "=")
	if isSecretFlagName(name) {
		return name, inline
	}
	return "", false
}

// envAssignment is NAME=VALUE of an environment variable in a command line
// or script; the upper-case name keeps `pip install vllm==0.9` and
// `--lora-modules name=path` out of it.
var envAssignment = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// unquote strips one pair of quotes around a word of text.
func unquote(w string) string {
	if len(w) >= 2 && (w[0] == '\'' || w[0] == '"') && w[len(w)-1] == w[0] {
		return w[1 : len(w)-1]
	}
	return w
}

// isShellOperator reports whether a word ends a command in a script.
func isShellOperator(w string) bool {
	switch w {
	case ";", "&&", "||", "|", "&":
		return true
	}
	return false
}

// redactWords applies the rule to the words of a command line (argv, or
// the words of a line of text, quotes kept): it returns the words with
// secrets replaced. newLine[i], when given, says word i starts a new line
// of a script, where a flag's list of values ends.
func redactWords(words []string, newLine []bool) []string {
	out := slices.Clone(words)
	inEnv := false
	for i := 0; i < len(out); i++ {
		w := unquote(out[i])
		if f, inline := IsSecretFlag(w); f != "" {
			inEnv = false
			if inline {
				out[i] = f + "=" + Redacted
				continue
			}
			if i+1 == len(out) || (newLine != nil && newLine[i+1]) {
				continue // a flag without a value: nothing to hide
			}
			// The next word whatever it is (llama-server takes it so), then
			// what argparse takes into a list: words up to the next flag.
			i++
			out[i] = Redacted
			for i+1 < len(out) && !strings.HasPrefix(unquote(out[i+1]), "-") && !isShellOperator(out[i+1]) &&
				(newLine == nil || !newLine[i+1]) {
				i++
				out[i] = Redacted
			}
			continue
		}
		switch m := envAssignment.FindStringSubmatchIndex(w); {
		case newLine == nil && strings.ContainsAny(w, " \t\n"):
			// An argv word that is a script (sh -c '…'): its own words.
			out[i] = RedactText(out[i])
			inEnv = false
		case w == "env":
			inEnv = true
		case inEnv && strings.Contains(w, "=") && !strings.HasPrefix(w, "-"):
			name, _, _ := strings.Cut(w, "=")
			out[i] = name + "=" + Redacted
		case m != nil:
			out[i] = w[:m[1]] + Redacted
			inEnv = false
		default:
			inEnv = false
		}
	}
	for i, w := range out {
		out[i] = redactInline(w)
	}
	return out
}

var (
	// urlCredentials is a URL's user:password@ and its query, where downloads
	// and package indexes carry their tokens and signatures.
	urlCredentials = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#@]+@)?([^\s?#]*)(\?[^\s#]*)?`)
	// bearerToken is an HTTP bearer credential, as a curl -H or a log shows it.
	bearerToken = regexp.MustCompile(`(?i)(\bbearer\s+)([^\s'",;]+)`)
	// secretSetting is a secret named as a setting rather than a flag, in
	// every spelling a program logs it: api_key=k, API-KEY: k, apiKey=k,
	// openai_api_key=k, a Python dict or JSON ('api_key': ['k'],
	// "hf_token": "t"). The names are secretLongFlags', "-" read as "_" or
	// nothing, in any case.
	secretSetting = regexp.MustCompile(`(?i)((?:^|[^A-Za-z0-9_.-])['"]?(?:` +
		secretSettingNames() + `)['"]?\s*[:=]\s*)(\[[^\]]*\]|'[^']*'|"[^"]*"|[^\s,}&'"]+)`)
)

// secretSettingNames is the alternation of the secret flags' names for
// secretSetting, each "-" matching "-", "_" or nothing. A name of two words
// may have more before it (openai_api_key); "token" alone may not, or
// n_token and max_token would be secrets.
func secretSettingNames() string {
	names := make([]string, len(secretLongFlags))
	for i, f := range secretLongFlags {
		names[i] = strings.ReplaceAll(f.name, "-", "[-_]?")
		if strings.Contains(f.name, "-") {
			names[i] = "(?:[a-z0-9]+[-_])*" + names[i]
		}
	}
	return strings.Join(names, "|")
}

// redactInline applies the parts of the rule that a single stretch of text
// shows whole: URLs, bearer tokens and secret settings.
func redactInline(s string) string {
	if strings.Contains(s, "://") {
		s = urlCredentials.ReplaceAllStringFunc(s, func(u string) string {
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
	s = bearerToken.ReplaceAllString(s, "${1}"+Redacted)
	return secretSetting.ReplaceAllString(s, "${1}"+Redacted)
}

// RedactArgv returns argv for a log line or a non-admin's worker table with
// its secrets replaced by Redacted (the rule above).
func RedactArgv(argv []string) []string {
	if argv == nil {
		return nil
	}
	return redactWords(argv, nil)
}

// RedactText returns text an engine, an installer, a node or the hub wrote
// (an event, an install script, an error) with its secrets replaced by
// Redacted, by the same rule as RedactArgv: the text is read as words,
// split at blanks, a quoted stretch being one word. The rest of the text,
// a URL's host and path included, stays as it was.
func RedactText(s string) string {
	type span struct{ start, end int }
	var (
		spans   []span
		words   []string
		newLine []bool
	)
	sawBreak := true
	for i := 0; i < len(s); {
		if c := s[i]; c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			sawBreak = sawBreak || c == '\n'
			i++
			continue
		}
		start := i
		for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
			// A quote opening a word or a value ("--api-key='a b'") runs to
			// its closing quote on the same line; one without (an
			// apostrophe in prose) is just a character.
			if q := s[i]; (q == '\'' || q == '"') && (i == start || s[i-1] == '=') {
				if end := strings.IndexByte(s[i+1:], q); end >= 0 && !strings.Contains(s[i+1:i+1+end], "\n") {
					i += end + 2
					continue
				}
			}
			i++
		}
		spans = append(spans, span{start, i})
		words = append(words, s[start:i])
		newLine = append(newLine, sawBreak)
		sawBreak = false
	}
	red := redactWords(words, newLine)
	var b strings.Builder
	last := 0
	for i, sp := range spans {
		if red[i] == words[i] {
			continue
		}
		b.WriteString(s[last:sp.start])
		b.WriteString(red[i])
		last = sp.end
	}
	if last == 0 {
		return redactInline(s) // a quoted stretch may hide a URL across blanks
	}
	b.WriteString(s[last:])
	return redactInline(b.String())
}

// RedactModels returns models as a non-admin may see them: every recipe
// env value, and the secrets in its args, weights, bin and install script,
// replaced by Redacted. The input is not modified.
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
				r.Args = RedactArgv(r.Args)
			}
			r.Model, r.Bin, r.Install = RedactText(r.Model), RedactText(r.Bin), RedactText(r.Install)
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

// RedactSnapshot returns the snapshot as a non-admin may see it: the models
// (RedactModels), each worker's command lines and reason, each node's
// reason, the events and the audit trail's targets and outcomes, with
// secrets replaced by Redacted. The input is not modified.
func RedactSnapshot(s Snapshot) Snapshot {
	s.Models = RedactModels(s.Models)
	s.Events = RedactEvents(s.Events)
	if s.Workers != nil {
		ws := make([]WorkerView, len(s.Workers))
		for i, w := range s.Workers {
			w.Argv, w.LaunchArgv = RedactArgv(w.Argv), RedactArgv(w.LaunchArgv)
			w.Reason = RedactText(w.Reason)
			ws[i] = w
		}
		s.Workers = ws
	}
	if s.Nodes != nil {
		ns := make([]Node, len(s.Nodes))
		for i, n := range s.Nodes {
			n.Reason = RedactText(n.Reason)
			ns[i] = n
		}
		s.Nodes = ns
	}
	s.Audit = RedactAudit(s.Audit)
	return s
}

// RedactAudit returns audit entries with their targets and outcomes (an
// error may quote an install script's URL) passed through RedactText; the
// input is not modified.
func RedactAudit(es []AuditEntry) []AuditEntry {
	if es == nil {
		return nil
	}
	out := make([]AuditEntry, len(es))
	for i, a := range es {
		a.Target, a.Outcome = RedactText(a.Target), RedactText(a.Outcome)
		out[i] = a
	}
	return out
}
