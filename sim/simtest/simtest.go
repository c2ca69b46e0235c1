// Package simtest runs the simulated engine in-process for other packages'
// tests: parsed from the argv `fleet sim` takes, ready at once.
package simtest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"fleet/sim"
)

// Handler parses args exactly as `fleet sim` would and returns the engine's
// HTTP handler, loaded and warm at once (no load time, no cold start), and
// the options it runs with.
func Handler(t testing.TB, args ...string) (http.Handler, sim.Options) {
	t.Helper()
	opts, err := sim.ParseArgs(args)
	if err != nil {
		t.Fatalf("sim args %q: %v", args, err)
	}
	opts.LoadTime, opts.ColdStart = 0, 0
	s, err := sim.NewServer(opts)
	if err != nil {
		t.Fatalf("sim server for %q: %v", args, err)
	}
	return s.Handler(), opts
}

// Start serves the engine on a loopback port until the test ends.
func Start(t testing.TB, args ...string) *httptest.Server {
	t.Helper()
	h, _ := Handler(t, args...)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
