package sim

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"fleet"
)

// Llama-server reasoning formats.
const (
	ReasoningAuto           = "auto"
	ReasoningNone           = "none"
	ReasoningDeepSeek       = "deepseek"
	ReasoningDeepSeekLegacy = "deepseek-legacy"
)

// defaultTrainCtx is the context the simulated model was trained with
// (Qwen3-4B), what both engines fall back to when no context is given.
const defaultTrainCtx = 40960

// Options configure one simulated engine. ParseArgs fills them from a command
// line; tests may build them directly (Profile and Mimic are required).
type Options struct {
	Mimic   fleet.EngineKind
	Profile Profile
	// Seed makes the generated text deterministic (with the request content).
	Seed uint64
	// LoadTime is how long the model takes to load: llama-server answers 503
	// meanwhile, vLLM does not listen yet.
	LoadTime time.Duration
	// ColdStart is the extra time the first request after the load takes
	// (and every request that arrives while it warms the engine up), as on
	// real engines.
	ColdStart time.Duration

	Host string
	Port int
	// ServedNames are the model names served; the first is the one responses
	// carry (vLLM --served-model-name, llama-server --alias).
	ServedNames []string
	// ModelPath is the weights argument (-m, or vllm serve's positional).
	ModelPath string
	// Ctx is the context one request may use: llama-server's per-slot n_ctx,
	// vLLM's --max-model-len.
	Ctx int
	// TotalCtx is llama-server's -c (all slots together); equal to Ctx for vLLM.
	TotalCtx int
	// Slots is how many requests run at once; the rest queue FIFO.
	Slots     int
	KVUnified bool

	// llama-server behaviour.
	Jinja           bool
	ReasoningFormat string
	// MetricsEnabled is llama-server's --metrics; vLLM always serves /metrics.
	MetricsEnabled bool
	SlotsEndpoint  bool
	// CacheRAMMiB is --cache-ram: the host-RAM prompt cache's size (-1 no
	// limit, 0 off); nil is llama-server's default, 8192.
	CacheRAMMiB *int
	// SlotPromptSimilarity is --slot-prompt-similarity (0 turns the choice
	// by similarity off); nil is the default, 0.10.
	SlotPromptSimilarity *float64
	// NoCacheIdleSlots is --no-cache-idle-slots: idle slots are not saved
	// to the host cache (nor, with a unified KV cache, cleared) when
	// another slot starts a task.
	NoCacheIdleSlots bool

	// vLLM behaviour.
	ReasoningParser   string
	AutoToolChoice    bool
	ToolCallParser    string
	ForceIncludeUsage bool
	// PromptTokensDetails is --enable-prompt-tokens-details: usage then
	// carries prompt_tokens_details.cached_tokens.
	PromptTokensDetails bool
	// NoPrefixCaching is --no-enable-prefix-caching.
	NoPrefixCaching bool

	// ThinkingByDefault is false when the server was started with
	// chat template kwargs {"enable_thinking": false}.
	ThinkingByDefault bool

	// EngineArgs are the engine's own arguments as given.
	EngineArgs []string
	Logger     *slog.Logger
}

// ModelID is the name responses carry.
func (o Options) ModelID() string {
	if len(o.ServedNames) > 0 {
		return o.ServedNames[0]
	}
	return o.ModelPath
}

// simFlags are the sim's own flags, before "--".
type simFlags struct {
	fs                             *flag.FlagSet
	mimic, profile, loadTime, host *string
	coldStart, servedName          *string
	seed                           *uint64
	port, ctx, slots               *int
}

