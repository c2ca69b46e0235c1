package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// inFlight reads the router's in-flight gauge for backend from /metrics.
func inFlight(t *testing.T, base, backend string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `fleet_router_in_flight{backend="`+backend+`"} `) {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			return int(v)
		}
	}
	return 0
}

// `fleet shape` talks to the workers directly, around the router; the
// router still counts those requests as the workers' load, so its
// scheduler does not fill the slots they take.
func TestShapeRequestsAreRouterLoad(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	h := startHub(t, data, freePort(t))
	base := "http://" + h.http
	waitReady(t, data, 3, 120*time.Second)

	cmd := exec.Command(fleetBin, "--data", data, "shape", "ultra", "max")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	seen := 0
	for running := true; running; {
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("fleet shape ultra max: %v\n%s", err, out.String())
			}
			running = false
		case <-time.After(20 * time.Millisecond):
			seen = max(seen, inFlight(t, base, "ultra/qwen3-4b"))
		}
	}
	if seen == 0 {
		t.Errorf("the router never counted the shape requests on ultra as in flight")
	}
	if n := inFlight(t, base, "ultra/qwen3-4b"); n != 0 {
		t.Errorf("after the shape check the router still counts %d in flight on ultra", n)
	}
}
