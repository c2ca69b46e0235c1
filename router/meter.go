package router

import (
	"bytes"
	"time"

	"fleet/internal/tokenchunk"
)

func isEventStream(ct string) bool {
	return len(ct) >= 17 && equalFold(ct[:17], "text/event-stream")
}

// meter watches a response go by: SSE data events and their times, and the
// usage's completion_tokens, without holding the body.
type meter struct {
	sse bool
	// firstRead is when the first bytes of the answer came.
	firstRead time.Time
	// line holds the start of an SSE line cut by the end of a read.
	line      []byte
	overflow  bool
	events    int
	firstData time.Time
	lastData  time.Time
	// firstToken is when the first data event carrying a token (content,
	// reasoning, a tool call, completion text) arrived.
	firstToken time.Time
	// event is the SSE event name of the event being read (Anthropic's and
	// the Responses API's streams give one).
	event []byte
	// seq is the last sequence_number of a Responses stream's events, -1
	// before any: an error event the router adds comes next in order.
	seq   int
	usage int
	// cache is what the usage and timings chunks said of the prompt.
	cache promptCache
	// tail keeps the end of a non-streamed body, where usage sits; read
	// says tailCache and tailTokens hold what it says (readTail).
	tail       []byte
	read       bool
	tailCache  promptCache
	tailTokens int
}

const maxMeterLine = 16 << 10

func newMeter(sse bool) *meter {
	return &meter{sse: sse, usage: -1, seq: -1, cache: unknownPromptCache()}
}

var (
	dataPrefix = []byte("data:")
	// responsesEventPrefix starts the names of a Responses stream's events.
	responsesEventPrefix = []byte("response.")
	sequenceField        = []byte(`"sequence_number":`)
	donePayload          = []byte("[DONE]")
	completionField      = []byte(`"completion_tokens":`)
	timingsField         = []byte(`"timings":`)
)

// feed meters one read. Whole lines are looked at where they lie in p; only
// a line cut by the end of the read is kept, until its newline comes.
func (m *meter) feed(p []byte, now time.Time) {
	if m.firstRead.IsZero() {
		m.firstRead = now
	}
	if !m.sse {
		m.read = false
		const keep = 2048
		if len(p) >= keep {
			m.tail = append(m.tail[:0], p[len(p)-keep:]...)
			return
		}
		m.tail = append(m.tail, p...)
		if len(m.tail) > keep {
			m.tail = append(m.tail[:0], m.tail[len(m.tail)-keep:]...)
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			m.carry(p)
			return
		}
		line := p[:i]
		if len(m.line) > 0 || m.overflow {
			m.carry(line)
			line = m.line
		}
		if len(line) > maxMeterLine {
			// Cut as a carried line is, so that where reads fall does
			// not change what is seen.
			line, m.overflow = line[:maxMeterLine], true
		}
		m.endLine(line, m.overflow, now)
		m.line = m.line[:0]
		m.overflow = false
		p = p[i+1:]
	}
}

// carry keeps the start of a line that continues in the next read: its
// first maxMeterLine bytes (data lines of usage chunks are a few hundred
// bytes; a longer one is a token, and its start says so).
func (m *meter) carry(p []byte) {
	if m.overflow {
		return
	}
	if room := maxMeterLine - len(m.line); len(p) > room {
		p, m.overflow = p[:room], true
	}
	m.line = append(m.line, p...)
}

var emptyChoices = []byte(`"choices":[]`)

// endLine meters one SSE line; cut says only its start is there, enough to
// count a data event but not to read it.
func (m *meter) endLine(line []byte, cut bool, now time.Time) {
	line = bytes.TrimRight(line, "\r")
	payload, ok := bytes.CutPrefix(line, dataPrefix)
	if !ok {
		if name, ok := bytes.CutPrefix(line, eventPrefix); ok {
			m.event = append(m.event[:0], bytes.TrimSpace(name)...)
		} else if len(line) == 0 {
			m.event = m.event[:0] // the event ended
		}
		return
	}
	payload = bytes.TrimSpace(payload)
	if bytes.HasPrefix(m.event, responsesEventPrefix) {
		m.seq = max(intField(payload, sequenceField), m.seq+1)
	}
	if cut {
		m.events++
		if m.firstData.IsZero() {
			m.firstData = now
		}
		// A first chunk too long to keep whole (a big tool call or text
		// at once) is still the first token.
		if m.firstToken.IsZero() && tokenchunk.CarriesStart(m.event, payload) {
			m.firstToken = now
		}
		m.lastData = now
		return
	}
	if bytes.Equal(payload, donePayload) {
		return
	}
	usage, timings, noChoices, apiUsage := meterKeys(payload)
	if usage {
		if n := usageTokens(payload); n >= 0 {
			m.usage = n
			m.cache.scan(payload)
		} else if timings {
			m.cache.scan(payload)
		}
	} else if timings {
		m.cache.scan(payload)
	}
	if apiUsage {
		if n := apiUsageTokens(payload); n >= 0 {
			m.usage = n
		}
		m.cache.scanAPIUsage(payload)
	}
	// The usage-only chunk carries no token; every other data event
	// carries at least one.
	if noChoices {
		return
	}
	m.events++
	if m.firstData.IsZero() {
		m.firstData = now
	}
	if m.firstToken.IsZero() && tokenchunk.Carries(payload) {
		m.firstToken = now
	}
	m.lastData = now
}