func newSimFlags() simFlags {
	fs := flag.NewFlagSet("fleet sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return simFlags{
		fs:         fs,
		mimic:      fs.String("mimic", "", "engine to mimic: vllm or llamacpp (default: the profile's)"),
		profile:    fs.String("profile", "", "speed and platform profile (required): "+strings.Join(ProfileNames(), ", ")),
		seed:       fs.Uint64("seed", 1, "seed of the generated text"),
		loadTime:   fs.String("load-time", "", "model load time, e.g. 2s (default: the profile's)"),
		coldStart:  fs.String("cold-start", "", "extra time the first request after the load takes, and any sent while it runs, as on a real engine, e.g. 2s (default: the profile's; 0s for none)"),
		host:       fs.String("host", "", "listen host (overrides the engine's --host)"),
		port:       fs.Int("port", -1, "listen port (overrides the engine's --port)"),
		servedName: fs.String("served-name", "", "model name served (overrides -a / --served-model-name)"),
		ctx:        fs.Int("ctx", 0, "context size (overrides -c / --max-model-len)"),
		slots:      fs.Int("slots", 0, "concurrent requests (overrides -np / --max-num-seqs)"),
	}
}

// usageHead and usageTail frame the flags in `fleet sim --help`.
const usageHead = `fleet sim runs a simulated vLLM or llama-server: a real HTTP server on loopback that answers
the engine's OpenAI-compatible API, /health, /metrics (and llama-server's /slots) as that engine
does, at the speed of a measured machine (its profile). The hub launches it for sim: nodes and
sim recipes; run it by hand to try a client against an engine without a GPU.

usage: fleet sim --profile NAME [--mimic vllm|llamacpp] [flags] [-- ENGINE ARGS...]

Flags:
`

const usageTail = `
ENGINE ARGS are the mimicked engine's own arguments (without its binary), read as it reads them:
  llama-server: -m/-hf MODEL, -a ALIAS, -c N, -np N, --host, --port, --jinja, --reasoning-format,
                --cache-ram, --slot-prompt-similarity, --metrics, --slots, --kv-unified, ...
  vLLM:         serve MODEL, --served-model-name, --max-model-len, --max-num-seqs, --host, --port,
                --enable-auto-tool-choice --tool-call-parser P, --reasoning-parser,
                --enable-prompt-tokens-details (usage then reports the cached tokens, as vLLM's does),
                --no-enable-prefix-caching, ...
Flags the engine would ignore are ignored. Example:
  fleet sim --profile m4max-llamacpp -- -m Qwen3-4B-Q4_K_M.gguf -a qwen3-4b -c 16384 --port 8081 --jinja
`

// PrintUsage writes `fleet sim --help` to w.
func PrintUsage(w io.Writer) {
	fmt.Fprint(w, usageHead)
	// Spelled with two dashes, as the rest of fleet's flags (the flag
	// package takes either).
	newSimFlags().fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s %s\n      %s", f.Name, kind, usage)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "-1" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
	fmt.Fprint(w, usageTail)
}

