package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"

	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fleet/internal/testbin"
)

const smallBody = `{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`

// benchTargets starts an in-process backend, a bare httputil.ReverseProxy
// in front of it, and the router in front of it, all on loopback sockets.
// reasoningMode is the model's normalisation setting ("" for off).
func benchTargets(b *testing.B, backend http.HandlerFunc, slots int, reasoningMode string) (direct, proxy, routed string) {
	b.Helper()
	be := httptest.NewServer(backend)
	b.Cleanup(be.Close)
	return proxyTargets(b, be.URL, slots, reasoningMode)
}

// proxyTargets puts a bare httputil.ReverseProxy and the router in front of
// the backend at base.
func proxyTargets(b *testing.B, base string, slots int, reasoningMode string) (direct, proxy, routed string) {
	b.Helper()
	u, _ := url.Parse(base)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	// As many idle connections as the router keeps, so that both reuse them.
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	// The request is read whole first, as the router and llama-swap read
	// it to route: an inbound body still being copied when the engine's
	// headers are written back is closed under the transport, which cuts
	// the upstream connection (golang/go#40747; the instant sim answers
	// that fast).
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, req)
	}))
	b.Cleanup(ps.Close)
	r := mustNew(b, Options{})
	models := testModels()
	models[0].Reasoning = reasoningMode
	if err := r.SetModels(models); err != nil {
		b.Fatal(err)
	}
	r.SetBackends([]Backend{{Name: "bench/qwen3-4b", Model: "qwen3-4b", Addr: u.Host, Context: 16384, Slots: slots}})
	rs := httptest.NewServer(r.Handler())
	b.Cleanup(rs.Close)
	return base, ps.URL, rs.URL
}

// simEngine starts `fleet sim --profile instant` as its own process: an
// engine that never waits and, as llama-server and vLLM do, writes and
// flushes each SSE event on its own. It returns the engine's base URL and
// its process.
func simEngine(b *testing.B, slots int) (string, *os.Process) {
	b.Helper()
	dir := b.TempDir()
	bin, err := testbin.Build(dir, "fleet", "fleet/cmd/fleet")
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "sim", "--profile", "instant", "--load-time", "0", "--port", "0",
		"--served-name", "qwen3-4b", "--slots", strconv.Itoa(slots))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// The sim logs one line with its address when it is ready.
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), " addr="); ok {
			addr, _, _ := strings.Cut(rest, " ")
			go func() { _, _ = io.Copy(os.Stderr, stderr) }()
			return "http://" + addr, cmd.Process
		}
	}
	b.Fatalf("fleet sim ended before it was ready: %v", sc.Err())
	return "", nil
}

// processCPU is the user and system CPU time process p has used, from
// /proc (in the kernel's ticks, 10 ms here: sum it over many streams), or
// -1 where there is none.
func processCPU(p *os.Process) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return -1
	}
	// The fields after the command name, which is in parentheses.
	_, rest, _ := bytes.Cut(raw, []byte(") "))
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return -1
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const tick = 10 * time.Millisecond // USER_HZ, 100 on Linux
	return time.Duration(utime+stime) * tick
}

func benchClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}}
}

