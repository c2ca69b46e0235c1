package router

import (
	"bytes"
	"io"
	"net/http"

	"fleet/router/reasoning"
)

// chatPath is the only endpoint whose answers carry reasoning.
const chatPath = "/v1/chat/completions"

// maxRewriteBody bounds the non-streamed answer the router holds to rewrite.
// A chat completion is a few KiB to a few MiB; anything larger passes
// through untouched rather than growing the hub's memory without bound.
const maxRewriteBody = 32 << 20

// maxSSELine bounds one SSE line held while waiting for its newline. A line
// longer than this (no engine sends one) ends normalisation for the rest of
// the stream, which then passes through as the engine sent it.
const maxSSELine = 1 << 20

// rewritable reports whether a response can be normalised: a success the
// router can read as plain text. Errors are passed on as the engine wrote
// them, and a compressed body (an engine that compresses despite the router
// asking it not to) is not the router's to decode.
func rewritable(resp *http.Response) bool {
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return false
	}
	enc := resp.Header.Get("Content-Encoding")
	return enc == "" || equalFold(enc, "identity")
}

// readForRewrite reads a non-streamed answer whole, up to maxRewriteBody+1
// bytes, so the caller can tell an answer over the limit from one at it.
func readForRewrite(body io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(io.LimitReader(body, maxRewriteBody+1))
	return buf.Bytes(), err
}

// sseNormaliser rewrites an SSE stream as it goes by. Each complete line is
// handled the moment its newline arrives: data lines go through the
// StreamRewriter, every other line (blank separators, comments, event:,
// id:) passes unchanged. Only the unfinished last line of a read is held,
// so every event leaves in the same flush as the read that completed it.
type sseNormaliser struct {
	sseLines
	rw *reasoning.StreamRewriter
	// swallowed is set when the rewriter dropped a data line whole (it held
	// only part of a tag): the blank line that ended that event must go too,
	// or the client would see an empty event.
	swallowed bool
}

func newSSENormaliser(mode reasoning.Mode) *sseNormaliser {
	return &sseNormaliser{rw: reasoning.NewStreamRewriter(mode)}
}

// feed takes one read of the upstream stream and returns the bytes to send
// the client now. The result is valid until the next call.
func (s *sseNormaliser) feed(p []byte) []byte { return s.sseLines.feed(p, s) }

// finish returns what is left when the upstream ends: a last line that
// never got its newline, rewritten like any other.
func (s *sseNormaliser) finish() []byte { return s.sseLines.finish(s, true) }

// sseLines cuts a stream into whole lines across reads, for the rewriters
// that change an SSE stream a line at a time (model name, reasoning).
type sseLines struct {
	// line is the start of a line whose newline has not arrived yet.
	line []byte
	// out is reused for each read's output; emitLine appends to it.
	out []byte
	// gaveUp is set after a line outgrew maxSSELine: the rest of the stream
	// passes through untouched.
	gaveUp bool
}

// lineEmitter rewrites one whole line into its sseLines' out.
type lineEmitter interface{ emitLine(line []byte) }

// feed takes one read and returns the bytes to send now, valid until the
// next call.
func (s *sseLines) feed(p []byte, e lineEmitter) []byte {
	if s.gaveUp {
		return p
	}
	s.out = s.out[:0]
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(s.line)+len(p) > maxSSELine {
				// No engine sends such a line: pass the rest through.
				s.gaveUp = true
				s.out = append(s.out, s.line...)
				s.out = append(s.out, p...)
				s.line = s.line[:0]
				return s.out
			}
			s.line = append(s.line, p...)
			break
		}
		line := p[:i+1]
		if len(s.line) > 0 {
			s.line = append(s.line, line...)
			line = s.line
		}
		e.emitLine(line)
		s.line = s.line[:0]
		p = p[i+1:]
	}
	return s.out
}

// finish returns a last line that never got its newline, rewritten (with
// the newline added when addNewline).
func (s *sseLines) finish(e lineEmitter, addNewline bool) []byte {
	s.out = s.out[:0]
	if s.gaveUp || len(s.line) == 0 {
		return append(s.out, s.line...)
	}
	if addNewline {
		s.line = append(s.line, '\n')
	}
	e.emitLine(s.line)
	s.line = s.line[:0]
	return s.out
}

func (s *sseNormaliser) emitLine(line []byte) {
	text := bytes.TrimRight(line, "\r\n")
	if len(text) == 0 {
		if s.swallowed {
			s.swallowed = false
			return
		}
		s.out = append(s.out, line...)
		return
	}
	s.swallowed = false
	payload, ok := bytes.CutPrefix(text, dataPrefix)
	if !ok {
		s.out = append(s.out, line...)
		return
	}
	// SSE strips exactly one space after the colon.
	payload = bytes.TrimPrefix(payload, []byte(" "))
	events := s.rw.Rewrite(payload)
	if len(events) == 0 {
		s.swallowed = true
		return
	}
	for i, ev := range events {
		if i > 0 {
			// A blank line ends each extra event; the upstream's own blank
			// line ends the last one.
			s.out = append(s.out, '\n')
		}
		s.out = append(s.out, "data: "...)
		s.out = append(s.out, ev...)
		s.out = append(s.out, '\n')
	}
}
