package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// reader is an independent GGUF v3 parser, just enough to check what the
// writer produced, field by field as the spec lays them out.
type reader struct {
	r   *bytes.Reader
	err error
}

func (r *reader) u32() uint32 {
	var v uint32
	if r.err == nil {
		r.err = binary.Read(r.r, binary.LittleEndian, &v)
	}
	return v
}

func (r *reader) u64() uint64 {
	var v uint64
	if r.err == nil {
		r.err = binary.Read(r.r, binary.LittleEndian, &v)
	}
	return v
}

func (r *reader) str() string {
	n := r.u64()
	if r.err != nil || n > 1<<20 {
		r.err = fmt.Errorf("string length %d", n)
		return ""
	}
	b := make([]byte, n)
	_, r.err = io.ReadFull(r.r, b)
	return string(b)
}

func (r *reader) scalar(t ValueType) any {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		b, err := r.r.ReadByte()
		r.err = err
		return b
	case TypeUint32, TypeInt32:
		return r.u32()
	case TypeFloat32:
		return math.Float32frombits(r.u32())
	case TypeString:
		return r.str()
	case TypeUint64, TypeInt64, TypeFloat64:
		return r.u64()
	}
	r.err = fmt.Errorf("unexpected type %d", t)
	return nil
}

type parsed struct {
	version  uint32
	kv       map[string]any
	arrays   map[string][]any
	tensors  map[string][]uint64
	offsets  map[string]uint64
	dataAt   int64
	fileSize int64
}

func parse(t *testing.T, b []byte) parsed {
	t.Helper()
	r := &reader{r: bytes.NewReader(b)}
	magic := make([]byte, 4)
	io.ReadFull(r.r, magic)
	if string(magic) != "GGUF" {
		t.Fatalf("magic %q", magic)
	}
	p := parsed{kv: map[string]any{}, arrays: map[string][]any{}, tensors: map[string][]uint64{}, offsets: map[string]uint64{}}
	p.version = r.u32()
	nT, nKV := r.u64(), r.u64()
	for range nKV {
		k := r.str()
		typ := ValueType(r.u32())
		if typ == TypeArray {
			et := ValueType(r.u32())
			n := r.u64()
			var items []any
			for range n {
				items = append(items, r.scalar(et))
			}
			p.arrays[k] = items
			continue
		}
		p.kv[k] = r.scalar(typ)
	}
	for range nT {
		name := r.str()
		nd := r.u32()
		dims := make([]uint64, nd)
		for i := range dims {
			dims[i] = r.u64()
		}
		if typ := r.u32(); typ != uint32(GGMLTypeF32) {
			t.Fatalf("tensor %s type %d", name, typ)
		}
		p.tensors[name] = dims
		p.offsets[name] = r.u64()
	}
	if r.err != nil {
		t.Fatalf("parse: %v", r.err)
	}
	pos := int64(len(b)) - int64(r.r.Len())
	p.dataAt = pos + int64(pad(uint64(pos)))
	p.fileSize = int64(len(b))
	return p
}

