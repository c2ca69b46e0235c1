package router

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net/http"
)

// The engines' Anthropic streams do not always have the structure the
// official SDKs require, and a strict client (Claude Code, Rust clients)
// rejects the whole stream and asks again, forever:
//
//   - llama-server (llama.cpp de3ff81) sends message_start only with the
//     result of the first token, and leaves it out when that token is a
//     partial UTF-8 sequence (an answer opening with an emoji or CJK);
//   - vLLM (issue #45367) serialises message_start with exclude_unset,
//     dropping the message's "type" and "role";
//   - llama-server (PR #22960) starts a tool_use block without "input": {};
//   - llama-server (issue #20090) starts a thinking block without
//     "signature".
//
// anthropicRepairTransport mends these on /v1/messages streams as they go
// by. It decides on the first event (a message_start is made up before it
// when it is not one) and looks inside only message_start and
// content_block_start events; every other event, and every event already
// right, passes byte for byte, and nothing is held back.

// messagesPath is the Anthropic Messages endpoint whose streams are repaired.
const messagesPath = "/v1/messages"

// anthropicRepairTransport repairs the structure of Anthropic streams.
type anthropicRepairTransport struct {
	next http.RoundTripper
	// model is the name the client asked for, for a made-up message_start.
	model string
}

func (t *anthropicRepairTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || req.URL.Path != messagesPath || !rewritable(resp) ||
		!isEventStream(resp.Header.Get("Content-Type")) {
		return resp, err
	}
	streamThrough(resp, &sseAnthropicRepair{model: t.model})
	return resp, nil
}

// sseAnthropicRepair is the line-by-line repair of one Anthropic stream.
type sseAnthropicRepair struct {
	sseLines
	model string
	// decided is set once the first event has been seen: a message_start
	// is only ever made up before it.
	decided bool
	// named is the event: name of the event under way, so that the data of
	// the many events that need no repair is not parsed at all.
	named    []byte
	hasNamed bool
}

func (s *sseAnthropicRepair) feed(p []byte) []byte { return s.sseLines.feed(p, s) }
func (s *sseAnthropicRepair) finish() []byte       { return s.sseLines.finish(s, false) }

var (
	eventPrefix          = []byte("event:")
	evMessageStart       = []byte("message_start")
	evContentBlockStart  = []byte("content_block_start")
	evError              = []byte("error")
	evPing               = []byte("ping")
	missingInput         = []byte(`"input":{}`)
	missingSignature     = []byte(`"signature":""`)
	missingMessageFields = []struct{ key, field string }{
		{"type", `"type":"message"`},
		{"role", `"role":"assistant"`},
		{"content", `"content":[]`},
		{"usage", `"usage":{"input_tokens":0,"output_tokens":0}`},
	}
)

func (s *sseAnthropicRepair) emitLine(line []byte) {
	text := bytes.TrimRight(line, "\r\n")
	if len(text) == 0 {
		s.hasNamed = false
		s.out = append(s.out, line...)
		return
	}
	if text[0] == ':' {
		s.out = append(s.out, line...)
		return
	}
	if name, ok := bytes.CutPrefix(text, eventPrefix); ok {
		name = bytes.TrimSpace(name)
		s.named, s.hasNamed = append(s.named[:0], name...), true
		if !s.decided {
			s.startIfMissing(name)
		}
		s.out = append(s.out, line...)
		return
	}
	payload, ok := bytes.CutPrefix(text, dataPrefix)
	if !ok {
		s.out = append(s.out, line...)
		return
	}
	if s.decided && s.hasNamed && !bytes.Equal(s.named, evMessageStart) && !bytes.Equal(s.named, evContentBlockStart) {
		s.out = append(s.out, line...)
		return
	}
	payload = bytes.TrimPrefix(payload, []byte(" "))
	typ := eventType(payload)
	if !s.decided {
		// A stream without event: lines names its events in the data.
		s.startIfMissing(typ)
	}
	switch {
	case bytes.Equal(typ, evMessageStart):
		s.emitData(line, payload, repairMessageStart(payload))
	case bytes.Equal(typ, evContentBlockStart):
		s.emitData(line, payload, repairBlockStart(payload))
	default:
		s.out = append(s.out, line...)
	}
}

