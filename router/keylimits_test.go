package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"fleet"
)

// A hub that shares a key's rpm with other hubs and has admitted its share
// of what they have not counted yet (keylimit.Leash) answers 429 saying
// so, not that the minute is spent: the key still has most of its minute,
// and a second later (once the hubs have counted each other) the same hub
// admits it again. A minute really spent still says it is spent.
func TestKeyLeash429SaysTheLimitIsShared(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	r, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice", "sk-b": "bob"}}, b)
	const rpm = 240
	r.SetKeyLimits(map[string]fleet.KeyLimits{"alice": {RequestsPerMinute: rpm}, "bob": {RequestsPerMinute: 1}})
	// Two other hubs count alice's requests: this one may admit its share
	// of her full bucket (at most a twelfth, 20) that they have not seen.
	book := r.KeyBook()
	book.Others(nil, 2, time.Now())
	var resp *http.Response
	var body string
	admitted := 0
	for ; admitted <= 20; admitted++ {
		if resp, body = doKey(t, rsrv.URL, "sk-a", `{"model":"qwen3-4b"}`); resp.StatusCode != http.StatusOK {
			break
		}
	}
	if resp.StatusCode != http.StatusTooManyRequests || admitted < 10 || admitted > 20 {
		t.Fatalf("alice's request %d before the hubs counted each other: %d %s; want 429 after 10 to 20", admitted+1, resp.StatusCode, body)
	}
	e := errorOf(t, body)
	for _, want := range []string{"240 requests a minute", "shared by the 3 hubs on this database", "this hub has spent its share", "retry in 1s"} {
		if !strings.Contains(e.Error.Message, want) {
			t.Errorf("the leash's 429 says %q; want it to say %q", e.Error.Message, want)
		}
	}
	if strings.Contains(e.Error.Message, "minute is spent") {
		t.Errorf("the leash's 429 says the minute is spent, with %s requests of it left: %q", resp.Header.Get("x-ratelimit-remaining-requests"), e.Error.Message)
	}
	if resp.Header.Get("retry-after") != "1" || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" {
		t.Errorf("the leash's 429: retry-after %q code %v, want 1 and rate_limit_exceeded", resp.Header.Get("retry-after"), e.Error.Code)
	}
	// The hub publishes what it admitted: the same hub admits her again.
	book.Published(book.Take())
	if resp, body := doKey(t, rsrv.URL, "sk-a", `{"model":"qwen3-4b"}`); resp.StatusCode != http.StatusOK {
		t.Errorf("alice after her hub published its counts: %d %s, want 200", resp.StatusCode, body)
	}

	// bob's one request a minute, spent: that is what his 429 says.
	if resp, body := doKey(t, rsrv.URL, "sk-b", `{"model":"qwen3-4b"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("bob's first request: %d %s", resp.StatusCode, body)
	}
	resp, body = doKey(t, rsrv.URL, "sk-b", `{"model":"qwen3-4b"}`)
	e = errorOf(t, body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(e.Error.Message, "limit of 1 requests a minute is spent") || strings.Contains(e.Error.Message, "shared") {
		t.Errorf("bob's second request in a minute: %d %q, want 429 saying his minute is spent", resp.StatusCode, e.Error.Message)
	}
}

// errorOf is the OpenAI-shaped error body.
func errorOf(t *testing.T, body string) errorReply {
	t.Helper()
	var e errorReply
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, body)
	}
	return e
}
