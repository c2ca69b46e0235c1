// Command fakeengine is a small real inference-engine stand-in for the
// enginectl tests (and for nodes' tests): it takes a real engine's argv,
// honours --port/--host/--served-model-name/-a, ignores every other engine
// flag, and serves /health, /v1/models, /metrics (vLLM names), /slots and
// /props (llama-server shapes). Test-only flags shape its behaviour:
//
//	--load-time D     answer /health with 503 for D after listening
//	--listen-after D  do not listen until D has passed (vLLM-style loading)
//	--no-listen       never listen (alive, but not serving)
//	--exit-after D    exit with status 3 after D (a crash)
//	--ignore-term     ignore SIGTERM (so only KILL stops it)
//	--child           start a child process in the same group (vLLM workers)
//	--running N, --waiting N, --kv F, --slots N  figures for /metrics and /slots
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	host, port, served        string
	loadTime, listenAfter     time.Duration
	exitAfter                 time.Duration
	noListen, ignoreTerm, kid bool
	running, waiting, slots   int
	kv                        float64
}

func parse(args []string) config {
	c := config{host: "127.0.0.1", port: "8000", served: "fake", slots: 4}
	val := func(i int, a string) (string, int) {
		if _, v, ok := strings.Cut(a, "="); ok {
			return v, i
		}
		if i+1 < len(args) {
			return args[i+1], i + 1
		}
		return "", i
	}
	dur := func(s string) time.Duration { d, _ := time.ParseDuration(s); return d }
	num := func(s string) int { n, _ := strconv.Atoi(s); return n }
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, _ := strings.Cut(a, "=")
		var v string
		switch name {
		case "--port":
			v, i = val(i, a)
			c.port = v
		case "--host":
			v, i = val(i, a)
			c.host = v
		case "--served-model-name", "-a", "--alias":
			v, i = val(i, a)
			c.served = v
		case "--load-time":
			v, i = val(i, a)
			c.loadTime = dur(v)
		case "--listen-after":
			v, i = val(i, a)
			c.listenAfter = dur(v)
		case "--exit-after":
			v, i = val(i, a)
			c.exitAfter = dur(v)
		case "--running":
			v, i = val(i, a)
			c.running = num(v)
		case "--waiting":
			v, i = val(i, a)
			c.waiting = num(v)
		case "--slots":
			v, i = val(i, a)
			c.slots = num(v)
		case "--kv":
			v, i = val(i, a)
			c.kv, _ = strconv.ParseFloat(v, 64)
		case "--no-listen":
			c.noListen = true
		case "--ignore-term":
			c.ignoreTerm = true
		case "--child":
			c.kid = true
		}
	}
	return c
}

func main() {
	c := parse(os.Args[1:])
	fmt.Printf("fakeengine pid %d args %q\n", os.Getpid(), os.Args[1:])
	fmt.Printf("FAKE_ENGINE_NOTE=%q\n", os.Getenv("FAKE_ENGINE_NOTE"))
	sigs := make(chan os.Signal, 1)
	if c.ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	}
	if c.kid {
		child := exec.Command("sleep", "3600")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		fmt.Printf("child pid %d\n", child.Process.Pid)
	}
	if c.exitAfter > 0 {
		time.AfterFunc(c.exitAfter, func() {
			fmt.Fprintln(os.Stderr, "fakeengine: simulated crash")
			os.Exit(3)
		})
	}
	if c.noListen {
		<-sigs
		return
	}
	time.Sleep(c.listenAfter)
	ln, err := net.Listen("tcp", net.JoinHostPort(c.host, c.port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeengine: cannot listen:", err)
		os.Exit(1)
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	readyAt := time.Now().Add(c.loadTime)
	srv := &http.Server{Handler: handler(c, readyAt)}
	go func() { _ = srv.Serve(ln) }()
	<-sigs
	fmt.Println("fakeengine: TERM, shutting down")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

func handler(c config, readyAt time.Time) http.Handler {
	mux := http.NewServeMux()
	writeJSON := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if time.Now().Before(readyAt) {
			writeJSON(w, 503, map[string]any{"error": map[string]any{"code": 503, "message": "Loading model", "type": "unavailable_error"}})
			return
		}
		writeJSON(w, 200, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"object": "list", "data": []any{map[string]any{"id": c.served, "object": "model", "owned_by": "fake"}}})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n")
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\n")
		fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\",model_name=\"%s\"} %d.0\n", c.served, c.running)
		fmt.Fprintf(w, "vllm:num_requests_waiting{engine=\"0\",model_name=\"%s\"} %d.0\n", c.served, c.waiting)
		fmt.Fprintf(w, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"%s\"} %g\n", c.served, c.kv)
	})
	mux.HandleFunc("GET /slots", func(w http.ResponseWriter, r *http.Request) {
		var slots []any
		for i := range c.slots {
			slots = append(slots, map[string]any{"id": i, "n_ctx": 4096, "is_processing": i < c.running})
		}
		writeJSON(w, 200, slots)
	})
	mux.HandleFunc("GET /props", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"total_slots": c.slots, "default_generation_settings": map[string]any{"n_ctx": 4096}})
	})
	return mux
}
