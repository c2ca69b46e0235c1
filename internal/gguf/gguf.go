// Package gguf writes GGUF v3 model files: enough of the format for the
// tests to hand a real llama-server a model of their own making, with no
// download. TinyLlama builds the smallest llama-architecture model llama.cpp
// loads: random weights, a byte-level vocabulary and a ChatML template.
//
// The format (ggml's docs/gguf.md): magic "GGUF", version, tensor count,
// metadata count, the metadata key/values, the tensor infos, padding to the
// alignment, then the tensor data, each tensor's data aligned. Everything is
// little-endian.
package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Version is the GGUF version written.
const Version = 3

// Alignment is general.alignment's default, which the writer uses.
const Alignment = 32

// ValueType is a metadata value's type tag.
type ValueType uint32

// Metadata value types, numbered as in the spec.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

// TensorType is ggml's type of a tensor's elements; only F32 is written.
type TensorType uint32

// GGMLTypeF32 is ggml's GGML_TYPE_F32.
const GGMLTypeF32 TensorType = 0

// KV is one metadata entry. Value is one of uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64, float64, or a slice
// of one of them ([]string, []float32, []int32, …) for an array.
type KV struct {
	Key   string
	Value any
}

// Tensor is one F32 tensor. Dims are ggml's order: Dims[0] is the
// contiguous (row) dimension.
type Tensor struct {
	Name string
	Dims []uint64
	Data []float32
}

// File is a whole GGUF file's content.
type File struct {
	KV      []KV
	Tensors []Tensor
}

func elems(dims []uint64) uint64 {
	n := uint64(1)
	for _, d := range dims {
		n *= d
	}
	return n
}

func pad(n uint64) uint64 { return (Alignment - n%Alignment) % Alignment }

type writer struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (w *writer) bytes(b []byte) {
	if w.err != nil {
		return
	}
	var k int
	k, w.err = w.w.Write(b)
	w.n += uint64(k)
}

func (w *writer) u32(v uint32) { w.bytes(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *writer) u64(v uint64) { w.bytes(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *writer) str(s string) { w.u64(uint64(len(s))); w.bytes([]byte(s)) }

// scalar writes one value without its type tag and returns its type.
func (w *writer) scalar(v any) (ValueType, error) {
	le := binary.LittleEndian
	switch x := v.(type) {
	case uint8:
		w.bytes([]byte{x})
		return TypeUint8, nil
	case int8:
		w.bytes([]byte{byte(x)})
		return TypeInt8, nil
	case uint16:
		w.bytes(le.AppendUint16(nil, x))
		return TypeUint16, nil
	case int16:
		w.bytes(le.AppendUint16(nil, uint16(x)))
		return TypeInt16, nil
	case uint32:
		w.u32(x)
		return TypeUint32, nil
	case int32:
		w.u32(uint32(x))
		return TypeInt32, nil
	case float32:
		w.u32(math.Float32bits(x))
		return TypeFloat32, nil
	case bool:
		b := byte(0)
		if x {
			b = 1
		}
		w.bytes([]byte{b})
		return TypeBool, nil
	case string:
		w.str(x)
		return TypeString, nil
	case uint64:
		w.u64(x)
		return TypeUint64, nil
	case int64:
		w.u64(uint64(x))
		return TypeInt64, nil
	case float64:
		w.u64(math.Float64bits(x))
		return TypeFloat64, nil
	}
	return 0, fmt.Errorf("gguf: metadata value of type %T is not a GGUF type", v)
}

// typeOf is the type tag a value is written with, arrays included.
func typeOf(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return TypeUint8, true
	case int8:
		return TypeInt8, true
	case uint16:
		return TypeUint16, true
	case int16:
		return TypeInt16, true
	case uint32:
		return TypeUint32, true
	case int32:
		return TypeInt32, true
	case float32:
		return TypeFloat32, true
	case bool:
		return TypeBool, true
	case string:
		return TypeString, true
	case uint64:
		return TypeUint64, true
	case int64:
		return TypeInt64, true
	case float64:
		return TypeFloat64, true
	case []string, []float32, []int32, []uint32, []uint8, []int64, []uint64, []float64, []bool:
		return TypeArray, true
	}
	return 0, false
}

func (w *writer) value(key string, v any) error {
	t, ok := typeOf(v)
	if !ok {
		return fmt.Errorf("gguf: key %s: value of type %T is not a GGUF type", key, v)
	}
	w.u32(uint32(t))
	if t != TypeArray {
		_, err := w.scalar(v)
		return err
	}
	var items []any
	var elemType ValueType
	switch x := v.(type) {
	case []string:
		elemType, items = TypeString, anys(x)
	case []float32:
		elemType, items = TypeFloat32, anys(x)
	case []int32:
		elemType, items = TypeInt32, anys(x)
	case []uint32:
		elemType, items = TypeUint32, anys(x)
	case []uint8:
		elemType, items = TypeUint8, anys(x)
	case []int64:
		elemType, items = TypeInt64, anys(x)
	case []uint64:
		elemType, items = TypeUint64, anys(x)
	case []float64:
		elemType, items = TypeFloat64, anys(x)
	case []bool:
		elemType, items = TypeBool, anys(x)
	}
	w.u32(uint32(elemType))
	w.u64(uint64(len(items)))
	for _, it := range items {
		if _, err := w.scalar(it); err != nil {
			return fmt.Errorf("gguf: key %s: %w", key, err)
		}
	}
	return nil
}

func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// Write writes f as GGUF v3.
func (f File) Write(out io.Writer) error {
	seen := map[string]bool{}
	for _, kv := range f.KV {
		if kv.Key == "" || seen[kv.Key] {
			return fmt.Errorf("gguf: metadata key %q is empty or repeated", kv.Key)
		}
		seen[kv.Key] = true
	}
	seen = map[string]bool{}
	for _, t := range f.Tensors {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("gguf: tensor name %q is empty or repeated", t.Name)
		}
		seen[t.Name] = true
		if len(t.Dims) == 0 || len(t.Dims) > 4 {
			return fmt.Errorf("gguf: tensor %s has %d dimensions; ggml takes 1 to 4", t.Name, len(t.Dims))
		}
		if n := elems(t.Dims); n != uint64(len(t.Data)) {
			return fmt.Errorf("gguf: tensor %s: dims %v hold %d elements but %d are given", t.Name, t.Dims, n, len(t.Data))
		}
	}
	w := &writer{w: bufio.NewWriter(out)}
	w.bytes([]byte("GGUF"))
	w.u32(Version)
	w.u64(uint64(len(f.Tensors)))
	w.u64(uint64(len(f.KV)))
	for _, kv := range f.KV {
		w.str(kv.Key)
		if err := w.value(kv.Key, kv.Value); err != nil {
			return err
		}
	}
	var offset uint64
	for _, t := range f.Tensors {
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(uint32(GGMLTypeF32))
		w.u64(offset)
		size := 4 * elems(t.Dims)
		offset += size + pad(size)
	}
	w.bytes(make([]byte, pad(w.n)))
	for _, t := range f.Tensors {
		buf := make([]byte, 0, 4*len(t.Data))
		for _, v := range t.Data {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		w.bytes(buf)
		w.bytes(make([]byte, pad(uint64(len(buf)))))
	}
	if w.err != nil {
		return fmt.Errorf("gguf: writing: %w", w.err)
	}
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("gguf: writing: %w", err)
	}
	return nil
}
