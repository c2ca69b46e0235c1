package sim

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// pieceKind says what part of an answer one generated token belongs to.
type pieceKind int

const (
	// pieceThinkTag is a <think> delimiter token: it shows only when thoughts
	// stay inline in content.
	pieceThinkTag pieceKind = iota
	pieceReasoning
	pieceContent
	// pieceToolArgs is a fragment of a structured tool call's arguments.
	pieceToolArgs
)

// piece is one generated token.
type piece struct {
	kind pieceKind
	text string
}

// toolCall is the call a request with tools gets.
type toolCall struct {
	id        string
	name      string
	arguments string
}

// plan is everything a request will generate, decided before the first
// token so that timing never changes the text.
type plan struct {
	pieces []piece
	finish string // "stop", "length" or "tool_calls"
	tool   *toolCall
	// structuredTool: the call goes out as tool_calls, not as prose.
	structuredTool bool
}

var vocabulary = strings.Fields(`the a model answer system request worker token engine memory speed cluster
node queue slot batch context prompt stream response server client router fleet time value result data
simple clear small large fast steady careful useful common shared local remote first second next last
each every other same different better good new old high low long short open quick light heavy
is are was will can should could would may might does has have gives takes makes keeps holds runs
serves reads writes sends finds needs uses shows means helps starts stops moves grows waits works
and or but so because when while if then also still only just even more most less very quite
in on at for with from by about into over under after before between through across within
this that these those it they we you one two three several many few some any all both
question idea way part place case point fact example reason number problem method step process`)

