package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads the router's /metrics through the Prometheus text parser.
func scrape(t *testing.T, url string) map[string][]map[string]string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v", err)
	}
	out := map[string][]map[string]string{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], labels)
		}
	}
	return out
}

// A client sending many made-up model names must not grow /metrics (and the
// hub's memory) with them: labels come only from known models and workers.
// 20,000 names took the hub from 25 MB to 355 MB before (issue 11); the
// exposition counted here holds the engine metrics and token counters too.
func TestUnknownModelNamesAreNotLabels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*hangGuard)
	defer cancel()
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	r, rsrv := startRouter(t, Options{EngineLoadMaxAge: time.Hour}, b)
	if err := r.ObserveEngineMetrics("ultra", "ultra/qwen3-4b", "llama.cpp", []byte(llamaText), time.Now()); err != nil {
		t.Fatal(err)
	}
	const unique = 20000
	for i := range unique {
		resp := post(t, ctx, rsrv.URL, fmt.Sprintf(`{"model":"made-up-%d"}`, i))
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("made-up model answered %d, want 404", resp.StatusCode)
		}
	}
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3"}`)
	resp.Body.Close()

	series := 0
	known := []string{"qwen3-4b", "idle-model", unknownModel, ""}
	for fam, ms := range scrape(t, rsrv.URL) {
		for _, labels := range ms {
			series++
			if v, ok := labels["model"]; ok && !slices.Contains(known, v) {
				t.Fatalf("%s has a series for model %q, which no fleet model or worker has", fam, v)
			}
			if v, ok := labels["backend"]; ok && v != "" && v != "ultra/qwen3-4b" {
				t.Fatalf("%s has a series for backend %q, which is not a worker", fam, v)
			}
		}
	}
	if series > 100 {
		t.Errorf("/metrics has %d series after %d unknown names; it should not grow with them", series, unique)
	}
	var folded bool
	for _, labels := range scrape(t, rsrv.URL)["fleet_router_requests_total"] {
		if labels["model"] == unknownModel && labels["status"] == "404" {
			folded = true
		}
	}
	if !folded {
		t.Errorf("the unknown names were not counted under model=%q", unknownModel)
	}
}

// serveReal runs the router behind NewServer, the http.Server the hub uses,
// on a loopback port.
func serveReal(t *testing.T, r *Router) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer("", r.Handler())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A client that sends its headers and then trickles the body a byte at a
// time is answered 408 and cut off, instead of holding the connection for
// as long as it keeps trickling.
func TestSlowBodyIsCutOff(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	r, _ := startRouter(t, Options{BodyTimeout: 500 * time.Millisecond}, b)
	addr := serveReal(t, r)
	const clients, bodyLen = 10, 100
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(4 * hangGuard))
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bodyLen)
			var sent atomic.Int32
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				// One byte every 100 ms: the whole body would take 10 s.
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for range bodyLen {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if _, err := conn.Write([]byte{' '}); err != nil {
						return
					}
					sent.Add(1)
				}
			}()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Errorf("reading the answer: %v", err)
				return
			}
			n := sent.Load()
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Errorf("slow body answered %d after %d of %d bytes, want 408: %s", resp.StatusCode, n, bodyLen, body)
				return
			}
			if n >= bodyLen {
				t.Errorf("the 408 came only after the whole body (%d bytes) was sent", n)
			}
			if !strings.Contains(string(body), "did not arrive within 500ms") {
				t.Errorf("the 408 does not say what went wrong: %s", body)
			}
			// The server hangs up: the connection is not kept for more.
			if _, err := conn.Read(make([]byte, 1)); err == nil {
				t.Errorf("the connection stayed open after the 408")
			}
		}()
	}
	wg.Wait()
}

// The body deadline ends with the body: an answer that streams for longer
// than BodyTimeout is delivered whole.
func TestBodyDeadlineSparesLongAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*hangGuard)
	defer cancel()
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 8 {
			fmt.Fprint(w, sseEvent(fmt.Sprint(i)))
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	r, _ := startRouter(t, Options{BodyTimeout: 200 * time.Millisecond}, b)
	addr := serveReal(t, r)
	for range 2 { // twice on one keep-alive connection
		resp := post(t, ctx, "http://"+addr, `{"model":"qwen3-4b","stream":true}`)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
			t.Fatalf("long answer cut short: status %d, err %v, body %q", resp.StatusCode, err, body)
		}
	}
}
