package router

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"fleet"
)

// TestRequestWaitsForAComingWorker: a model whose only worker is still
// starting holds the request in the queue and serves it once the worker is
// ready, instead of answering 503 at once.
func TestRequestWaitsForAComingWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	r, rs := startRouter(t, Options{QueueTimeout: hangGuard})
	r.SetOutlook(map[string]Outlook{"qwen3-4b": OutlookOf([]fleet.WorkerState{fleet.WorkerStarting})})
	got := make(chan int, 1)
	go func() {
		resp := post(t, ctx, rs.URL, `{"model":"qwen3","messages":[]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	waitFor(t, func() bool { return r.queueLen("qwen3-4b") == 1 })
	r.SetBackendsAndOutlook([]Backend{b}, map[string]Outlook{"qwen3-4b": {}})
	if status := <-got; status != http.StatusOK {
		t.Fatalf("the request that waited for the worker got %d, want 200", status)
	}
}

// TestNoWorkerThatCanComeIs503AtOnce: without a worker on its way, the
// answer is immediate and names the case.
func TestNoWorkerThatCanComeIs503AtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outlook map[string]Outlook
		want    string
	}{
		{"none placed", nil, "has no worker placed"},
		{"all failed or rejected", map[string]Outlook{"qwen3-4b": OutlookOf([]fleet.WorkerState{fleet.WorkerFailed, fleet.WorkerRejected, fleet.WorkerFailed})},
			"no worker that can become ready: 2 failed, 1 rejected"},
		{"stopped", map[string]Outlook{"qwen3-4b": OutlookOf([]fleet.WorkerState{fleet.WorkerStopped})}, "1 stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A queue timeout far beyond the test: an answer means no wait.
			r, rs := startRouter(t, Options{QueueTimeout: time.Hour})
			r.SetOutlook(tc.outlook)
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			resp := post(t, ctx, rs.URL, `{"model":"qwen3-4b","messages":[]}`)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", resp.StatusCode)
			}
			if e := decodeError(t, resp); !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("message %q does not say %q", e.Error.Message, tc.want)
			}
		})
	}
}

// TestQueuedRequestFailsWhenItsWorkerCannotCome: a worker that fails while
// requests wait for it releases them with the reason, not at the timeout.
func TestQueuedRequestFailsWhenItsWorkerCannotCome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	r, rs := startRouter(t, Options{QueueTimeout: time.Hour})
	r.SetOutlook(map[string]Outlook{"qwen3-4b": {Coming: 1}})
	got := make(chan *http.Response, 1)
	go func() { got <- post(t, ctx, rs.URL, `{"model":"qwen3-4b","messages":[]}`) }()
	waitFor(t, func() bool { return r.queueLen("qwen3-4b") == 1 })
	r.SetOutlook(map[string]Outlook{"qwen3-4b": OutlookOf([]fleet.WorkerState{fleet.WorkerFailed})})
	resp := <-got
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if e := decodeError(t, resp); !strings.Contains(e.Error.Message, "1 failed") {
		t.Errorf("message %q does not say the worker failed", e.Error.Message)
	}
}

// TestComingWorkerThatNeverArrivesTimesOutWith503: the wait is bounded by
// the queue timeout, and the answer says what it waited for.
func TestComingWorkerThatNeverArrivesTimesOutWith503(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	r, rs := startRouter(t, Options{QueueTimeout: 50 * time.Millisecond})
	r.SetOutlook(map[string]Outlook{"qwen3-4b": {Coming: 2}})
	resp := post(t, ctx, rs.URL, `{"model":"qwen3-4b","messages":[]}`)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if e := decodeError(t, resp); !strings.Contains(e.Error.Message, "2 starting") || !strings.Contains(e.Error.Message, "queue timeout") {
		t.Errorf("message %q does not say what it waited for", e.Error.Message)
	}
}

// TestQueueWaitIsNotTheWorkersTTFT: a request that waited in the router for
// a worker to come up does not charge that wait to the worker's TTFT.
func TestQueueWaitIsNotTheWorkersTTFT(t *testing.T) {
	const wait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sseEvent("hi")+sseEvent(" there")+"data: [DONE]\n\n")
	})
	r, rs := startRouter(t, Options{QueueTimeout: hangGuard})
	r.SetOutlook(map[string]Outlook{"qwen3-4b": {Coming: 1}})
	got := make(chan int, 1)
	go func() {
		resp := post(t, ctx, rs.URL, `{"model":"qwen3-4b","stream":true,"messages":[]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	waitFor(t, func() bool { return r.queueLen("qwen3-4b") == 1 })
	time.Sleep(wait)
	r.SetBackendsAndOutlook([]Backend{b}, map[string]Outlook{"qwen3-4b": {}})
	if status := <-got; status != http.StatusOK {
		t.Fatalf("status %d, want 200", status)
	}
	h := r.Stats()[0].TTFTHistory
	if len(h) != 1 {
		t.Fatalf("TTFT history %v, want one measurement", h)
	}
	// The worker answered at once; the second was the router's.
	if h[0] >= float64(wait/time.Millisecond) {
		t.Errorf("the worker's TTFT is %.1f ms: it includes the %s the request waited in the router", h[0], wait)
	}
}