// emitData sends the data line with fixed in place of payload, or the line
// as it came when nothing needed fixing.
func (s *sseAnthropicRepair) emitData(line, payload, fixed []byte) {
	if fixed == nil {
		s.out = append(s.out, line...)
		return
	}
	// payload ends the line's text: what precedes it is the data prefix.
	i := len(bytes.TrimRight(line, "\r\n")) - len(payload)
	s.out = append(s.out, line[:i]...)
	s.out = append(s.out, fixed...)
	s.out = append(s.out, line[i+len(payload):]...)
}

// startIfMissing sends a message_start of its own when the stream's first
// event, named first, is something else. An error event is left alone: the
// client must see the engine's error, not a message that never comes. A
// ping decides nothing: the message_start may follow it.
func (s *sseAnthropicRepair) startIfMissing(first []byte) {
	if bytes.Equal(first, evPing) {
		return
	}
	s.decided = true
	if bytes.Equal(first, evMessageStart) || bytes.Equal(first, evError) {
		return
	}
	var id [12]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	s.out = append(s.out, `event: message_start`+"\n"+`data: {"type":"message_start","message":{"id":"msg_`...)
	s.out = hex.AppendEncode(s.out, id[:])
	s.out = append(s.out, `","type":"message","role":"assistant","model":`...)
	s.out = append(s.out, quoteJSON(s.model)...)
	s.out = append(s.out, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`+"\n\n"...)
}

// eventType is the top-level "type" string of an event's data, unquoted,
// or nil.
func eventType(payload []byte) []byte {
	vs, ve, ok := topLevelValue(payload, "type")
	if !ok || ve-vs < 2 || payload[vs] != '"' {
		return nil
	}
	return payload[vs+1 : ve-1]
}

// repairMessageStart fills the members of message_start's message the SDKs
// read (vLLM #45367 drops type and role), or returns nil when none is
// missing.
func repairMessageStart(payload []byte) []byte {
	vs, ve, ok := topLevelValue(payload, "message")
	if !ok || payload[vs] != '{' {
		return nil
	}
	msg := payload[vs:ve]
	var add [][]byte
	for _, m := range missingMessageFields {
		if _, _, has := topLevelValue(msg, m.key); !has {
			add = append(add, []byte(m.field))
		}
	}
	if add == nil {
		return nil
	}
	return insertMembers(payload, vs, add)
}

// repairBlockStart adds "input": {} to a tool_use block and "signature" to
// a thinking block that lack them, or returns nil when the block is right.
func repairBlockStart(payload []byte) []byte {
	vs, ve, ok := topLevelValue(payload, "content_block")
	if !ok || payload[vs] != '{' {
		return nil
	}
	block := payload[vs:ve]
	var key string
	var field []byte
	switch string(eventType(block)) {
	case "tool_use":
		key, field = "input", missingInput
	case "thinking":
		key, field = "signature", missingSignature
	default:
		return nil
	}
	if _, _, has := topLevelValue(block, key); has {
		return nil
	}
	return insertMembers(payload, vs, [][]byte{field})
}

// insertMembers returns a copy of payload with members added at the start
// of the object that opens at payload[at].
func insertMembers(payload []byte, at int, members [][]byte) []byte {
	out := make([]byte, 0, len(payload)+64)
	out = append(out, payload[:at+1]...)
	for i, m := range members {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, m...)
	}
	if j := skipSpace(payload, at+1); j < len(payload) && payload[j] != '}' {
		out = append(out, ',')
	}
	return append(out, payload[at+1:]...)
}