// meterKeys reports which of the keys the meter reads a data payload
// holds (apiUsage: Anthropic's and the Responses API's usage, endpoints.go).
// Most events are a token and hold none, so each key is looked for by a
// tail that starts with a byte rare in JSON events ('_', 'g', '['):
// bytes.Index then hops between the few places that byte sits with a
// vectorised IndexByte, where a loop over every byte (or a search for the
// key's quote, every few bytes) costs a step per byte of every event.
func meterKeys(p []byte) (usage, timings, noChoices, apiUsage bool) {
	usage, apiUsage = tokensKeys(p)
	return usage, hasKey(p, timingsField, len(`"timin`)), hasKey(p, emptyChoices, len(`"choices":`)), apiUsage
}

// tokensKeys reports whether p holds chat's usage key (completion_tokens)
// and Anthropic's and the Responses API's (output_tokens), in one search
// for the tail they share: "kens" is rarer in events than '_'.
func tokensKeys(p []byte) (usage, apiUsage bool) {
	const cut = len(`"completion_to`)
	tail := completionField[cut:]
	for off := 0; ; {
		i := bytes.Index(p[off:], tail)
		if i < 0 {
			return usage, apiUsage
		}
		i += off
		usage = usage || bytes.HasSuffix(p[:i], completionField[:cut])
		apiUsage = apiUsage || bytes.HasSuffix(p[:i], outputTokensField[:len(`"output_to`)])
		off = i + 1
	}
}

// hasKey reports whether p holds key, looking for key[cut:] and checking
// the start of key before each place it is found.
func hasKey(p, key []byte, cut int) bool { return nextKey(p, key, cut, 0) >= 0 }

// nextKey is where key starts in p at from or after, or -1: it looks for
// key[cut:] with bytes.Index, which hops between the places the tail's
// first byte sits, and checks key[:cut] before each place it is found.
func nextKey(p, key []byte, cut, from int) int {
	tail := key[cut:]
	for off := from + cut; off <= len(p); {
		i := bytes.Index(p[off:], tail)
		if i < 0 {
			return -1
		}
		i += off
		if bytes.Equal(p[i-cut:i], key[:cut]) {
			return i - cut
		}
		off = i + 1
	}
	return -1
}

// usageTokens finds "completion_tokens":N in p, or -1.
func usageTokens(p []byte) int { return intField(p, completionField) }

func (m *meter) outputTokens() int {
	if !m.sse {
		m.readTail()
		return m.tailTokens
	}
	if m.usage >= 0 {
		return m.usage
	}
	return m.events
}

// readTail reads the usage and timings at the end of a non-streamed answer
// once, however often the request's end asks for them: the search of each
// field costs a pass over the tail's 2 KiB.
func (m *meter) readTail() {
	if m.read {
		return
	}
	m.read = true
	c := unknownPromptCache()
	c.scan(m.tail)
	if bytes.Contains(m.tail, outputTokensField) {
		c.scanAPIUsage(m.tail)
	}
	m.tailCache = c
	m.tailTokens = usageTokens(m.tail)
	if m.tailTokens < 0 {
		m.tailTokens = max(apiUsageTokens(m.tail), 0)
	}
}

// lastIndex is bytes.LastIndex(p, sep) by forward searches: bytes.Index
// is vectorised, LastIndex hashes every byte (Rabin-Karp), which made the
// few searches of an answer's tail a tenth of the router's time on small
// requests. The searches are for sep from its first '_' on, where it has
// one, and the start is checked where that is found: a field's name
// starts with a quote, JSON's commonest byte, where each search would
// stop.
func lastIndex(p, sep []byte) int {
	cut := max(bytes.IndexByte(sep, '_'), 0)
	last := -1
	for i := nextKey(p, sep, cut, 0); i >= 0; i = nextKey(p, sep, cut, i+1) {
		last = i
	}
	return last
}