func roundTrip(b *testing.B, c *http.Client, base, body string) time.Duration {
	start := time.Now()
	if err := post1(c, base, body); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// post1 sends one request and reads its answer whole.
func post1(c *http.Client, base, body string) error {
	resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func pctl(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// BenchmarkOverheadSmall sends a small non-streamed request one at a time,
// interleaving direct, bare reverse proxy and router so that noise on the
// shared machine hits all three alike, and reports what each proxy adds.
func BenchmarkOverheadSmall(b *testing.B) {
	direct, proxy, routed := benchTargets(b, okJSON, 4, "")
	c := benchClient(4)
	for _, base := range []string{direct, proxy, routed} {
		for range 200 { // warm connections and caches
			roundTrip(b, c, base, smallBody)
		}
	}
	var d, p, r []time.Duration
	b.ResetTimer()
	for b.Loop() {
		d = append(d, roundTrip(b, c, direct, smallBody))
		p = append(p, roundTrip(b, c, proxy, smallBody))
		r = append(r, roundTrip(b, c, routed, smallBody))
	}
	b.StopTimer()
	us := func(x time.Duration) float64 { return float64(x) / float64(time.Microsecond) }
	proxyAdd50, proxyAdd99 := pctl(p, .5)-pctl(d, .5), pctl(p, .99)-pctl(d, .99)
	routerAdd50, routerAdd99 := pctl(r, .5)-pctl(d, .5), pctl(r, .99)-pctl(d, .99)
	b.ReportMetric(us(pctl(d, .5)), "direct-p50-µs")
	b.ReportMetric(us(proxyAdd50), "proxy-added-p50-µs")
	b.ReportMetric(us(proxyAdd99), "proxy-added-p99-µs")
	b.ReportMetric(us(routerAdd50), "router-added-p50-µs")
	b.ReportMetric(us(routerAdd99), "router-added-p99-µs")
	if proxyAdd50 > 0 {
		b.ReportMetric(float64(routerAdd50)/float64(proxyAdd50), "router/proxy-p50")
	}
}

// BenchmarkAllocs reports allocations per small request, direct and through
// the router; the difference is what the router allocates (client and
// backend allocations are in both). router-inline normalises the answer.
func BenchmarkAllocs(b *testing.B) {
	direct, _, routed := benchTargets(b, okJSON, 4, "")
	_, _, inline := benchTargets(b, okJSON, 4, "inline")
	for _, tc := range []struct{ name, base string }{{"direct", direct}, {"router", routed}, {"router-inline", inline}} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchClient(1)
			roundTrip(b, c, tc.base, smallBody)
			b.ReportAllocs()
			for b.Loop() {
				roundTrip(b, c, tc.base, smallBody)
			}
		})
	}
}

// tokenStream is a backend that streams 128 tokens 5 ms apart.
func tokenStream(w http.ResponseWriter, req *http.Request) { streamTokens(w, req, 5*time.Millisecond) }

func streamTokens(w http.ResponseWriter, req *http.Request, gap time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	var tick <-chan time.Time
	if gap > 0 {
		t := time.NewTicker(gap)
		defer t.Stop()
		tick = t.C
	}
	for i := range 128 {
		if i > 0 && tick != nil {
			select {
			case <-tick:
			case <-req.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, sseEvent("tok"))
		f.Flush()
	}
	_, _ = io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":128,"total_tokens":131}}`+"\n\ndata: [DONE]\n\n")
	f.Flush()
}

// countingReader counts the reads that returned bytes.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.reads++
	}
	return n, err
}

// streamBody asks for a stream of 128 tokens: the sim follows it,
// tokenStream ignores it.
const streamBody = `{"model":"qwen3-4b","stream":true,"max_tokens":128,"messages":[{"role":"user","content":"hi"}]}`

// streams runs n concurrent streams to completion and returns the events
// received per second.
func streams(b *testing.B, c *http.Client, base string, n int) float64 {
	rate, _ := streamsReads(b, c, base, n, 128)
	return rate
}

// streamsReads runs n concurrent streams, each of which must bring want
// data events with choices, and returns the events received per second and
// the client's reads of the body per stream: events sent together arrive
// in one read.
func streamsReads(b *testing.B, c *http.Client, base string, n, want int) (float64, float64) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	events, reads := 0, 0
	start := time.Now()
	for range n {
		wg.Go(func() {
			k, r, err := stream1(c, base)
			if err != nil {
				b.Errorf("%s: %v", base, err)
				return
			}
			mu.Lock()
			events += k
			reads += r
			mu.Unlock()
		})
	}
	wg.Wait()
	if events != n*want {
		b.Fatalf("got %d events with choices, want %d", events, n*want)
	}
	return float64(events) / time.Since(start).Seconds(), float64(reads) / float64(n)
}

// stream1 reads one stream whole and returns its data events with choices
// and the reads of the body that brought bytes.
func stream1(c *http.Client, base string) (events, reads int, err error) {
	req, _ := http.NewRequestWithContext(context.Background(), "POST", base+"/v1/chat/completions", strings.NewReader(streamBody))
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	cr := &countingReader{r: resp.Body}
	sc := bufio.NewScanner(cr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {\"choices\":[{") {
			events++
		}
	}
	return events, cr.reads, sc.Err()
}