func TestTinyLlamaLayout(t *testing.T) {
	f, err := TinyLlama(DefaultTiny)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := f.Write(&buf); err != nil {
		t.Fatal(err)
	}
	p := parse(t, buf.Bytes())
	if p.version != 3 {
		t.Errorf("version %d, want 3", p.version)
	}
	for k, want := range map[string]any{
		"general.architecture":        "llama",
		"llama.block_count":           uint32(2),
		"llama.embedding_length":      uint32(64),
		"llama.attention.head_count":  uint32(4),
		"tokenizer.ggml.model":        "llama",
		"tokenizer.ggml.eos_token_id": uint32(4),
	} {
		if p.kv[k] != want {
			t.Errorf("%s = %v (%T), want %v", k, p.kv[k], p.kv[k], want)
		}
	}
	if tpl, _ := p.kv["tokenizer.chat_template"].(string); !strings.Contains(tpl, "<|im_start|>") {
		t.Errorf("chat template %q is not ChatML", tpl)
	}
	toks := p.arrays["tokenizer.ggml.tokens"]
	if n := len(toks); n < 256 || n > 512 {
		t.Errorf("%d tokens, want a byte-level vocabulary of a few hundred", n)
	}
	if len(p.arrays["tokenizer.ggml.scores"]) != len(toks) || len(p.arrays["tokenizer.ggml.token_type"]) != len(toks) {
		t.Errorf("scores/types do not match the %d tokens", len(toks))
	}
	if toks[5+0x0A] != "<0x0A>" {
		t.Errorf("the newline byte token is %v", toks[5+0x0A])
	}
	if got := p.tensors["token_embd.weight"]; len(got) != 2 || got[0] != 64 || got[1] != uint64(len(toks)) {
		t.Errorf("token_embd dims %v", got)
	}
	if _, ok := p.tensors["blk.1.ffn_down.weight"]; !ok || len(p.tensors) != 3+9*2 {
		t.Errorf("%d tensors, want 21 with blk.1.ffn_down.weight", len(p.tensors))
	}
	// Every tensor's data is aligned and inside the file; the last one ends
	// the file (padding included).
	var end uint64
	for name, dims := range p.tensors {
		off := p.offsets[name]
		if off%Alignment != 0 || uint64(p.dataAt)%Alignment != 0 {
			t.Errorf("tensor %s at %d (data at %d) is not %d-aligned", name, off, p.dataAt, Alignment)
		}
		size := 4 * elems(dims)
		end = max(end, off+size+pad(size))
	}
	if int64(end)+p.dataAt != p.fileSize {
		t.Errorf("tensor data ends at %d, file is %d bytes", int64(end)+p.dataAt, p.fileSize)
	}
	// The first weight of the norm is 1, read from where the offset says.
	at := p.dataAt + int64(p.offsets["output_norm.weight"])
	if v := math.Float32frombits(binary.LittleEndian.Uint32(buf.Bytes()[at:])); v != 1 {
		t.Errorf("output_norm.weight[0] = %v, want 1", v)
	}
}

func TestWriteRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    File
		want string
	}{
		{"repeated key", File{KV: []KV{{"a", uint32(1)}, {"a", uint32(2)}}}, "repeated"},
		{"bad value", File{KV: []KV{{"a", struct{}{}}}}, "not a GGUF type"},
		{"short data", File{Tensors: []Tensor{{Name: "t", Dims: []uint64{4}, Data: []float32{1}}}}, "hold 4 elements but 1"},
		{"no dims", File{Tensors: []Tensor{{Name: "t"}}}, "0 dimensions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.Write(io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := TinyLlama(TinyConfig{Layers: 2, Embd: 65, Heads: 4, FF: 8, Context: 8}); err == nil {
		t.Error("a hidden size not divisible by the heads was accepted")
	}
}

// WriteTiny writes the shape it is given: PrefillTiny, the routing test's
// model, read back from the file.
func TestWriteTinyShape(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := WriteTiny(path, PrefillTiny); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := parse(t, b)
	for k, want := range map[string]any{
		"llama.block_count":         uint32(PrefillTiny.Layers),
		"llama.embedding_length":    uint32(PrefillTiny.Embd),
		"llama.feed_forward_length": uint32(PrefillTiny.FF),
		"llama.context_length":      uint32(PrefillTiny.Context),
	} {
		if p.kv[k] != want {
			t.Errorf("%s = %v, want %v", k, p.kv[k], want)
		}
	}
	if n := len(p.tensors); n != 3+9*PrefillTiny.Layers {
		t.Errorf("%d tensors, want %d", n, 3+9*PrefillTiny.Layers)
	}
	// Small enough to write in a test's setup.
	if len(b) > 16<<20 {
		t.Errorf("%d bytes; PrefillTiny should stay under 16 MiB", len(b))
	}
	if err := WriteTiny(filepath.Join(t.TempDir(), "no", "such", "dir.gguf"), PrefillTiny); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}
