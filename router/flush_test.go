package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// flushRecorder is a ResponseWriter that records how many body bytes each
// Flush sent.
type flushRecorder struct {
	header  http.Header
	mu      sync.Mutex
	pending int
	flushes []int
}

func (w *flushRecorder) Header() http.Header { return w.header }
func (w *flushRecorder) WriteHeader(int)     {}
func (w *flushRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending += len(p)
	return len(p), nil
}

func (w *flushRecorder) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushes = append(w.flushes, w.pending)
	w.pending = 0
}

// TestStreamHeadersLeaveWithTheFirstBytes: a stream's headers are not
// flushed in a write of their own (a system call and a client read per
// stream) but with the first bytes of the body, which the hedge has read
// already; and every flush carries body bytes.
func TestStreamHeadersLeaveWithTheFirstBytes(t *testing.T) {
	_, b := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a", "b", "c"} {
			_, _ = io.WriteString(w, sseEvent(tok))
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	r := mustNew(t, Options{})
	if err := r.SetModels(testModels()); err != nil {
		t.Fatal(err)
	}
	r.SetBackends([]Backend{b})
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"qwen3-4b","stream":true,"messages":[]}`))
	w := &flushRecorder{header: http.Header{}}
	r.Handler().ServeHTTP(w, req)
	if len(w.flushes) == 0 {
		t.Fatal("the stream was never flushed")
	}
	for i, n := range w.flushes {
		if n == 0 {
			t.Errorf("flush %d of %v sent no body bytes: headers were flushed alone", i, w.flushes)
		}
	}
}
