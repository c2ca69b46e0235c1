package router

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countedEngine is an engine that counts the connections it accepted and
// answers every request with h.
func countedEngine(t *testing.T, h http.HandlerFunc) (addr string, conns *atomic.Int64) {
	t.Helper()
	conns = &atomic.Int64{}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), conns
}

func engineRequest(ctx context.Context, t *testing.T, addr string) *http.Request {
	t.Helper()
	body := `{"model":"m"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func dialTCP(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// TestEngineConnectionKeptOnlyAfterAWholeAnswer: a connection serves the
// next request only when the answer before was read to its end and neither
// side asked to close it; an answer left half read closes it (the rest of
// a stream is not worth reading), whatever the engine would send.
func TestEngineConnectionKeptOnlyAfterAWholeAnswer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handler   http.HandlerFunc
		readWhole bool
		wantConns int64
	}{
		{"read whole", okJSON, true, 1},
		{"stream read whole", tokenStream0, true, 1},
		{"closed half read", tokenStream0, false, 3},
		{"engine says close", func(w http.ResponseWriter, req *http.Request) {
			w.Header().Set("Connection", "close")
			okJSON(w, req)
		}, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			addr, conns := countedEngine(t, tc.handler)
			tr := newEngineTransport(addr, 4, dialTCP)
			defer tr.CloseIdleConnections()
			for i := range 3 {
				resp, err := tr.RoundTrip(engineRequest(ctx, t, addr))
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if tc.readWhole {
					if _, err := io.Copy(io.Discard, resp.Body); err != nil {
						t.Fatalf("request %d: reading the answer: %v", i, err)
					}
				} else if _, err := resp.Body.Read(make([]byte, 16)); err != nil {
					t.Fatalf("request %d: reading the answer's start: %v", i, err)
				}
				resp.Body.Close()
				if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
					t.Fatalf("request %d: a closed body still reads", i)
				}
			}
			if got := conns.Load(); got != tc.wantConns {
				t.Errorf("the engine saw %d connections for 3 requests, want %d", got, tc.wantConns)
			}
		})
	}
}

// tokenStream0 streams 128 tokens with no gap.
func tokenStream0(w http.ResponseWriter, req *http.Request) { streamTokens(w, req, 0) }

// TestEngineConnectionsCappedAndHandedOn: at the cap, a request waits for a
// connection and takes the one the request before gave back, and a request
// whose context ends while it waits gives up with the context's cause.
func TestEngineConnectionsCappedAndHandedOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	release := make(chan struct{})
	addr, conns := countedEngine(t, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Query().Has("hold") {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release
		}
		okJSON(w, req)
	})
	tr := newEngineTransport(addr, 1, dialTCP)
	defer tr.CloseIdleConnections()
	held := engineRequest(ctx, t, addr)
	held.URL.RawQuery = "hold"
	first, err := tr.RoundTrip(held)
	if err != nil {
		t.Fatal(err)
	}

	// A second request has no connection to take until the first ends.
	short, stop := context.WithCancelCause(ctx)
	why := errors.New("the client left")
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := tr.RoundTrip(engineRequest(short, t, addr))
		if !errors.Is(err, why) {
			t.Errorf("a request given up while it waited: %v, want the context's cause", err)
		}
	})
	time.Sleep(50 * time.Millisecond) // only lets it start waiting: the test holds either way
	stop(why)
	wg.Wait()

	got := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(engineRequest(ctx, t, addr))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		got <- err
	}()
	close(release)
	if _, err := io.Copy(io.Discard, first.Body); err != nil {
		t.Fatal(err)
	}
	first.Body.Close()
	if err := <-got; err != nil {
		t.Fatalf("the request that waited: %v", err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the engine saw %d connections with a cap of 1, want 1", n)
	}
}

// TestEngineExchangeEndsWithItsContext: a request whose context ends while
// the engine has not answered returns at once with the context's cause, and
// its connection is not reused; also over a tunnel whose Close does not end
// a blocked read until the node answers (SSH), which a silent node never
// does.
func TestEngineExchangeEndsWithItsContext(t *testing.T) {
	for _, tunnel := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "tunnel"}[tunnel], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			addr, conns := countedEngine(t, func(w http.ResponseWriter, req *http.Request) {
				if req.URL.Query().Has("never") {
					// The server sees the connection close once the body is read.
					_, _ = io.Copy(io.Discard, req.Body)
					<-req.Context().Done()
					return
				}
				okJSON(w, req)
			})
			// The node stays silent until the test says so: a tunnel's
			// Close then reaches it.
			silent := make(chan struct{})
			dial := dialTCP
			if tunnel {
				dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := dialTCP(ctx, network, addr)
					return &silentTunnel{Conn: c, silent: silent}, err
				}
			}
			tr := newEngineTransport(addr, 1, dial)
			defer tr.CloseIdleConnections()
			short, stop := context.WithCancelCause(ctx)
			why := errors.New("taken back by the hedge")
			req := engineRequest(short, t, addr)
			req.URL.RawQuery = "never"
			time.AfterFunc(20*time.Millisecond, func() { stop(why) })
			gaveUp := make(chan error, 1)
			go func() {
				_, err := tr.RoundTrip(req)
				gaveUp <- err
			}()
			select {
			case err := <-gaveUp:
				if !errors.Is(err, why) {
					t.Fatalf("got %v, want the context's cause", err)
				}
			case <-time.After(hangGuard):
				t.Fatalf("a request whose context ended still waited for the engine after %v", hangGuard)
			}
			// With a cap of one connection, the next request gets a new
			// one: the one given up counts as closed even while a silent
			// node keeps the tunnel's read waiting.
			defer close(silent)
			resp, err := tr.RoundTrip(engineRequest(ctx, t, addr))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n := conns.Load(); n != 2 {
				t.Errorf("the engine saw %d connections, want 2: the one given up must not be reused", n)
			}
		})
	}
}

// silentTunnel is a connection whose Close takes effect only once the node
// is no longer silent, as a tunnel through SSH to a silent node.
type silentTunnel struct {
	net.Conn
	silent <-chan struct{}
}

func (c *silentTunnel) Close() error {
	go func() {
		<-c.silent
		c.Conn.Close()
	}()
	return nil
}

// TestRetiredEngineKeepsNoConnection: once its worker left, an answer that
// ends closes its connection instead of keeping it for a request that will
// not come.
func TestRetiredEngineKeepsNoConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	addr, conns := countedEngine(t, tokenStream0)
	tr := newEngineTransport(addr, 2, dialTCP)
	resp, err := tr.RoundTrip(engineRequest(ctx, t, addr))
	if err != nil {
		t.Fatal(err)
	}
	tr.retire()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tr.mu.Lock()
	idle := len(tr.idle)
	tr.mu.Unlock()
	if idle != 0 || len(tr.open) != 0 {
		t.Errorf("a retired engine keeps %d idle of %d open connections, want none", idle, len(tr.open))
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the engine saw %d connections, want 1", n)
	}
}
