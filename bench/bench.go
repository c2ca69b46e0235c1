// Package bench talks to one worker (or a model through the router) as a
// client does: bench/shape reduces its responses to their shape and diffs
// two of them, bench/sweep measures speed under a closed-loop concurrency
// sweep. This package holds what both need: the Target and an HTTP client
// that records the raw bytes of each response next to what a client
// library made of them.
package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Target is one OpenAI-compatible endpoint to talk to.
type Target struct {
	// Name is how reports call it ("ultra", "rig/qwen3-4b").
	Name string `json:"name"`
	// BaseURL ends in /v1, e.g. http://127.0.0.1:18001/v1.
	BaseURL string `json:"base_url"`
	// Model is the name sent in requests.
	Model string `json:"model"`
	// APIKey is sent as a bearer token when set (a router with keys).
	APIKey string `json:"-"`
	// HTTPClient may carry an SSH-tunnel DialContext; nil means a plain client.
	HTTPClient *http.Client `json:"-"`
}

// Validate says what is wrong with a target before anything is sent.
func (t Target) Validate() error {
	if strings.TrimSpace(t.Model) == "" {
		return fmt.Errorf("target %q has no model name: set the model ID the worker serves", t.Name)
	}
	u, err := url.Parse(t.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("target %q has base URL %q, which is not an http(s) URL: use e.g. http://127.0.0.1:8080/v1", t.Name, t.BaseURL)
	}
	return nil
}

// Label is the target's name, or its URL when it has none.
func (t Target) Label() string {
	if t.Name != "" {
		return t.Name
	}
	return t.BaseURL
}

// ChatURL is the chat completions endpoint of the target.
func (t Target) ChatURL() string {
	return strings.TrimRight(t.BaseURL, "/") + "/chat/completions"
}

// Client returns the target's HTTP client, or a default one.
func (t Target) Client() *http.Client {
	if t.HTTPClient != nil {
		return t.HTTPClient
	}
	return &http.Client{}
}

// Capture collects the raw response of one request made with a
// RecordingClient: the status and every byte of the body the client read.
type Capture struct {
	mu     sync.Mutex
	status int
	body   bytes.Buffer
}

// Status is the HTTP status of the captured response (0 if none came).
func (c *Capture) Status() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Body is a copy of the bytes read so far.
func (c *Capture) Body() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.body.Bytes())
}

func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.body.Write(p)
}

type captureKey struct{}

// WithCapture returns a context whose requests, made through a
// RecordingClient, copy their response into c.
func WithCapture(ctx context.Context, c *Capture) context.Context {
	return context.WithValue(ctx, captureKey{}, c)
}

// RecordingClient wraps the target's client so that a request whose context
// carries a Capture tees its response body into it. A client library reads
// the same bytes it always would; the capture shows what it did not surface.
func (t Target) RecordingClient() *http.Client {
	base := t.Client()
	c := *base
	next := base.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c.Transport = recordingTransport{next: next}
	return &c
}

type recordingTransport struct{ next http.RoundTripper }

func (rt recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if c, ok := req.Context().Value(captureKey{}).(*Capture); ok {
		c.mu.Lock()
		c.status = resp.StatusCode
		c.mu.Unlock()
		resp.Body = teeBody{Reader: io.TeeReader(resp.Body, c), Closer: resp.Body}
	}
	return resp, nil
}

type teeBody struct {
	io.Reader
	io.Closer
}
