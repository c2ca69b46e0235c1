package gguf

import (
	"fmt"
	"math/rand/v2"
	"os"
)

// ChatMLTemplate is the ChatML chat template (Qwen's and many others'), in
// the Jinja form llama-server's --jinja renders; without --jinja
// llama-server recognises it by its <|im_start|> marker.
const ChatMLTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Token types as llama.cpp numbers them (llama_token_type).
const (
	tokenNormal  int32 = 1
	tokenUnknown int32 = 2
	tokenControl int32 = 3
	tokenByte    int32 = 6
)

// TinyConfig shapes a TinyLlama model.
type TinyConfig struct {
	Layers  int // block count
	Embd    int // hidden size
	Heads   int // attention heads (KV heads equal)
	FF      int // feed-forward size
	Context int // trained context length
	Seed    uint64
}

// DefaultTiny is the model the tests use: 2 layers, hidden 64.
var DefaultTiny = TinyConfig{Layers: 2, Embd: 64, Heads: 4, FF: 128, Context: 4096, Seed: 1}

// PrefillTiny is a model whose prompt processing costs what a held prefix
// must save to matter: 4 layers, hidden 256 (11 MB of F32). On one CPU
// thread here llama-server prefills 500 tokens in about 0.1 s and 3,000 in
// about 1 s, where DefaultTiny takes 0.06 and 0.4 s, so that the stalls of
// a shared, noisy machine are small next to the prefill a cache saves.
var PrefillTiny = TinyConfig{Layers: 4, Embd: 256, Heads: 4, FF: 512, Context: 8192, Seed: 1}

// TinyVocab is the vocabulary: <unk>, <s>, </s>, the two ChatML markers,
// the 256 byte tokens <0x00>…<0xFF> (SentencePiece byte fallback, so any
// text tokenizes, one token per UTF-8 byte), and the 95 printable ASCII
// characters as normal tokens, so that the tokenizer
// maps an ASCII character to one token and the model's answers are text.
func TinyVocab() (tokens []string, types []int32) {
	add := func(s string, t int32) { tokens = append(tokens, s); types = append(types, t) }
	add("<unk>", tokenUnknown)
	add("<s>", tokenControl)
	add("</s>", tokenControl)
	add("<|im_start|>", tokenControl)
	add("<|im_end|>", tokenControl)
	for b := 0; b < 256; b++ {
		add(fmt.Sprintf("<0x%02X>", b), tokenByte)
	}
	// SentencePiece writes a space as ▁ (U+2581).
	add("\u2581", tokenNormal)
	for c := byte('!'); c <= '~'; c++ {
		add(string(c), tokenNormal)
	}
	return tokens, types
}

// TinyLlama builds a llama-architecture model with random weights.
func TinyLlama(c TinyConfig) (File, error) {
	if c.Layers < 1 || c.Embd < 1 || c.Heads < 1 || c.FF < 1 || c.Context < 1 || c.Embd%c.Heads != 0 {
		return File{}, fmt.Errorf("gguf: tiny model %+v: every size must be positive and the hidden size a multiple of the heads", c)
	}
	tokens, types := TinyVocab()
	scores := make([]float32, len(tokens))
	for i := range scores {
		// SentencePiece merges by score; there are no multi-character
		// pieces, so the scores only need to be distinct.
		scores[i] = -float32(i)
	}
	nVocab := uint64(len(tokens))
	headDim := uint32(c.Embd / c.Heads)
	f := File{KV: []KV{
		{"general.architecture", "llama"},
		{"general.name", "fleet-tiny"},
		{"general.file_type", uint32(0)}, // all F32
		{"llama.context_length", uint32(c.Context)},
		{"llama.embedding_length", uint32(c.Embd)},
		{"llama.block_count", uint32(c.Layers)},
		{"llama.feed_forward_length", uint32(c.FF)},
		{"llama.attention.head_count", uint32(c.Heads)},
		{"llama.attention.head_count_kv", uint32(c.Heads)},
		{"llama.rope.dimension_count", headDim},
		{"llama.rope.freq_base", float32(10000)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.vocab_size", uint32(nVocab)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(4)}, // <|im_end|> ends a ChatML turn
		{"tokenizer.ggml.add_bos_token", false},
		{"tokenizer.chat_template", ChatMLTemplate},
	}}
	rng := rand.New(rand.NewPCG(c.Seed, 0x9e3779b97f4a7c15))
	random := func(name string, dims ...uint64) {
		d := make([]float32, elems(dims))
		for i := range d {
			d[i] = float32(rng.NormFloat64() * 0.02)
		}
		f.Tensors = append(f.Tensors, Tensor{Name: name, Dims: dims, Data: d})
	}
	ones := func(name string, n uint64) {
		d := make([]float32, n)
		for i := range d {
			d[i] = 1
		}
		f.Tensors = append(f.Tensors, Tensor{Name: name, Dims: []uint64{n}, Data: d})
	}
	e, ff := uint64(c.Embd), uint64(c.FF)
	random("token_embd.weight", e, nVocab)
	ones("output_norm.weight", e)
	random("output.weight", e, nVocab)
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		ones(p+"attn_norm.weight", e)
		random(p+"attn_q.weight", e, e)
		random(p+"attn_k.weight", e, e)
		random(p+"attn_v.weight", e, e)
		random(p+"attn_output.weight", e, e)
		ones(p+"ffn_norm.weight", e)
		random(p+"ffn_gate.weight", e, ff)
		random(p+"ffn_up.weight", e, ff)
		random(p+"ffn_down.weight", ff, e)
	}
	return f, nil
}

// WriteTinyLlama writes DefaultTiny to path.
func WriteTinyLlama(path string) error { return WriteTiny(path, DefaultTiny) }

// WriteTiny writes the model c shapes to path.
func WriteTiny(path string, c TinyConfig) error {
	f, err := TinyLlama(c)
	if err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err := f.Write(out); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	return nil
}