// ParseArgs parses `fleet sim` arguments: the sim's own flags, then after
// "--" the mimicked engine's own argv (without the binary), parsed the way
// that engine would. -h or --help before "--" gives an error that is
// flag.ErrHelp (Main then prints PrintUsage).
func ParseArgs(args []string) (Options, error) {
	f := newSimFlags()
	fs := f.fs
	mimic, profileName, seed, loadTime, coldStart, host, port := f.mimic, f.profile, f.seed, f.loadTime, f.coldStart, f.host, f.port
	servedName, ctxSize, slots := f.servedName, f.ctx, f.slots
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Options{}, err
		}
		return Options{}, fmt.Errorf("fleet sim: %w (put the engine's own arguments after \"--\"; fleet sim --help lists the flags)", err)
	}
	if *profileName == "" {
		return Options{}, fmt.Errorf("fleet sim: --profile is required: use one of %s", strings.Join(ProfileNames(), ", "))
	}
	prof, err := LookupProfile(*profileName)
	if err != nil {
		return Options{}, err
	}
	kind := prof.Mimic
	if *mimic != "" {
		kind = fleet.EngineKind(*mimic)
	}
	if kind != fleet.EngineVLLM && kind != fleet.EngineLlamaCpp {
		return Options{}, fmt.Errorf("fleet sim: --mimic %q is not supported: use vllm or llamacpp", kind)
	}
	opts := Options{Mimic: kind, Profile: prof, Seed: *seed, LoadTime: prof.LoadTime, ColdStart: prof.ColdStart, EngineArgs: fs.Args()}
	for _, d := range []struct {
		flag, value string
		into        *time.Duration
	}{{"--load-time", *loadTime, &opts.LoadTime}, {"--cold-start", *coldStart, &opts.ColdStart}} {
		if d.value == "" {
			continue
		}
		v, err := time.ParseDuration(d.value)
		if err != nil || v < 0 {
			return Options{}, fmt.Errorf("fleet sim: %s %q is not a duration: use e.g. 2s or 500ms", d.flag, d.value)
		}
		*d.into = v
	}
	var explicitSlots int
	if kind == fleet.EngineLlamaCpp {
		explicitSlots, err = parseLlamaArgs(fs.Args(), &opts)
	} else {
		explicitSlots, err = parseVLLMArgs(fs.Args(), &opts)
	}
	if err != nil {
		return Options{}, err
	}
	// The sim's own flags win over the engine's.
	if *host != "" {
		opts.Host = *host
	}
	if *port >= 0 {
		if *port > 65535 {
			return Options{}, fmt.Errorf("fleet sim: --port %d is out of range: use 0-65535", *port)
		}
		opts.Port = *port
	}
	if *servedName != "" {
		opts.ServedNames = []string{*servedName}
	}
	if *ctxSize < 0 || *slots < 0 {
		return Options{}, fmt.Errorf("fleet sim: --ctx and --slots must be positive")
	}
	if *ctxSize > 0 {
		opts.TotalCtx = *ctxSize
	}
	if *slots > 0 {
		explicitSlots = *slots
	}
	finishDerived(&opts, explicitSlots)
	return opts, nil
}

// finishDerived fills what follows from the parsed flags: defaults, the
// served name, and llama-server's per-slot context split.
func finishDerived(o *Options, explicitSlots int) {
	if o.Host == "" {
		// Both engines could bind every interface; a simulator never needs to.
		o.Host = "127.0.0.1"
	}
	if o.ModelPath == "" {
		switch {
		case len(o.ServedNames) > 0:
			o.ModelPath = o.ServedNames[0]
		case o.Mimic == fleet.EngineVLLM:
			o.ModelPath = "Qwen/Qwen3-4B"
		default:
			o.ModelPath = "Qwen3-4B-Q4_K_M.gguf"
		}
	}
	if len(o.ServedNames) == 0 {
		o.ServedNames = []string{o.ModelPath}
	}
	if o.TotalCtx <= 0 {
		o.TotalCtx = defaultTrainCtx
	}
	o.Slots = o.Profile.Slots
	if o.Slots <= 0 {
		o.Slots = 4
	}
	if explicitSlots > 0 {
		o.Slots = explicitSlots
	} else if o.Mimic == fleet.EngineLlamaCpp {
		// llama-server's -np defaults to auto: 4 slots (here the
		// profile's) with a unified KV cache, whatever -no-kvu said.
		o.KVUnified = true
	}
	o.Ctx = o.TotalCtx
	if o.Mimic == fleet.EngineLlamaCpp && explicitSlots > 0 && !o.KVUnified {
		// An explicit -np without --kv-unified splits -c across the slots,
		// exactly the pitfall the real server has.
		o.Ctx = o.TotalCtx / o.Slots
	}
}

// argScanner walks an engine argv: "--flag value", "--flag=value", bare
// flags, and positionals. An unknown flag followed by a token that is not a
// flag consumes it as its value, so any real recipe passes through.
type argScanner struct {
	args []string
	i    int
}

