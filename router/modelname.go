package router

import (
	"bytes"
	"encoding/json"
	"strings"
)

// One model name everywhere: a client may name a model by its ID or any
// alias, but each engine answers only to the name it serves (vLLM refuses
// any other with 404), and answers with that name. The router therefore
// sends each engine its served name and hands the client back the name it
// asked for, in every non-streamed body and every streamed chunk, whichever
// worker answered. When the two names are equal nothing is rewritten and the
// bytes pass through untouched.

// modelField finds the top-level "model" member of the JSON object p and
// returns the byte range of its string value, quotes included. Only the top
// level is searched: a "model" key nested in a message or a tool argument is
// the client's data, not the routing name. With the key repeated, the last
// one counts, as it does for Go's decoder (which routed the request) and
// Python's (which the engine runs).
func modelField(p []byte) (start, end int, ok bool) {
	start, end, ok = topLevelValue(p, "model")
	return start, end, ok && p[start] == '"'
}

// topLevelValue finds the top-level member key of the JSON object p and
// returns its value's byte range; the last one counts when the key repeats.
func topLevelValue(p []byte, key string) (start, end int, ok bool) {
	i := skipSpace(p, 0)
	if i >= len(p) || p[i] != '{' {
		return 0, 0, false
	}
	i++
	for {
		i = skipSpace(p, i)
		if i >= len(p) || p[i] != '"' {
			return start, end, ok
		}
		keyEnd := skipString(p, i)
		if keyEnd < 0 {
			return 0, 0, false
		}
		k := p[i:keyEnd]
		i = skipSpace(p, keyEnd)
		if i >= len(p) || p[i] != ':' {
			return 0, 0, false
		}
		i = skipSpace(p, i+1)
		valEnd := skipValue(p, i)
		if valEnd < 0 {
			return 0, 0, false
		}
		// k is the key as written, quotes included; comparing inside them
		// costs no allocation, which matters per streamed event.
		if len(k) == len(key)+2 && string(k[1:len(k)-1]) == key {
			start, end, ok = i, valEnd, true
		}
		i = skipSpace(p, valEnd)
		if i < len(p) && p[i] == ',' {
			i++
		}
	}
}

func skipSpace(p []byte, i int) int {
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the JSON string starting at p[i] ('"'),
// or -1 when it does not end.
func skipString(p []byte, i int) int {
	for j := i + 1; j < len(p); j++ {
		switch p[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the index after the JSON value starting at p[i], or -1.
func skipValue(p []byte, i int) int {
	if i >= len(p) {
		return -1
	}
	switch p[i] {
	case '"':
		return skipString(p, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(p); j++ {
			switch p[j] {
			case '"':
				e := skipString(p, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(p) && strings.IndexByte(",}] \t\r\n", p[j]) < 0 {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// quoteJSON is name as a JSON string.
func quoteJSON(name string) []byte {
	q, _ := json.Marshal(name) // a string always marshals
	return q
}

// withModel returns p with its top-level "model" string set to quoted (a
// JSON string), or p itself when it has none or already carries it. p is
// never modified.
func withModel(p, quoted []byte) []byte { return withField(p, quoted, modelField) }

// withField returns p with the JSON value that find locates replaced by
// quoted, or p itself when find locates none or it already is quoted.
func withField(p, quoted []byte, find func([]byte) (start, end int, ok bool)) []byte {
	start, end, ok := find(p)
	if !ok || bytes.Equal(p[start:end], quoted) {
		return p
	}
	out := make([]byte, 0, len(p)-(end-start)+len(quoted))
	out = append(out, p[:start]...)
	out = append(out, quoted...)
	return append(out, p[end:]...)
}

// sseModelRewriter sets the top-level "model" of every data event of an SSE
// stream to one name as the stream goes by. Like sseNormaliser it handles
// each line the moment its newline arrives and holds only an unfinished
// last line.
type sseModelRewriter struct {
	sseLines
	quoted []byte
}

func newSSEModelRewriter(name string) *sseModelRewriter {
	return &sseModelRewriter{quoted: quoteJSON(name)}
}

// feed takes one read and returns the bytes to send now, valid until the
// next call.
func (s *sseModelRewriter) feed(p []byte) []byte { return s.sseLines.feed(p, s) }

// finish returns a last line that never got its newline, rewritten.
func (s *sseModelRewriter) finish() []byte { return s.sseLines.finish(s, false) }

func (s *sseModelRewriter) emitLine(line []byte) {
	rest, ok := bytes.CutPrefix(line, dataPrefix)
	if !ok {
		s.out = append(s.out, line...)
		return
	}
	start, end, found := answerModelField(rest)
	if !found || bytes.Equal(rest[start:end], s.quoted) {
		s.out = append(s.out, line...)
		return
	}
	s.out = append(s.out, line[:len(dataPrefix)+start]...)
	s.out = append(s.out, s.quoted...)
	s.out = append(s.out, rest[end:]...)
}

// servedName is the name to send the engine.
func (b Backend) servedName() string {
	if b.ServedName != "" {
		return b.ServedName
	}
	return b.Model
}
