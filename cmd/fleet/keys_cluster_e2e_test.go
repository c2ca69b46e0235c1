package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet/internal/pgtest"
	"fleet/router/keylimit"
)

// keyReloadEvery is how often a hub on PostgreSQL rereads the API keys
// whatever it heard (hub.keyReloadInterval): the one path besides NOTIFY
// by which a hub learns of a revoke.
const keyReloadEvery = time.Minute

// TestKeysAcrossThreeHubs: three `fleet serve --require-keys` processes on
// one PostgreSQL database, the demo fleet (issue 20, part 4).
//
// A key made through one hub works on the other two; revoked through
// another, it is refused by the two that were not asked, with no request
// to the hub that revoked it and before either's minute reread of the keys
// could have fired: only fleet_keys' NOTIFY can have told them. How long
// that took is logged.
//
// A key limited to rpm, hit through all three hubs at once by many clients
// for a little over a minute, is admitted at most as one token bucket
// would over that time (a full bucket, refilled at rpm a minute) plus the
// overshoot docs/limits.md states for N hubs, 2(N-1) leash floors; each
// hub admits some of it. So is a key whose clients come to one hub late,
// after its bucket sat full there while the other two spent it.
func TestKeysAcrossThreeHubs(t *testing.T) {
	dbURL := pgtest.URL(t)
	dataA, dataB, dataC := t.TempDir(), t.TempDir(), t.TempDir()
	// A hub that requires keys does not start without one: the first is
	// made in the database before any hub runs.
	if out, code := fleetCmdEnv(t, dataA, []string{"FLEET_DATABASE_URL=" + dbURL}, "key", "create", "boot"); code != 0 {
		t.Fatalf("key create with no hub running: exit %d:\n%s", code, out)
	}
	hubFlags := func(name string) []string {
		return []string{"--database-url", dbURL, "--hub-name", name, "--require-keys"}
	}
	a := startHub(t, dataA, freePort(t), hubFlags("hub-a")...)
	waitReady(t, dataA, 3, 120*time.Second)
	// B's and C's minute reread of the keys fires at some instant of
	// [started, answered] plus whole minutes: started is before either
	// process exists, answered after both answered a command (the reread's
	// timer is made before the hub takes any: hub.Run).
	started := time.Now()
	b := startHub(t, dataB, freePort(t), hubFlags("hub-b")...)
	c := startHub(t, dataC, freePort(t), hubFlags("hub-c")...)
	waitRole(t, dataB, "follower", 60*time.Second)
	waitRole(t, dataC, "follower", 60*time.Second)
	answered := time.Now().Add(time.Second) // a second for the goroutine that makes the timer
	for _, data := range []string{dataB, dataC} {
		waitReady(t, data, 3, 120*time.Second)
	}
	hubs := []*hubProc{a, b, c}
	names := []string{"hub-a", "hub-b", "hub-c"}

	t.Run("revoke", func(t *testing.T) {
		out, code := fleetCmd(t, dataB, "key", "create", "ci")
		key := strings.TrimSpace(strings.Split(out, "\n")[0])
		if code != 0 || !strings.HasPrefix(key, "fk-") {
			t.Fatalf("key create on hub-b: exit %d:\n%s", code, out)
		}
		made := time.Now()
		for i, h := range hubs {
			if got := waitModelsStatus(t, h.http, key, http.StatusOK, 30*time.Second); got != http.StatusOK {
				t.Fatalf("the key made on hub-b: %s answers %d, want 200", names[i], got)
			}
		}
		t.Logf("the key made on hub-b works on hub-a, hub-b and hub-c (asked in turn) %s after the command returned", time.Since(made).Round(time.Millisecond))

		// Revoke only where no minute reread of B or C can fall between
		// the revoke and the last refusal.
		from, until := quietSpan(time.Now(), started, answered, keyReloadEvery, 20*time.Second)
		time.Sleep(time.Until(from))
		ctx, cancel := context.WithTimeout(t.Context(), time.Until(until)+5*time.Second)
		defer cancel()
		type refusal struct {
			at     time.Time
			before int // 200s answered before it
			after  int // 200s answered after it: the key came back
			err    error
		}
		results := make([]chan refusal, 2)
		ready := make(chan struct{}, 2)
		for i, h := range []*hubProc{b, c} {
			results[i] = make(chan refusal, 1)
			go func() {
				var r refusal
				for ctx.Err() == nil {
					code, err := modelsStatus(ctx, h.http, key)
					switch {
					case err != nil && ctx.Err() != nil:
					case err != nil:
						r.err = err
					case code == http.StatusOK && r.at.IsZero():
						if r.before++; r.before == 1 {
							ready <- struct{}{}
						}
					case code == http.StatusOK:
						r.after++
					case code == http.StatusUnauthorized && r.at.IsZero():
						r.at = time.Now()
					case code != http.StatusUnauthorized:
						r.err = fmt.Errorf("HTTP %d", code)
					}
					if r.err != nil || (!r.at.IsZero() && time.Since(r.at) > 500*time.Millisecond) {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
				results[i] <- r
			}()
		}
		for range 2 {
			select {
			case <-ready:
			case <-ctx.Done():
				t.Fatal("hub-b or hub-c never took the key before its revoke")
			}
		}
		asked := time.Now()
		if out, code := fleetCmd(t, dataA, "key", "revoke", "ci"); code != 0 {
			t.Fatalf("key revoke on hub-a: exit %d:\n%s", code, out)
		}
		returned := time.Now()
		for i, name := range []string{"hub-b", "hub-c"} {
			r := <-results[i]
			switch {
			case r.err != nil:
				t.Errorf("%s, polled for the revoked key: %v", name, r.err)
			case r.at.IsZero():
				t.Errorf("%s still takes the key revoked on hub-a %s after the revoke", name, time.Since(returned).Round(time.Millisecond))
			case !r.at.Before(until):
				t.Errorf("%s refused the key revoked on hub-a only %s after the revoke, when its minute reread of the keys may have fired: fleet_keys' notification did not reach it",
					name, r.at.Sub(returned).Round(time.Millisecond))
			default:
				// The hubs hear of it while the command is still exiting.
				when := fmt.Sprintf("%s after", r.at.Sub(returned).Round(time.Millisecond))
				if r.at.Before(returned) {
					when = fmt.Sprintf("%s before", returned.Sub(r.at).Round(time.Millisecond))
				}
				t.Logf("%s refused the key revoked on hub-a %s the revoke command returned (%s after it began; %d requests answered 200 before, none of them to hub-a)",
					name, when, r.at.Sub(asked).Round(time.Millisecond), r.before)
			}
			if r.after > 0 {
				t.Errorf("%s took the revoked key %d times after refusing it", name, r.after)
			}
		}
		if got := waitModelsStatus(t, a.http, key, http.StatusUnauthorized, 5*time.Second); got != http.StatusUnauthorized {
			t.Errorf("hub-a answers %d to the key it revoked, want 401", got)
		}
	})

	t.Run("rpm", func(t *testing.T) {
		// All three at once for a little over a minute.
		k := keyHit{hubs: hubs, names: names, rpm: 240, idle: 2 * time.Second, join: []time.Duration{0, 0, 0}, hitFor: 65 * time.Second}
		k.run(t, k.makeKey(t, dataC, dataA, "burst"))
	})

	t.Run("late-hub", func(t *testing.T) {
		// hub-c's clients come 8 s after hub-a's and hub-b's, its bucket
		// having sat full, unused, for 15 s before those began: as when
		// clients move to another hub (a virtual IP that moves).
		k := keyHit{hubs: hubs, names: names, rpm: 240, idle: 15 * time.Second, join: []time.Duration{0, 0, 8 * time.Second}, hitFor: 16 * time.Second}
		k.run(t, k.makeKey(t, dataA, dataB, "late"))
	})
}

// keyHit is a key limited to rpm hit through hubs: after each hub was
// asked once (until it holds the limit) and then no hub for idle, hub i's
// clientsPerHub clients each send one request after another from join[i]
// to hitFor, without cutting any short (one a client left could have been
// admitted uncounted).
type keyHit struct {
	hubs   []*hubProc
	names  []string
	rpm    int
	idle   time.Duration
	join   []time.Duration
	hitFor time.Duration
}

const clientsPerHub = 3

// makeKey creates a key on the hub on data, limits it on the hub on
// limitOn, and returns it.
func (k keyHit) makeKey(t *testing.T, data, limitOn, name string) string {
	t.Helper()
	out, code := fleetCmd(t, data, "key", "create", name)
	key := strings.TrimSpace(strings.Split(out, "\n")[0])
	if code != 0 || !strings.HasPrefix(key, "fk-") {
		t.Fatalf("key create on %s: exit %d:\n%s", data, code, out)
	}
	if out, code := fleetCmd(t, limitOn, "key", "limit", name, "--rpm", fmt.Sprint(k.rpm)); code != 0 {
		t.Fatalf("key limit on %s: exit %d:\n%s", limitOn, code, out)
	}
	return key
}

// run hits key and checks what the hubs admitted together: at most a
// token bucket's worth over the hit (the full bucket, as the idle time
// refilled what the probes took many times over, and rpm a minute after)
// plus the overshoot docs/limits.md states for N hubs, 2(N-1) leash
// floors; at least the full bucket; and each hub admitted some and
// refused some.
func (k keyHit) run(t *testing.T, key string) {
	t.Helper()
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clientsPerHub}}
	defer client.CloseIdleConnections()
	asked := time.Now()
	for i, h := range k.hubs {
		for {
			code, hdr, body := limitedChat(t.Context(), client, h.http, key)
			if hdr.Get("x-ratelimit-limit-requests") == fmt.Sprint(k.rpm) {
				break
			}
			if time.Since(asked) > 30*time.Second {
				t.Fatalf("%s does not hold the limit set after 30 s: HTTP %d %v %s", k.names[i], code, hdr, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(k.idle)

	var mu sync.Mutex
	admitted, limited := make([]int, len(k.hubs)), make([]int, len(k.hubs))
	var leashed, spent int
	var failed []string
	count := func(i, code int, body string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case code == http.StatusOK:
			admitted[i]++
		case code == http.StatusTooManyRequests && strings.Contains(body, `"rate_limit_exceeded"`):
			limited[i]++
			if strings.Contains(body, "hubs on this database") {
				leashed++
			} else {
				spent++
			}
		default:
			failed = append(failed, fmt.Sprintf("%s: HTTP %d %s", k.names[i], code, body))
		}
	}
	begin := time.Now()
	end := begin.Add(k.hitFor)
	var wg sync.WaitGroup
	for i, h := range k.hubs {
		for range clientsPerHub {
			wg.Go(func() {
				time.Sleep(time.Until(begin.Add(k.join[i])))
				for time.Now().Before(end) {
					code, _, body := limitedChat(t.Context(), client, h.http, key)
					count(i, code, body)
					if code != http.StatusOK {
						// Refused: ask again soon, not in a spin.
						time.Sleep(100 * time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()
	took := time.Since(begin)
	total := 0
	for _, n := range admitted {
		total += n
	}
	n := len(k.hubs)
	overshoot := 2 * (n - 1) * int(keylimit.LeashFloor(k.rpm, n-1))
	refilled := int(math.Ceil(float64(k.rpm) * took.Seconds() / 60))
	bound := k.rpm + refilled + overshoot
	t.Logf("%d hubs hit for %s (joining at %v) admitted %d requests of a key limited to %d a minute (bound %d: a bucket's %d + %d refilled + overshoot %d); per hub %v admitted, %v refused (%d by a hub's share, %d by the spent minute)",
		n, took.Round(time.Millisecond), k.join, total, k.rpm, bound, k.rpm, refilled, overshoot, admitted, limited, leashed, spent)
	if total > bound {
		t.Errorf("%d requests admitted over %s, more than rpm %d allows over that time plus the stated overshoot of %d hubs: %d", total, took.Round(time.Millisecond), k.rpm, n, bound)
	}
	if total < k.rpm {
		t.Errorf("%d requests admitted over %s, fewer than the %d a full bucket holds", total, took.Round(time.Millisecond), k.rpm)
	}
	for i, a := range admitted {
		if a == 0 || limited[i] == 0 {
			t.Errorf("%s admitted %d and refused %d: every hub must serve the key and be held", k.names[i], a, limited[i])
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d answers neither 200 nor the key's 429, e.g. %s", len(failed), failed[0])
	}
}

// quietSpan is the first span of at least least, from now on, in which a
// timer that fires at some instant of [lo, hi] plus each whole multiple of
// every cannot fire.
func quietSpan(now, lo, hi time.Time, every, least time.Duration) (from, until time.Time) {
	from = now
	for k := time.Duration(1); ; k++ {
		next := lo.Add(k * every)
		if next.Sub(from) >= least {
			return from, next
		}
		if after := hi.Add(k * every); from.Before(after) {
			from = after
		}
	}
}

// fleetCmdEnv is fleetCmd with extra environment variables.
func fleetCmdEnv(t *testing.T, data string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(fleetBin, append([]string{"--data", data}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// modelsStatus is the status of GET /v1/models on addr with key: it checks
// the key and nothing else (no limit, no engine).
func modelsStatus(ctx context.Context, addr, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// waitModelsStatus asks GET /v1/models on addr with key until it answers
// want, and returns the last status.
func waitModelsStatus(t *testing.T, addr, key string, want int, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, err := modelsStatus(t.Context(), addr, key)
		if err != nil {
			t.Fatalf("GET /v1/models on %s: %v", addr, err)
		}
		if code == want || time.Now().After(deadline) {
			return code
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// limitedChat sends a one-token chat completion with key to addr and
// returns its status (0 when it got no answer), headers and body.
func limitedChat(ctx context.Context, client *http.Client, addr, key string) (int, http.Header, string) {
	body := `{"model":"qwen3-4b","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, nil, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) != nil {
		return resp.StatusCode, resp.Header, "not JSON: " + string(b)
	}
	return resp.StatusCode, resp.Header, string(b)
}
