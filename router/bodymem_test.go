package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// chatBody is a chat request whose body is size bytes long.
func chatBody(t *testing.T, size int) string {
	t.Helper()
	head, tail := `{"model":"qwen3-4b","max_tokens":8,"messages":[{"role":"user","content":"`, `"}]}`
	body := head + strings.Repeat("x", size-len(head)-len(tail)) + tail
	if len(body) != size {
		t.Fatalf("setup: body of %d bytes, want %d", len(body), size)
	}
	return body
}

// postAs posts body to the router's chat endpoint with an API key; chunked
// sends it without a Content-Length.
func postAs(t *testing.T, ctx context.Context, url, key, body string, chunked bool) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader = strings.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // a reader net/http cannot size
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// A refused body may be cut while it is still being sent.
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), resp.Header
}

// Request bodies held in flight are bounded, in all and per API key: a body
// that would pass the total gets 503, one that would pass its key's share
// 429, one larger than a bound 413, each saying what to do, while the other
// keys' requests go on; what a request held is given back when it ends.
// Before, every body was taken whatever the others held (24 bodies of
// 15 MiB took the hub from 141 to 510 MB).
func TestBodiesInFlightAreBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*hangGuard)
	defer cancel()
	const body = 3 << 20 // 3 MiB; 2 fit a key's 7 MiB, and 3 the total of 10
	arrived := make(chan struct{}, 8)
	release := make(chan struct{})
	var served atomic.Int32
	_, b := startBackend(t, "rig/qwen3-4b", 8, func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		arrived <- struct{}{}
		select {
		case <-release:
		case <-req.Context().Done():
			return
		}
		served.Add(1)
		okJSON(w, req)
	})
	b.Context = 0 // unknown: the bodies' prompts are not the point
	_, rsrv := startRouter(t, Options{MaxBodyBytes: 16 << 20, MaxBodiesInFlight: 10 << 20, MaxKeyBodiesInFlight: 7 << 20,
		Keys: keys{"sk-a": "alice", "sk-b": "bob", "sk-c": "carol"}, MetricsOpenLoopback: true}, b)

	// Held at the engine: two of alice's, one of bob's (9 MiB).
	var wg sync.WaitGroup
	releaseAll := sync.OnceFunc(func() { close(release) })
	defer wg.Wait()
	defer releaseAll()
	outer := t
	held := func(t *testing.T, key string, size int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, msg, _ := postAs(outer, ctx, rsrv.URL, key, chatBody(outer, size), false); code != 200 {
				outer.Errorf("a body within the bounds (%s): %d %s", key, code, msg)
			}
		}()
		select {
		case <-arrived:
		case <-ctx.Done():
			t.Fatalf("a body within the bounds (%s) did not reach the engine", key)
		}
	}
	held(t, "sk-a", body)
	held(t, "sk-a", body)
	held(t, "sk-b", body)

	for _, tc := range []struct {
		name, key  string
		size       int
		chunked    bool
		status     int
		code, want string
	}{
		{"alice's third body passes her share", "sk-a", body, false, 429, codeBodiesInFlight, "--key-bodies-in-flight-mib"},
		{"carol's body passes the total", "sk-c", body, false, 503, codeBodiesInFlight, "retry in a moment"},
		{"carol's body without a length passes the total", "sk-c", body, true, 503, codeBodiesInFlight, "retry in a moment"},
		{"a body larger than a key's share", "sk-c", 8 << 20, false, 413, codeBodyTooLarge, "send a smaller request"},
		{"carol's small body fits", "sk-c", 4 << 10, false, 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.status == 0 {
				held(t, tc.key, tc.size)
				return
			}
			code, raw, h := postAs(t, ctx, rsrv.URL, tc.key, chatBody(t, tc.size), tc.chunked)
			var e errorReply
			_ = json.Unmarshal([]byte(raw), &e)
			if code != tc.status || e.Error.Code == nil || *e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.want) {
				t.Fatalf("status %d, body %s; want %d %s saying %q", code, raw, tc.status, tc.code, tc.want)
			}
			if (tc.status != 413) != (h.Get("Retry-After") != "") {
				t.Errorf("Retry-After %q on a %d", h.Get("Retry-After"), tc.status)
			}
		})
	}
	releaseAll()
	wg.Wait()
	if n := served.Load(); n != 4 {
		t.Errorf("the engine served %d requests, want the 4 within the bounds", n)
	}
	// Given back: the bodies refused before fit now.
	for _, key := range []string{"sk-a", "sk-c", "sk-c"} {
		if code, msg, _ := postAs(t, ctx, rsrv.URL, key, chatBody(t, body), false); code != 200 {
			t.Errorf("after the others ended, %s's body: %d %s", key, code, msg)
		}
	}
	for bound, want := range map[string]float64{"key": 1, "total": 2, "size": 1} {
		if got := counterValue(t, ctx, rsrv.URL, "fleet_router_bodies_refused_total", map[string]string{"bound": bound}); got != want {
			t.Errorf("fleet_router_bodies_refused_total{bound=%q} = %v, want %v", bound, got, want)
		}
	}
}