func isValueToken(s string) bool {
	if !strings.HasPrefix(s, "-") || s == "-" {
		return true
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// next returns the next flag name (without its value) or positional.
func (s *argScanner) next() (name, inline string, hasInline, ok bool) {
	if s.i >= len(s.args) {
		return "", "", false, false
	}
	tok := s.args[s.i]
	s.i++
	if strings.HasPrefix(tok, "-") && !isValueToken(tok) {
		if k, v, found := strings.Cut(tok, "="); found {
			return k, v, true, true
		}
	}
	return tok, "", false, true
}

// value takes the flag's value, inline or the next token.
func (s *argScanner) value(flagName, inline string, hasInline bool) (string, error) {
	if hasInline {
		return inline, nil
	}
	if s.i >= len(s.args) || !isValueToken(s.args[s.i]) {
		return "", fmt.Errorf("engine flag %s needs a value", flagName)
	}
	v := s.args[s.i]
	s.i++
	return v, nil
}

// skipUnknown consumes an unknown flag's value when one follows.
func (s *argScanner) skipUnknown(hasInline bool) {
	if !hasInline && s.i < len(s.args) && isValueToken(s.args[s.i]) {
		s.i++
	}
}

func positiveInt(flagName, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("engine flag %s: %q is not a positive integer", flagName, v)
	}
	return n, nil
}

func portNumber(flagName, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("engine flag %s: %q is not a port number (0-65535)", flagName, v)
	}
	return n, nil
}

// thinkingFromKwargs reads enable_thinking from a chat template kwargs JSON.
func thinkingFromKwargs(flagName, v string) (bool, error) {
	var kw map[string]any
	if err := json.Unmarshal([]byte(v), &kw); err != nil {
		return false, fmt.Errorf("engine flag %s: %q is not a JSON object: %w", flagName, v, err)
	}
	if b, ok := kw["enable_thinking"].(bool); ok {
		return b, nil
	}
	return true, nil
}

// engineArgs is what an engine's command line sets: the options, and the
// slot count when the command line names one.
type engineArgs struct {
	*Options
	explicitSlots int
}

// flagKind is how many values an engine flag takes.
type flagKind int

const (
	switchFlag flagKind = iota // none: --jinja
	valueFlag                  // one, inline or the next token: --port 8080, --port=8080
	listFlag                   // every following token that is not a flag (vLLM's nargs='+')
)

// engineFlag is one flag an engine mimic reads; set gets its name (as
// written, for errors) and its values, as many as its kind takes.
type engineFlag struct {
	kind flagKind
	set  func(a *engineArgs, name string, vals []string) error
}

// engineFlags is an engine's table of the flags it reads, by every name.
type engineFlags map[string]engineFlag

// flag adds f under each of names.
func (t engineFlags) flag(f engineFlag, names ...string) engineFlags {
	for _, n := range names {
		t[n] = f
	}
	return t
}

// value is a flag with one value.
func value(set func(a *engineArgs, name, v string) error) engineFlag {
	return engineFlag{valueFlag, func(a *engineArgs, name string, vals []string) error { return set(a, name, vals[0]) }}
}

// toggle is a flag without a value (a value given inline is ignored, as the
// engines' own parsers reject or ignore it).
func toggle(set func(a *engineArgs)) engineFlag {
	return engineFlag{switchFlag, func(a *engineArgs, _ string, _ []string) error { set(a); return nil }}
}