// BenchmarkStreams64 compares token throughput of 64 concurrent streams of
// 128 tokens 5 ms apart, direct and through the router.
func BenchmarkStreams64(b *testing.B) { benchStreams64(b, "") }

// BenchmarkStreams64Inline is BenchmarkStreams64 with the model's streams
// normalised to inline reasoning: every event is decoded and re-encoded.
func BenchmarkStreams64Inline(b *testing.B) { benchStreams64(b, "inline") }

func benchStreams64(b *testing.B, reasoningMode string) {
	const n = 64
	direct, _, routed := benchTargets(b, tokenStream, n, reasoningMode)
	c := benchClient(n)
	streams(b, c, direct, n)
	streams(b, c, routed, n)
	var d, r float64
	b.ResetTimer()
	for b.Loop() {
		d += streams(b, c, direct, n)
		r += streams(b, c, routed, n)
	}
	b.StopTimer()
	b.ReportMetric(d/float64(b.N), "direct-tok/s")
	b.ReportMetric(r/float64(b.N), "router-tok/s")
	b.ReportMetric(r/d, "router/direct")
}

// BenchmarkStreams64Instant is the throughput case: 64 concurrent streams
// of 128 tokens from `fleet sim --profile instant` in its own process,
// which never waits and writes and flushes each event on its own as
// llama-server and vLLM do; direct, through a bare httputil.ReverseProxy
// and through the router in one run, with the client's reads per stream
// (fewer: events that arrived together left together) and the CPU time per
// stream of this process (client and proxy; the engine is apart).
func BenchmarkStreams64Instant(b *testing.B) {
	const n = 64
	engine, sim := simEngine(b, n)
	direct, proxy, routed := proxyTargets(b, engine, n, "")
	c := benchClient(n)
	// The sim's text is fixed by its seed and the prompt: every stream
	// brings as many events as the first.
	want, _, err := stream1(c, direct)
	if err != nil {
		b.Fatal(err)
	}
	targets := []struct {
		name, base  string
		rate, reads float64
		cpu, engine time.Duration
		sys         syscalls
	}{{name: "direct", base: direct}, {name: "proxy", base: proxy}, {name: "router", base: routed}}
	for _, t := range targets {
		streamsReads(b, c, t.base, n, want)
	}
	b.ResetTimer()
	for b.Loop() {
		for i := range targets {
			t := &targets[i]
			before, sysBefore, engineBefore := cpuTime(b), syscallsNow(), processCPU(sim)
			rate, reads := streamsReads(b, c, t.base, n, want)
			t.rate, t.reads, t.cpu = t.rate+rate, t.reads+reads, t.cpu+cpuTime(b)-before
			t.sys = t.sys.add(syscallsNow().sub(sysBefore))
			t.engine += processCPU(sim) - engineBefore
		}
	}
	b.StopTimer()
	for _, t := range targets {
		per := float64(b.N * n)
		b.ReportMetric(t.rate/float64(b.N), t.name+"-events/s")
		b.ReportMetric(t.reads/float64(b.N), t.name+"-reads/stream")
		// CPU time of this process (client and proxy) per stream: what a
		// proxy costs is the difference to direct, which other load on
		// the machine changes less than the rates.
		b.ReportMetric(float64(t.cpu)/float64(time.Microsecond)/per, t.name+"-cpu-µs/stream")
		// The engine's, which is the same work whoever asks: with the
		// client's and the proxy's, what the 2 cores are shared by.
		if processCPU(sim) >= 0 {
			b.ReportMetric(float64(t.engine)/float64(time.Microsecond)/per, t.name+"-engine-cpu-µs/stream")
		}
		// The read and write system calls of this process per stream,
		// which load does not change much: a proxy's are what it adds to
		// direct's (the client's).
		if t.sys.ok {
			b.ReportMetric(float64(t.sys.r)/per, t.name+"-syscr/stream")
			b.ReportMetric(float64(t.sys.w)/per, t.name+"-syscw/stream")
		}
	}
	b.ReportMetric(targets[1].rate/targets[0].rate, "proxy/direct")
	b.ReportMetric(targets[2].rate/targets[0].rate, "router/direct")
}