func seedHash(seed uint64, parts ...string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(seed >> (8 * i))
	}
	h.Write(b[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// wordStream produces sentences of vocabulary words, deterministically.
type wordStream struct {
	rng      *rand.Rand
	sentence int // words left in the current sentence
	started  bool
}

func (w *wordStream) token() string {
	word := vocabulary[w.rng.IntN(len(vocabulary))]
	if w.sentence == 0 {
		w.sentence = 6 + w.rng.IntN(10)
		word = strings.ToUpper(word[:1]) + word[1:]
	}
	w.sentence--
	if w.sentence == 0 {
		word += "."
	}
	if !w.started {
		w.started = true
		return word
	}
	return " " + word
}

// splitTokens cuts text into word tokens, each carrying its leading space.
func splitTokens(text string) []string {
	var toks []string
	start := 0
	for i := 1; i <= len(text); i++ {
		if i == len(text) || (text[i] == ' ' && text[i-1] != ' ') {
			toks = append(toks, text[start:i])
			start = i
		}
	}
	return toks
}

// chunkString cuts s into pieces of about n bytes (a token of JSON is a few
// characters).
func chunkString(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

var multiplyRE = regexp.MustCompile(`(-?\d+)\s*(?:multiplied by|times|\*|×|x)\s*(-?\d+)`)

// arithmetic recognises "What is A multiplied by B?" so the demo's canonical
// prompt gets a right answer.
func arithmetic(prompt string) (thought, answer string, ok bool) {
	m := multiplyRE.FindStringSubmatch(prompt)
	if m == nil {
		return "", "", false
	}
	a, errA := strconv.ParseInt(m[1], 10, 64)
	b, errB := strconv.ParseInt(m[2], 10, 64)
	if errA != nil || errB != nil || a > 1e9 || b > 1e9 || a < -1e9 || b < -1e9 {
		return "", "", false
	}
	p := a * b
	thought = fmt.Sprintf("Okay, so I need to figure out what %d multiplied by %d is.", a, b)
	if tens, ones := b-b%10, b%10; b > 10 && ones != 0 {
		thought += fmt.Sprintf(" Let me break it down: %d times %d is %d, and %d times %d is %d. Adding them gives %d + %d = %d.",
			a, tens, a*tens, a, ones, a*ones, a*tens, a*ones, p)
	} else {
		thought += fmt.Sprintf(" That is %d.", p)
	}
	thought += " So the answer is " + strconv.FormatInt(p, 10) + "."
	answer = fmt.Sprintf("%d multiplied by %d is **%d**.", a, b, p)
	return thought, answer, true
}

// planInput is what shapes a request's output.
type planInput struct {
	seed       uint64
	content    string // every message's text, for the seed
	lastUser   string
	thinking   bool
	maxTokens  int // 0: natural length
	tools      []toolSpec
	toolChoice string // "", "auto", "required", "none", or a function name
	structured bool
	toolIDFmt  func(rng *rand.Rand) string
}

type toolSpec struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

func makeChatPlan(in planInput) plan {
	rng := rand.New(rand.NewPCG(seedHash(in.seed, in.content), in.seed))
	words := &wordStream{rng: rng}
	var pl plan
	thought, answer, isMath := arithmetic(in.lastUser)
	if in.thinking {
		pl.pieces = append(pl.pieces, piece{pieceThinkTag, "<think>"}, piece{pieceThinkTag, "\n"})
		if isMath {
			for _, t := range splitTokens(thought) {
				pl.pieces = append(pl.pieces, piece{pieceReasoning, t})
			}
		} else {
			for _, t := range splitTokens("Okay, let me think about what the user is asking.") {
				pl.pieces = append(pl.pieces, piece{pieceReasoning, t})
			}
			rs := &wordStream{rng: rng, started: true}
			for range 12 + rng.IntN(30) {
				pl.pieces = append(pl.pieces, piece{pieceReasoning, rs.token()})
			}
		}
		pl.pieces = append(pl.pieces, piece{pieceThinkTag, "\n"}, piece{pieceThinkTag, "</think>"}, piece{pieceThinkTag, "\n\n"})
	}

	if call := chooseTool(in, rng); call != nil {
		pl.tool = call
		pl.structuredTool = in.structured
		if in.structured {
			for _, frag := range chunkString(call.arguments, 4) {
				pl.pieces = append(pl.pieces, piece{pieceToolArgs, frag})
			}
			pl.finish = "tool_calls"
		} else {
			prose := marshal(obj{{"name", call.name}, {"arguments", json.RawMessage(call.arguments)}})
			pl.pieces = append(pl.pieces, piece{pieceContent, "<tool_call>"}, piece{pieceContent, "\n"})
			for _, frag := range chunkString(string(prose), 4) {
				pl.pieces = append(pl.pieces, piece{pieceContent, frag})
			}
			pl.pieces = append(pl.pieces, piece{pieceContent, "\n"}, piece{pieceContent, "</tool_call>"})
			pl.finish = "stop"
		}
		// A tool call ends where the call ends; max_tokens can only cut it.
		if in.maxTokens > 0 && len(pl.pieces) > in.maxTokens {
			pl.pieces = pl.pieces[:in.maxTokens]
			pl.finish = "length"
		}
		return pl
	}

	if isMath {
		for _, t := range splitTokens(answer) {
			pl.pieces = append(pl.pieces, piece{pieceContent, t})
		}
	} else {
		for range 30 + rng.IntN(91) {
			pl.pieces = append(pl.pieces, piece{pieceContent, words.token()})
		}
	}
	pl.finish = "stop"
	if in.maxTokens > 0 {
		words.started = len(pl.pieces) > 0
		for len(pl.pieces) < in.maxTokens {
			pl.pieces = append(pl.pieces, piece{pieceContent, words.token()})
		}
		pl.pieces = pl.pieces[:in.maxTokens]
		pl.finish = "length"
	}
	return pl
}

// makeTextPlan is the output of a plain completion: the prompt continued.
func makeTextPlan(seed uint64, prompt string, maxTokens int) plan {
	rng := rand.New(rand.NewPCG(seedHash(seed, prompt), seed))
	words := &wordStream{rng: rng, started: true}
	n := maxTokens
	finish := "length"
	if n <= 0 {
		n, finish = 30+rng.IntN(91), "stop"
	}
	pl := plan{finish: finish}
	for range n {
		pl.pieces = append(pl.pieces, piece{pieceContent, words.token()})
	}
	return pl
}

func chooseTool(in planInput, rng *rand.Rand) *toolCall {
	if len(in.tools) == 0 || in.toolChoice == "none" {
		return nil
	}
	spec := in.tools[0]
	if in.toolChoice != "" && in.toolChoice != "auto" && in.toolChoice != "required" {
		for _, t := range in.tools {
			if t.Function.Name == in.toolChoice {
				spec = t
			}
		}
	}
	args := toolArguments(spec.Function.Parameters, rng)
	return &toolCall{id: in.toolIDFmt(rng), name: spec.Function.Name, arguments: args}
}

// toolArguments makes plausible arguments for a JSON schema: every required
// property (or every property when none is required), keys sorted.
func toolArguments(schema json.RawMessage, rng *rand.Rand) string {
	var s struct {
		Properties map[string]struct {
			Type string `json:"type"`
			Enum []any  `json:"enum"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	_ = json.Unmarshal(schema, &s) // a schema we cannot read gets empty arguments
	keys := s.Required
	if len(keys) == 0 {
		for k := range s.Properties {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	args := obj{}
	for _, k := range keys {
		p := s.Properties[k]
		var v any
		switch {
		case len(p.Enum) > 0:
			v = p.Enum[0]
		case p.Type == "integer" || p.Type == "number":
			v = 1 + rng.IntN(100)
		case p.Type == "boolean":
			v = true
		case p.Type == "array":
			v = []any{}
		case p.Type == "object":
			v = obj{}
		case strings.Contains(k, "location") || strings.Contains(k, "city"):
			v = "Paris"
		default:
			v = vocabulary[rng.IntN(len(vocabulary))]
		}
		args = append(args, field{k, v})
	}
	return string(marshal(args))
}

// promptTokens estimates tokens as characters/4, at least 1.
func promptTokens(text string) int {
	n := (len(text) + 3) / 4
	if n < 1 {
		n = 1
	}
	return n
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randomAlnum(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = idAlphabet[rng.IntN(len(idAlphabet))]
	}
	return string(b)
}

func randomHex(rng *rand.Rand, n int) string {
	const hex = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = hex[rng.IntN(16)]
	}
	return string(b)
}
