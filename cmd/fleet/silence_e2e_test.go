package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/internal/netnstest"
	"fleet/internal/sshdtest"
)

// TestSilentNodeUnderLoad is issue 12's "done when" for a node that drops
// off the network. Two nodes, each an sshd in a network namespace of its
// own, serve one model; the router goes round robin, so half the traffic
// aims at each. While a request is sent five times a second for 30 s, one
// node falls silent (every packet dropped both ways, no reset, no ICMP)
// long enough for its connection to be declared lost, then returns. Every
// request must succeed, none may take more than 12 s (before the hedge they
// waited 17-19 s for the connection to be declared lost), and the node's
// worker must be ready again soon after it returns. Before that, a blip
// shorter than the keepalive grace must cost streams a pause, not their
// answer. The p95 latency and the
// time to ready are logged: they are the figures the issue asks for (95%
// within 1 s, ready within 5 s), not asserted, since this machine is shared.
func TestSilentNodeUnderLoad(t *testing.T) {
	netnstest.Skip(t)
	if _, err := os.Stat(sshdtest.Path); err != nil {
		t.Skipf("OpenSSH server not installed (%s missing): install openssh-server", sshdtest.Path)
	}
	type node struct {
		name string
		ns   *netnstest.Namespace
		sshd *sshdtest.Server
	}
	var ns []node
	for _, name := range []string{"desk", "laptop"} {
		n := netnstest.New(t)
		s := sshdtest.NewOn(t, n.IP, n.Command())
		s.Start()
		ns = append(ns, node{name, n, s})
	}
	desk, laptop := ns[0], ns[1]
	var file strings.Builder
	file.WriteString("nodes:\n")
	for _, n := range ns {
		fmt.Fprintf(&file, "  - name: %s\n    address: %s\n    identity: %s\n", n.name, n.sshd.Address(), n.sshd.Identity())
	}
	file.WriteString(sshFleetModel)
	file.WriteString("placements:\n  - model: qwen3-4b\n    nodes: [desk, laptop]\n    engine: sim\n")
	data := t.TempDir()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	hub := launchHub(t, data, freePort(t), "--fleet", path, "--policy", "round-robin")
	base := "http://" + hub.http
	waitReady(t, data, 2, 120*time.Second)
	// Warm the speed model with a few answers from each worker.
	client := &http.Client{}
	for i := range 6 {
		if r := silentReq(client, base, i); r.err != nil {
			t.Fatalf("warm-up request: %v", r.err)
		}
	}

	// A blip shorter than the keepalive grace: the streams in flight, one on
	// each node, pause and then finish whole; nothing is cut.
	type blipStream struct {
		r           streamResult
		first, last time.Time
	}
	blips := make(chan blipStream, 2)
	for range 2 {
		go func() {
			var b blipStream
			b.r = chatStream(base, 700, 60*time.Second, func(n int, _ string) {
				if n == 1 {
					b.first = time.Now()
				}
				b.last = time.Now()
			})
			blips <- b
		}()
	}
	time.Sleep(time.Second)
	laptop.ns.Cut()
	cut := time.Now()
	time.Sleep(4 * time.Second)
	laptop.ns.Restore()
	restoredBlip := time.Now()
	spanned := 0
	for range 2 {
		b := <-blips
		r := b.r
		if r.status != 200 || r.err != nil || len(r.events) < 3 || r.events[len(r.events)-1] != "[DONE]" {
			t.Errorf("a stream across a 4 s blip: HTTP %d, err %v, %d events, body %q", r.status, r.err, len(r.events), r.body)
		}
		for _, e := range r.events {
			if msg, ok := openAIError(e); ok {
				t.Errorf("a stream across a 4 s blip carried an error: %s", msg)
			}
		}
		if b.first.Before(cut) && b.last.After(restoredBlip) {
			spanned++
		}
	}
	if spanned == 0 {
		t.Errorf("no stream was in flight across the blip: the check proves nothing")
	}
	if evs := eventsJSON(t, data, "laptop/qwen3-4b"); containsEvent(evs, "left the ready set") {
		t.Fatalf("a 4 s blip took the laptop's worker out of the ready set: %+v", evs)
	}

	const (
		rate     = 5
		duration = 30 * time.Second
		cutAt    = 4 * time.Second
		// Past 3 missed keepalives at 5 s (15-20 s): the connection is lost.
		silence = 22 * time.Second
	)
	var (
		mu      sync.Mutex
		results []silentResult
		wg      sync.WaitGroup
	)
	start := time.Now()
	var restoredAt time.Time // written before returned closes, read after
	go func() {
		time.Sleep(cutAt)
		laptop.ns.Cut()
		t.Logf("%s: laptop silent", time.Since(start).Round(time.Millisecond))
	}()
	// When the node returns, watch for its worker to be ready again while
	// the load goes on.
	var readyAfter time.Duration
	var before, back fleet.WorkerView
	returned := make(chan struct{})
	laptopWorker := func() fleet.WorkerView {
		for _, w := range workersJSON(t, data) {
			if w.Name() == "laptop/qwen3-4b" {
				return w
			}
		}
		return fleet.WorkerView{}
	}
	go func() {
		defer close(returned)
		time.Sleep(cutAt + silence)
		before = laptopWorker()
		laptop.ns.Restore()
		restoredAt = time.Now()
		t.Logf("%s: laptop back", time.Since(start).Round(time.Millisecond))
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if back = laptopWorker(); back.State == fleet.WorkerReady {
				readyAfter = time.Since(restoredAt)
				return
			}
		}
	}()
	tick := time.NewTicker(time.Second / rate)
	for i := 0; time.Since(start) < duration; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := silentReq(client, base, i)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}()
		<-tick.C
	}
	tick.Stop()
	<-returned
	wg.Wait()
	if before.State == fleet.WorkerReady {
		t.Errorf("the laptop's worker was still ready after %s of silence: %+v", silence, before)
	}
	if readyAfter == 0 {
		t.Fatalf("the laptop's worker was not ready within 60 s of the node's return: state %s, %s", back.State, back.Reason)
	}
	w := back

	var lat []time.Duration
	failed := 0
	for _, r := range results {
		lat = append(lat, r.took)
		if r.err != nil {
			failed++
			t.Errorf("request %d (sent at %s) failed after %s: %v", r.i, r.sent.Sub(start).Round(time.Millisecond), r.took.Round(time.Millisecond), r.err)
		}
	}
	slices.Sort(lat)
	p95 := lat[len(lat)*95/100]
	within1s := 0
	for _, d := range lat {
		if d <= time.Second {
			within1s++
		}
	}
	t.Logf("silent drop of 1 of 2 nodes for %s, round robin, %d requests at %d/s: %d succeeded, %.1f%% within 1 s, p50 %s, p95 %s, max %s; laptop worker ready %s after the node returned",
		silence, len(lat), rate, len(lat)-failed, 100*float64(within1s)/float64(len(lat)), lat[len(lat)/2].Round(time.Millisecond), p95.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), readyAfter.Round(time.Millisecond))
	if worst := lat[len(lat)-1]; worst > 12*time.Second {
		t.Errorf("slowest request took %s; want none over 12 s", worst)
	}
	if readyAfter > 30*time.Second {
		t.Errorf("the returned node's worker was ready only %s after it answered again", readyAfter)
	}
	if w.PID == 0 {
		t.Errorf("worker %+v", w)
	}
	if evs := eventsJSON(t, data, "laptop/qwen3-4b"); !containsEvent(evs, "no answer to 3 keepalives in 15s") {
		t.Errorf("no event of the laptop's worker says why it left: %+v", evs)
	}
	_ = desk
}

type silentResult struct {
	i    int
	sent time.Time
	took time.Duration
	err  error
}

// silentReq sends one non-streamed chat completion (its first byte comes
// with its last, so the router may still send it elsewhere until it is
// done) and checks that a real answer came back.
func silentReq(client *http.Client, base string, i int) silentResult {
	r := silentResult{i: i, sent: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"model":"qwen3-4b","max_tokens":8,"messages":[{"role":"user","content":"request %d"}]}`, i)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		r.took, r.err = time.Since(r.sent), err
		return r
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.took = time.Since(r.sent)
	var answer struct {
		Choices []json.RawMessage `json:"choices"`
	}
	switch {
	case err != nil:
		r.err = err
	case resp.StatusCode != http.StatusOK:
		r.err = fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	case json.Unmarshal(raw, &answer) != nil || len(answer.Choices) == 0:
		r.err = fmt.Errorf("not an answer: %s", raw)
	}
	return r
}
