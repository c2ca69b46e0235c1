package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
)

// oneWorkerFleet is a fleet of one simulated vLLM worker, rig/qwen3-4b
// (about 90 tokens a second to one stream).
const oneWorkerFleet = `nodes:
  - name: rig
    address: sim:rtx3060-vllm
models:
  - id: qwen3-4b
    context: 16384
    memory_gb: 3
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
placements:
  - model: qwen3-4b
    nodes: [rig]
`

// twoHubsOneWorker starts a leader (hub-a, applying oneWorkerFleet) and a
// follower (hub-b) on one PostgreSQL database, the leader with extra flags,
// and waits until both route to the ready worker.
func twoHubsOneWorker(t *testing.T, leaderFlags ...string) (dataA, dataB string, b *hubProc) {
	t.Helper()
	dbURL := pgtest.URL(t)
	dataA, dataB = t.TempDir(), t.TempDir()
	file := filepath.Join(dataA, "fleet.yaml")
	if err := os.WriteFile(file, []byte(oneWorkerFleet), 0o600); err != nil {
		t.Fatal(err)
	}
	launchHub(t, dataA, freePort(t), append([]string{"--fleet", file, "--database-url", dbURL, "--hub-name", "hub-a"}, leaderFlags...)...)
	waitReady(t, dataA, 1, 120*time.Second)
	b = launchHub(t, dataB, freePort(t), "--database-url", dbURL, "--hub-name", "hub-b")
	waitRole(t, dataB, "follower", 60*time.Second)
	waitReady(t, dataB, 1, 60*time.Second)
	return dataA, dataB, b
}

// streamed is how a streamed chat completion ended for its client.
type streamed struct {
	events []string
	last   time.Time // when the last line came
	err    error     // reading the body failed (cut)
}

// whole says whether the stream carried maxTokens tokens and ended with
// [DONE].
func (s streamed) whole(maxTokens int) bool {
	return s.err == nil && len(s.events) > 2 && s.events[len(s.events)-1] == "[DONE]" &&
		strings.Contains(s.events[len(s.events)-2], fmt.Sprintf(`"completion_tokens":%d`, maxTokens))
}

