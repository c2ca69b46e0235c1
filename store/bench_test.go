package store

import (
	"context"
	"testing"
	"time"

	"fleet"
)

// BenchmarkAddSamples measures a router flush: one transaction of 100
// request samples.
func BenchmarkAddSamples(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, b.TempDir()+"/fleet.db")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	batch := make([]fleet.Sample, 100)
	for i := range batch {
		batch[i] = fleet.Sample{Worker: "rig/qwen3-4b", At: time.Unix(int64(i+1), 0), Kind: "request", TTFT: time.Millisecond, TokPerSec: 80}
	}
	b.ResetTimer()
	for b.Loop() {
		if err := s.AddSamples(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyFleet measures applying the demo-sized fleet A over B and back.
func BenchmarkApplyFleet(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, b.TempDir()+"/fleet.db")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	a, c := fleetA(), fleetB()
	b.ResetTimer()
	for b.Loop() {
		if err := s.ApplyFleet(ctx, a); err != nil {
			b.Fatal(err)
		}
		if err := s.ApplyFleet(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
}
