package hub

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fleet"
	"fleet/console"
)

// A bench started from the console is the hub's background work: Close
// cancels it and waits for it, as it does a console restart, instead of
// leaving its requests (and its store writes) running after the hub ended.
func TestConsoleBenchEndsWithTheHub(t *testing.T) {
	var inFlight atomic.Int64
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read whole, so the server sees the client hang up (r.Context).
		_, _ = io.Copy(io.Discard, r.Body)
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		select { // an engine that never answers
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer func() { close(release); srv.Close() }()

	h, err := openHub(t, Options{Demo: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			h.Close()
		}
	})
	h.state.mu.Lock()
	model := h.state.models[0].ID
	h.httpAddr = strings.TrimPrefix(srv.URL, "http://")
	h.state.mu.Unlock()

	msg, err := h.ConsoleSource(operator).Do(t.Context(), console.Action{Kind: fleet.ActionBench, Targets: []string{model}})
	if err != nil {
		t.Fatalf("console bench of %s: %v", model, err)
	}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("the bench (%s) sent no request to the router", msg)
	}
	h.Close()
	closed = true
	deadline := time.Now().Add(30 * time.Second)
	for inFlight.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bench requests still open after the hub closed", inFlight.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