// scanEngineArgs is the one loop over an engine argv, for both mimics:
// known flags are set from table, an unknown flag skips its value when one
// follows, and a positional goes to positional (ignored when nil).
func scanEngineArgs(args []string, a *engineArgs, table engineFlags, positional func(a *engineArgs, tok string)) error {
	s := &argScanner{args: args}
	for {
		name, inline, hasInline, ok := s.next()
		if !ok {
			return nil
		}
		f, known := table[name]
		switch {
		case known:
			var vals []string
			switch f.kind {
			case valueFlag:
				v, err := s.value(name, inline, hasInline)
				if err != nil {
					return err
				}
				vals = []string{v}
			case listFlag:
				if hasInline {
					vals = append(vals, inline)
				}
				for s.i < len(s.args) && !strings.HasPrefix(s.args[s.i], "-") {
					vals = append(vals, s.args[s.i])
					s.i++
				}
			}
			if err := f.set(a, name, vals); err != nil {
				return err
			}
		case strings.HasPrefix(name, "-"):
			s.skipUnknown(hasInline)
		case positional != nil:
			positional(a, name)
		}
	}
}

// llamaFlags are the llama-server flags the mimic reads.
var llamaFlags = engineFlags{}.
	flag(value(func(a *engineArgs, _, v string) error { a.ModelPath = v; return nil }), "-m", "--model", "-hf", "--hf-repo").
	flag(value(func(a *engineArgs, _, v string) error {
		a.ServedNames = nil
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				a.ServedNames = append(a.ServedNames, n)
			}
		}
		return nil
	}), "-a", "--alias").
	flag(value(func(a *engineArgs, name, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("engine flag %s: %q is not a context size (0 = from the model)", name, v)
		}
		a.TotalCtx = n
		return nil
	}), "-c", "--ctx-size").
	flag(value(setHost), "--host").
	flag(value(setPort), "--port").
	flag(value(func(a *engineArgs, name, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			return fmt.Errorf("engine flag %s: %q is not a slot count (-1 = auto)", name, v)
		}
		if n > 0 {
			a.explicitSlots = n
		} else {
			// Auto: the profile's slots, with a unified KV cache.
			a.explicitSlots, a.KVUnified = 0, true
		}
		return nil
	}), "-np", "--parallel").
	flag(toggle(func(a *engineArgs) { a.KVUnified = true }), "-kvu", "--kv-unified").
	flag(toggle(func(a *engineArgs) { a.KVUnified = false }), "-no-kvu", "--no-kv-unified").
	flag(toggle(func(a *engineArgs) { a.Jinja = true }), "--jinja").
	flag(toggle(func(a *engineArgs) { a.Jinja = false }), "--no-jinja").
	flag(value(func(a *engineArgs, _, v string) error {
		switch v {
		case ReasoningAuto, ReasoningNone, ReasoningDeepSeek, ReasoningDeepSeekLegacy:
			a.ReasoningFormat = v
			return nil
		}
		return fmt.Errorf("engine flag --reasoning-format: %q is not one of none, deepseek, deepseek-legacy, auto", v)
	}), "--reasoning-format").
	flag(value(setThinking), "--chat-template-kwargs").
	flag(value(func(a *engineArgs, name, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 {
			return fmt.Errorf("engine flag %s: %q is not a size in MiB (-1 = no limit, 0 = off)", name, v)
		}
		a.CacheRAMMiB = &n
		return nil
	}), "-cram", "--cache-ram").
	flag(value(func(a *engineArgs, name, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return fmt.Errorf("engine flag %s: %q is not a fraction between 0 and 1", name, v)
		}
		a.SlotPromptSimilarity = &f
		return nil
	}), "-sps", "--slot-prompt-similarity").
	flag(toggle(func(a *engineArgs) { a.NoCacheIdleSlots = false }), "--cache-idle-slots").
	flag(toggle(func(a *engineArgs) { a.NoCacheIdleSlots = true }), "--no-cache-idle-slots").
	flag(toggle(func(a *engineArgs) { a.MetricsEnabled = true }), "--metrics").
	flag(toggle(func(a *engineArgs) { a.SlotsEndpoint = true }), "--slots").
	flag(toggle(func(a *engineArgs) { a.SlotsEndpoint = false }), "--no-slots")

func setHost(a *engineArgs, _, v string) error { a.Host = v; return nil }