// BenchmarkSmallRPS sends small non-streamed requests from 8 clients at
// once, direct, through a bare reverse proxy and through the router in
// turn, and reports the requests per second of each beside direct.
func BenchmarkSmallRPS(b *testing.B) { benchSmallRPS(b, 8, 50) }

// BenchmarkSmallRPS64 is BenchmarkSmallRPS with 64 clients on 64
// connections: where requests contend for the router's locks.
func BenchmarkSmallRPS64(b *testing.B) { benchSmallRPS(b, 64, 10) }

func benchSmallRPS(b *testing.B, clients, each int) {
	direct, proxy, routed := benchTargets(b, okJSON, clients, "")
	c := benchClient(clients)
	rps := func(base string) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for range each {
					if err := post1(c, base, smallBody); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return float64(clients*each) / time.Since(start).Seconds()
	}
	for _, base := range []string{direct, proxy, routed} {
		rps(base)
	}
	var d, p, r float64
	// The CPU time of this process (clients, backend and proxy) per
	// request: what the router costs is its difference to direct's,
	// which other load on the machine changes less than the rates.
	var dCPU, rCPU time.Duration
	b.ResetTimer()
	for b.Loop() {
		before := cpuTime(b)
		d += rps(direct)
		mid := cpuTime(b)
		p += rps(proxy)
		after := cpuTime(b)
		r += rps(routed)
		dCPU, rCPU = dCPU+mid-before, rCPU+cpuTime(b)-after
	}
	b.StopTimer()
	per := float64(b.N*clients*each) * float64(time.Microsecond)
	b.ReportMetric(d/float64(b.N), "direct-req/s")
	b.ReportMetric(r/float64(b.N), "router-req/s")
	b.ReportMetric(p/d, "proxy/direct")
	b.ReportMetric(r/d, "router/direct")
	b.ReportMetric(float64(rCPU-dCPU)/per, "router-added-cpu-µs/req")
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// syscalls counts the read and write system calls of this process, from
// /proc/self/io (ok false where there is none).
type syscalls struct {
	r, w int64
	ok   bool
}

func syscallsNow() syscalls {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return syscalls{}
	}
	s := syscalls{ok: true}
	for line := range strings.SplitSeq(string(raw), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "syscr":
			s.r = n
		case "syscw":
			s.w = n
		}
	}
	return s
}

func (s syscalls) sub(o syscalls) syscalls {
	return syscalls{r: s.r - o.r, w: s.w - o.w, ok: s.ok && o.ok}
}

func (s syscalls) add(o syscalls) syscalls {
	return syscalls{r: s.r + o.r, w: s.w + o.w, ok: o.ok}
}

// oneStream runs one stream of tokenStream and returns the client's time
// to the first token event and mean gap between token events.
func oneStream(b *testing.B, c *http.Client, base string) (ttft, itl time.Duration) {
	start := time.Now()
	resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"qwen3-4b","stream":true}`))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var first, last time.Time
	k := 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {\"choices\":[{") {
			last = time.Now()
			if k == 0 {
				first = last
			}
			k++
		}
	}
	if k != 128 {
		b.Fatalf("got %d token events, want 128", k)
	}
	return first.Sub(start), last.Sub(first) / time.Duration(k-1)
}

// BenchmarkStream1 is one stream of 128 tokens 5 ms apart, direct and
// through the router interleaved: the client's TTFT and ITL, which the
// copy loop must not delay.
func BenchmarkStream1(b *testing.B) {
	direct, _, routed := benchTargets(b, tokenStream, 4, "")
	c := benchClient(1)
	oneStream(b, c, direct)
	oneStream(b, c, routed)
	var dT, rT, dI, rI []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t, i := oneStream(b, c, direct)
		dT, dI = append(dT, t), append(dI, i)
		t, i = oneStream(b, c, routed)
		rT, rI = append(rT, t), append(rI, i)
	}
	b.StopTimer()
	us := func(x time.Duration) float64 { return float64(x) / float64(time.Microsecond) }
	b.ReportMetric(us(pctl(dT, .5)), "direct-ttft-µs")
	b.ReportMetric(us(pctl(rT, .5)), "router-ttft-µs")
	b.ReportMetric(us(pctl(dI, .5)), "direct-itl-µs")
	b.ReportMetric(us(pctl(rI, .5)), "router-itl-µs")
}
