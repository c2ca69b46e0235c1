package sim

import (
	"encoding/binary"
	"net/http"
	"strings"
)

// tokenIDs cuts text into the sim's tokens (bytesPerToken bytes each, as
// the prompt cache counts them) and numbers each by its bytes, so that
// /detokenize gives the text back.
func tokenIDs(text string) []uint32 {
	var ids []uint32
	for i := 0; i < len(text); i += bytesPerToken {
		var b [4]byte
		copy(b[:], text[i:min(i+bytesPerToken, len(text))])
		ids = append(ids, binary.BigEndian.Uint32(b[:]))
	}
	return ids
}

func tokenPiece(id uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return strings.TrimRight(string(b[:]), "\x00")
}

// handleTokenize serves /tokenize: llama-server's {"content"} →
// {"tokens"} (pieces with with_pieces), vLLM's {"prompt"} or {"messages"} →
// {"count","max_model_len","tokens","token_strs"}.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model      string        `json:"model"`
		Content    string        `json:"content"`
		WithPieces bool          `json:"with_pieces"`
		Prompt     string        `json:"prompt"`
		Messages   []chatMessage `json:"messages"`
	}
	if !s.readBody(w, r, &req) {
		return
	}
	if s.llama() {
		ids := tokenIDs(req.Content)
		if req.WithPieces {
			out := make([]any, len(ids))
			for i, id := range ids {
				out[i] = obj{{"id", id}, {"piece", tokenPiece(id)}}
			}
			writeJSON(w, http.StatusOK, obj{{"tokens", out}})
			return
		}
		writeJSON(w, http.StatusOK, obj{{"tokens", nonNil(ids)}})
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	text := req.Prompt
	for _, m := range req.Messages {
		text += m.text()
	}
	ids := tokenIDs(text)
	writeJSON(w, http.StatusOK, obj{{"count", len(ids)}, {"max_model_len", s.opts.Ctx}, {"tokens", nonNil(ids)}, {"token_strs", nil}})
}

func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}

// handleDetokenize serves /detokenize: {"tokens"} → llama-server's
// {"content"}, vLLM's {"prompt"}.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}
	if !s.readBody(w, r, &req) {
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	var b strings.Builder
	for _, id := range req.Tokens {
		b.WriteString(tokenPiece(id))
	}
	key := "prompt"
	if s.llama() {
		key = "content"
	}
	writeJSON(w, http.StatusOK, obj{{key, b.String()}})
}