func setPort(a *engineArgs, name, v string) (err error) {
	a.Port, err = portNumber(name, v)
	return err
}

func setThinking(a *engineArgs, name, v string) (err error) {
	a.ThinkingByDefault, err = thinkingFromKwargs(name, v)
	return err
}

func parseLlamaArgs(args []string, o *Options) (explicitSlots int, err error) {
	o.Port = 8080
	o.Jinja = true
	o.ReasoningFormat = ReasoningAuto
	o.SlotsEndpoint = true
	o.ThinkingByDefault = true
	a := &engineArgs{Options: o}
	if err := scanEngineArgs(args, a, llamaFlags, nil); err != nil {
		return 0, err
	}
	return a.explicitSlots, nil
}

// parseModelLen reads vLLM's --max-model-len, which also takes 16k (×1000)
// and 16K (×1024).
func parseModelLen(v string) (int, error) {
	mult := 1
	num := v
	switch {
	case strings.HasSuffix(v, "k"):
		mult, num = 1000, strings.TrimSuffix(v, "k")
	case strings.HasSuffix(v, "K"):
		mult, num = 1024, strings.TrimSuffix(v, "K")
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("engine flag --max-model-len: %q is not a length (e.g. 16384 or 16K)", v)
	}
	return n * mult, nil
}

// vllmFlags are the vLLM flags the mimic reads.
var vllmFlags = engineFlags{}.
	flag(value(func(a *engineArgs, _, v string) error { a.ModelPath = v; return nil }), "--model").
	flag(engineFlag{listFlag, func(a *engineArgs, _ string, names []string) error {
		if len(names) == 0 {
			return fmt.Errorf("engine flag --served-model-name needs at least one name")
		}
		a.ServedNames = names
		return nil
	}}, "--served-model-name").
	flag(value(func(a *engineArgs, _, v string) (err error) {
		a.TotalCtx, err = parseModelLen(v)
		return err
	}), "--max-model-len").
	flag(value(setHost), "--host").
	flag(value(setPort), "--port").
	flag(value(func(a *engineArgs, name, v string) (err error) {
		a.explicitSlots, err = positiveInt(name, v)
		return err
	}), "--max-num-seqs").
	flag(value(func(a *engineArgs, _, v string) error { a.ReasoningParser = v; return nil }), "--reasoning-parser").
	flag(toggle(func(a *engineArgs) { a.AutoToolChoice = true }), "--enable-auto-tool-choice").
	flag(value(func(a *engineArgs, _, v string) error { a.ToolCallParser = v; return nil }), "--tool-call-parser").
	flag(toggle(func(a *engineArgs) { a.ForceIncludeUsage = true }), "--enable-force-include-usage").
	flag(toggle(func(a *engineArgs) { a.PromptTokensDetails = true }), "--enable-prompt-tokens-details").
	flag(toggle(func(a *engineArgs) { a.NoPrefixCaching = false }), "--enable-prefix-caching").
	flag(toggle(func(a *engineArgs) { a.NoPrefixCaching = true }), "--no-enable-prefix-caching").
	flag(value(setThinking), "--default-chat-template-kwargs")

func parseVLLMArgs(args []string, o *Options) (explicitSlots int, err error) {
	o.Port = 8000
	o.ThinkingByDefault = true
	o.MetricsEnabled = true
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	a := &engineArgs{Options: o}
	// The model may come as vLLM's positional (vllm serve MODEL).
	positional := func(a *engineArgs, tok string) {
		if a.ModelPath == "" {
			a.ModelPath = tok
		}
	}
	if err := scanEngineArgs(args, a, vllmFlags, positional); err != nil {
		return 0, err
	}
	if o.AutoToolChoice && o.ToolCallParser == "" {
		return 0, fmt.Errorf("engine flag --enable-auto-tool-choice needs --tool-call-parser (e.g. hermes)")
	}
	return a.explicitSlots, nil
}
