package router

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// TestUnreachableWorkersAlwaysRetried: a worker whose connection cannot be
// opened never saw the request, so the next worker is tried whatever
// MaxRetries says; one that took the request and failed is retried only
// within MaxRetries.
func TestUnreachableWorkersAlwaysRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	_, good := startBackend(t, "good/qwen3-4b", 4, okJSON)
	var bad []Backend
	for _, name := range []string{"dead1/qwen3-4b", "dead2/qwen3-4b", "dead3/qwen3-4b"} {
		bad = append(bad, Backend{Name: name, Model: "qwen3-4b", Addr: deadAddr(t), Context: 16384, Slots: 4})
	}
	// Round-robin tries them in order: the three unreachable ones first.
	_, srv := startRouter(t, Options{Policy: PolicyRoundRobin, MaxRetries: -1}, append(bad, good)...)
	resp := post(t, ctx, srv.URL, `{"model":"qwen3-4b"}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with three unreachable workers before a good one and no retries allowed: status %d %s, want 200", resp.StatusCode, body)
	}

	// A worker that answers 500 took the request: with no retries allowed
	// the client hears of it.
	_, failing := startBackend(t, "failing/qwen3-4b", 4, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	_, good2 := startBackend(t, "good2/qwen3-4b", 4, okJSON)
	_, srv2 := startRouter(t, Options{Policy: PolicyRoundRobin, MaxRetries: -1}, failing, good2)
	resp = post(t, ctx, srv2.URL, `{"model":"qwen3-4b"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("a worker that failed after taking the request, no retries allowed: status %d, want 502", resp.StatusCode)
	}
}
