package router

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestConnectionNamedHeadersStripped: headers a Connection header names are
// for the next hop only, both ways: the client's do not reach the engine,
// the engine's do not reach the client, and the rest passes.
func TestConnectionNamedHeadersStripped(t *testing.T) {
	var seen atomic.Value // http.Header the engine got
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		seen.Store(req.Header.Clone())
		w.Header().Set("Connection", "X-Engine-Hop, X-Engine-Other")
		w.Header().Set("X-Engine-Hop", "engine secret")
		w.Header().Set("X-Engine-Other", "engine secret")
		w.Header().Set("X-Engine-Kept", "yes")
		okJSON(w, req)
	})
	_, srv := startRouter(t, Options{}, b)
	for _, tc := range []struct {
		name       string
		connection []string
		hops       []string
	}{
		{"one name", []string{"X-Client-Hop"}, []string{"X-Client-Hop"}},
		{"a list with spaces and keep-alive", []string{" x-client-hop ,keep-alive,, X-Client-Other"}, []string{"X-Client-Hop", "X-Client-Other"}},
		{"two Connection headers", []string{"X-Client-Hop", "X-Client-Other"}, []string{"X-Client-Hop", "X-Client-Other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"qwen3-4b","messages":[]}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header["Connection"] = tc.connection
			for _, h := range tc.hops {
				req.Header.Set(h, "client secret")
			}
			req.Header.Set("X-Client-Kept", "yes")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := seen.Load().(http.Header)
			for _, h := range tc.hops {
				if v := got.Get(h); v != "" {
					t.Errorf("the engine got the client's hop header %s: %q", h, v)
				}
			}
			if got.Get("X-Client-Kept") != "yes" {
				t.Errorf("the engine did not get X-Client-Kept: %v", got)
			}
			for _, h := range []string{"X-Engine-Hop", "X-Engine-Other"} {
				if v := resp.Header.Get(h); v != "" {
					t.Errorf("the client got the engine's hop header %s: %q", h, v)
				}
			}
			if resp.Header.Get("X-Engine-Kept") != "yes" {
				t.Errorf("the client did not get X-Engine-Kept: %v", resp.Header)
			}
		})
	}
}
