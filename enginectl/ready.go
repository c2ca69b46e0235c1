package enginectl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"fleet"
)

// ErrEngineExited means the engine process ended before it became ready.
var ErrEngineExited = errors.New("engine exited")

// ErrNotOurs means something other than our engine holds its port.
var ErrNotOurs = errors.New("port held by another process")

// ErrPortInUse means the engine exited because it could not bind its port,
// which the check before the launch found free: another process bound it in
// between, or a socket holds it without listening (the local end of a
// connection), which no check of listeners sees.
var ErrPortInUse = errors.New("it could not bind its port")

// bindFailures are what the engines print when their port cannot be bound:
// Go (fleet sim, Ollama) and uvicorn (vLLM) "address already in use",
// llama-server "couldn't bind HTTP server socket".
var bindFailures = []string{"address already in use", "couldn't bind"}

// bindFailed reports whether an engine's last log lines say it could not
// bind its port.
func bindFailed(logTail string) bool {
	lower := strings.ToLower(logTail)
	for _, f := range bindFailures {
		if strings.Contains(lower, f) {
			return true
		}
	}
	return false
}

// WaitReady waits until our engine serves: its PID is alive, it or a member
// of its process group owns the listening socket on port, /health answers
// 200 (503 while the model loads means keep waiting) and /v1/models lists
// p.ServedName. It fails at once, with the log's last lines, when the engine
// dies, and at once when another process holds the port: an answer from a
// stranger must never make a worker ready. Bound it with ctx's deadline.
func WaitReady(ctx context.Context, r Runner, port int, p Process, engine fleet.EngineKind, opts ...Option) error {
	o := applyOptions(opts)
	if p.PID <= 1 {
		return fmt.Errorf("wait ready: PID %d is not an engine process", p.PID)
	}
	pgid := p.PGID
	if pgid == 0 {
		pgid = p.PID
	}
	hc := httpClient(r)
	defer hc.CloseIdleConnections()
	last := "not checked yet"
	for {
		step, err := readyStep(ctx, r, hc, port, p, pgid, engine)
		if err != nil && ctx.Err() != nil {
			// The deadline cut a check short: what we waited for is the news.
			return fmt.Errorf("engine PID %d on port %d not ready (%s): %w", p.PID, port, last, ctx.Err())
		}
		if err != nil {
			return err
		}
		if step == "" {
			o.logger.Info("engine ready", "pid", p.PID, "port", port)
			return nil
		}
		if ctx.Err() != nil {
			// A check the deadline interrupted says nothing about the engine.
			return fmt.Errorf("engine PID %d on port %d not ready (%s): %w", p.PID, port, last, ctx.Err())
		}
		if step != last {
			o.logger.Debug("engine not ready yet", "pid", p.PID, "port", port, "state", step)
			last = step
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine PID %d on port %d not ready (%s): %w", p.PID, port, last, ctx.Err())
		case <-time.After(o.pollInterval):
		}
	}
}

// readyStep checks once; it returns "" when ready, else what it waits for.
func readyStep(ctx context.Context, r Runner, hc *http.Client, port int, p Process, pgid int, engine fleet.EngineKind) (string, error) {
	alive, err := Alive(ctx, r, p.PID)
	if err != nil {
		return "", fmt.Errorf("wait ready: %w", err)
	}
	if !alive {
		return "", exitedError(ctx, r, p)
	}
	ls, err := listeners(ctx, r, port)
	if err != nil {
		return "", fmt.Errorf("wait ready: %w", err)
	}
	ours := false
	for _, l := range ls {
		if l.PID == 0 {
			return "", fmt.Errorf("engine PID %d: port %d is held by a process this account cannot see: %w", p.PID, port, ErrNotOurs)
		}
		if l.PID != p.PID && l.PGID != pgid {
			owner := strconv.Itoa(l.PID)
			if info, ok, _ := readArgv(ctx, r, l.PID); ok {
				owner += " (" + commandLine(ownerOf(l, info)) + ")"
			}
			return "", fmt.Errorf("engine PID %d: port %d is held by PID %s, not by our engine; it must not be taken for ours: %w", p.PID, port, owner, ErrNotOurs)
		}
		ours = true
	}
	if !ours {
		return "waiting for the engine to listen on its port", nil
	}
	healthPath := "/health"
	if engine == fleet.EngineOllama {
		healthPath = "/api/version"
	}
	status, body, err := get(ctx, hc, port, healthPath)
	if err != nil {
		return fmt.Sprintf("GET %s: %v", healthPath, err), nil
	}
	if status != http.StatusOK {
		return fmt.Sprintf("GET %s answered %d %s", healthPath, status, snippet(body)), nil
	}
	status, body, err = get(ctx, hc, port, "/v1/models")
	if err != nil {
		return fmt.Sprintf("GET /v1/models: %v", err), nil
	}
	if status != http.StatusOK {
		return fmt.Sprintf("GET /v1/models answered %d %s", status, snippet(body)), nil
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil {
		return fmt.Sprintf("GET /v1/models: not an OpenAI model list: %v", err), nil
	}
	var ids []string
	for _, m := range models.Data {
		if p.ServedName == "" || m.ID == p.ServedName {
			return "", nil
		}
		ids = append(ids, m.ID)
	}
	return fmt.Sprintf("/v1/models lists %q, not %q yet", ids, p.ServedName), nil
}

func exitedError(ctx context.Context, r Runner, p Process) error {
	tail := ""
	if p.LogPath != "" {
		// The caller's ctx may be the one that is ending; the tail is worth
		// a short extra moment.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if out, err := runScript(tctx, r, "tail", "40", p.LogPath); err == nil && len(out) > 0 {
			tail = "; last lines of " + p.LogPath + ":\n" + strings.TrimRight(string(out), "\n")
		}
	}
	if bindFailed(tail) {
		return fmt.Errorf("engine PID %d exited before it was ready%s: %w: %w", p.PID, tail, ErrEngineExited, ErrPortInUse)
	}
	return fmt.Errorf("engine PID %d exited before it was ready%s: %w", p.PID, tail, ErrEngineExited)
}

// httpClient talks to engines through the Runner, so an engine bound to
// 127.0.0.1 on a remote node is reached through the node's connection.
func httpClient(r Runner) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: r.DialContext, DisableKeepAlives: true},
		Timeout:   10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

func get(ctx context.Context, hc *http.Client, port int, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return resp.StatusCode, nil, err
	}
	return resp.StatusCode, body, nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