// streamThrough sends a streamed chat completion of maxTokens tokens to the
// router at addr, in the background.
func streamThrough(addr string, maxTokens int) <-chan streamed {
	done := make(chan streamed, 1)
	go func() {
		var s streamed
		defer func() { done <- s }()
		body := fmt.Sprintf(`{"model":"qwen3-4b","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			s.err = err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			s.err = fmt.Errorf("HTTP %d", resp.StatusCode)
			return
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			s.last = time.Now()
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				s.events = append(s.events, data)
			}
		}
		s.err = sc.Err()
	}()
	return done
}

// waitInFlight waits until the hub on data has a request in flight on
// worker name.
func waitInFlight(t *testing.T, data, name string) fleet.WorkerView {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ws := workersJSON(t, data)
		if i := slices.IndexFunc(ws, func(w fleet.WorkerView) bool { return w.Name() == name }); i >= 0 && ws[i].InFlight > 0 {
			return ws[i]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the hub on %s never had a request in flight on %s", data, name)
	return fleet.WorkerView{}
}

// TestRestartWaitsForAStreamThroughAnotherHub: two hubs on one PostgreSQL,
// one worker. A long stream goes through the follower; `fleet restart` of
// the worker, run on the leader and then on the follower, drains the
// worker on both hubs (the follower shows it draining while the restart
// waits) and waits for that stream: the stream ends whole,
// and only then is the engine stopped and launched again.
func TestRestartWaitsForAStreamThroughAnotherHub(t *testing.T) {
	t.Parallel()
	dataA, dataB, b := twoHubsOneWorker(t)
	const name, tokens = "rig/qwen3-4b", 500 // about 5 s
	for _, on := range []struct{ hub, data string }{{"the leader", dataA}, {"the follower", dataB}} {
		before := waitReady(t, dataB, 1, 120*time.Second)[0]
		stream := streamThrough(b.http, tokens)
		waitInFlight(t, dataB, name)
		type result struct {
			out  string
			code int
		}
		restarted := make(chan result, 1)
		go func() {
			out, code := fleetCmd(t, on.data, "restart", name)
			restarted <- result{out, code}
		}()
		// The restart's drain reaches the follower while it waits.
		waitWorkerSeen(t, dataB, name, "draining during the restart", func(w fleet.WorkerView) bool {
			return w.State == fleet.WorkerDraining && w.Drained
		})
		if r := <-restarted; r.code != 0 || !strings.Contains(r.out, "restarted "+name) {
			t.Fatalf("restart on %s: exit %d:\n%s", on.hub, r.code, r.out)
		}
		var s streamed
		select {
		case s = <-stream:
		default:
			t.Fatalf("restart on %s returned while the stream through the follower was still going", on.hub)
		}
		if !s.whole(tokens) {
			n := len(s.events)
			t.Fatalf("restart on %s cut the stream through the follower: %d events, err %v, last %q", on.hub, n, s.err, s.events[max(0, n-2):])
		}
		after := waitReady(t, dataA, 1, 120*time.Second)[0]
		if after.PID == before.PID || !after.StartedAt.After(s.last) {
			t.Errorf("restart on %s: PID %d started %s, before PID %d, stream ended %s; want a new engine started after the stream", on.hub,
				after.PID, after.StartedAt.Format(time.StampMilli), before.PID, s.last.Format(time.StampMilli))
		}
		// The restart's drain reached the follower and ended there too: it
		// routes to the new engine.
		waitWorkerSeen(t, dataB, name, "ready again, undrained", func(w fleet.WorkerView) bool {
			return w.State == fleet.WorkerReady && !w.Drained && w.PID == after.PID
		})
		if s := <-streamThrough(b.http, 8); !s.whole(8) {
			t.Fatalf("after the restart on %s the follower does not route to the worker: %d events, err %v", on.hub, len(s.events), s.err)
		}
	}
}

// TestRestartAfterTheDrainTimeoutCutsAnotherHubsStream: with the leader's
// --drain-timeout short, a restart does not wait for a stream through the
// follower longer than that: it stops the engine with the stream in
// flight, whose client sees it end early with an error event ("worker …
// failed mid-stream …") and no [DONE], and the event says which hub had
// requests in flight.
func TestRestartAfterTheDrainTimeoutCutsAnotherHubsStream(t *testing.T) {
	t.Parallel()
	dataA, dataB, b := twoHubsOneWorker(t, "--drain-timeout", "2s")
	const name, tokens = "rig/qwen3-4b", 3000 // about 30 s
	before := waitReady(t, dataB, 1, 120*time.Second)[0]
	stream := streamThrough(b.http, tokens)
	waitInFlight(t, dataB, name)
	if out, code := fleetCmd(t, dataA, "restart", name); code != 0 || !strings.Contains(out, "restarted "+name) {
		t.Fatalf("restart on the leader: exit %d:\n%s", code, out)
	}
	s := <-stream
	if s.whole(tokens) || len(s.events) == 0 || !strings.Contains(s.events[len(s.events)-1], "failed mid-stream") {
		t.Fatalf("the stream through the follower ended with %d events, the last %q; want it cut by the restart with an error event", len(s.events), s.events[max(0, len(s.events)-1):])
	}
	t.Logf("the client of the cut stream saw %d events, err %v, the last %q", len(s.events), s.err, s.events[len(s.events)-1])
	if after := waitReady(t, dataA, 1, 120*time.Second)[0]; after.PID == before.PID {
		t.Errorf("the engine was not restarted: PID %d", after.PID)
	}
	events, _ := fleetCmd(t, dataA, "events", name, "--limit", "50")
	if !strings.Contains(events, "restart: drain timed out after 2s") || !strings.Contains(events, "hub hub-b has 1 in flight") {
		t.Errorf("the leader's events do not say the drain timed out on hub-b's request:\n%s", events)
	}
}
