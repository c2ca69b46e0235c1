package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"fleet"
)

// metricsFleet is the demo fleet with llama-server's --metrics, so both
// engines have a /metrics page for the hub to pass on.
const metricsFleet = `nodes:
  - {name: rig, address: "sim:rtx3060-vllm"}
  - {name: ultra, address: "sim:m1ultra-llamacpp"}
  - {name: max, address: "sim:m4max-llamacpp"}
models:
  - id: qwen3-4b
    aliases: [qwen3]
    context: 16384
    memory_gb: 3
    recipes:
      vllm: {model: Qwen/Qwen3-4B-AWQ, args: [--enable-auto-tool-choice, --tool-call-parser, hermes]}
      llamacpp: {model: Qwen3-4B-Q4_K_M.gguf, args: [-ngl, "99", --jinja, --reasoning-format, none, --metrics]}
placements:
  - {model: qwen3-4b, nodes: [rig, ultra, max]}
`

// TestUsageLimitsAndMetricsThroughTheHub runs a hub that requires keys:
// per-key limits set by `fleet key limit` (kept across the restart) answer
// 429 with OpenAI's headers; `fleet usage` counts what each key used;
// /metrics needs a key and serves the hub's, the router's and every
// engine's series, relabelled; every metric the shipped Grafana dashboard
// queries is among them.
func TestUsageLimitsAndMetricsThroughTheHub(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	file := filepath.Join(data, "fleet.yaml")
	if err := os.WriteFile(file, []byte(metricsFleet), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	h := launchHub(t, data, port, "--fleet", file)
	waitReady(t, data, 3, 120*time.Second)
	keys := map[string]string{}
	for _, name := range []string{"ci", "bob"} {
		out, code := fleetCmd(t, data, "key", "create", name)
		keys[name] = strings.TrimSpace(strings.Split(out, "\n")[0])
		if code != 0 || !strings.HasPrefix(keys[name], "fk-") {
			t.Fatalf("key create %s: exit %d: %s", name, code, out)
		}
	}
	if out, code := fleetCmd(t, data, "key", "limit", "ci", "--rpm", "2"); code != 0 {
		t.Fatalf("key limit: exit %d: %s", code, out)
	}
	if out, _ := fleetCmd(t, data, "audit"); !strings.Contains(out, "key limit") {
		t.Errorf("key limit is not in the audit trail:\n%s", out)
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	h.cmd.Wait()
	h = launchHub(t, data, port, "--fleet", file, "--require-keys")
	waitReady(t, data, 3, 120*time.Second)
	if out, _ := fleetCmd(t, data, "key", "list"); !strings.Contains(out, "ci") || !strings.Contains(out, "2") {
		t.Errorf("key list does not show ci's limit:\n%s", out)
	}

	post := func(key, body string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+h.http+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	plain := `{"model":"qwen3-4b","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	stream := `{"model":"qwen3","max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	// ci: two a minute, kept from before the restart; the third is refused.
	for i, body := range []string{plain, stream} {
		if resp, b := post(keys["ci"], body); resp.StatusCode != 200 {
			t.Fatalf("ci's request %d: %d %s", i+1, resp.StatusCode, b)
		}
	}
	resp, b := post(keys["ci"], plain)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("x-ratelimit-limit-requests") != "2" ||
		resp.Header.Get("x-ratelimit-remaining-requests") != "0" || resp.Header.Get("retry-after") == "" {
		t.Fatalf("ci's third request in a minute: %d %v %s; want 429 with the rate-limit headers", resp.StatusCode, resp.Header, b)
	}
	if resp, b := post(keys["bob"], plain); resp.StatusCode != 200 {
		t.Fatalf("bob: %d %s", resp.StatusCode, b)
	}

	out, code := fleetCmd(t, data, "usage", "--by", "key", "--json")
	var got struct {
		Usage []fleet.Usage `json:"usage"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("usage --json: exit %d: %s", code, out)
	}
	byKey := map[string]fleet.Usage{}
	for _, u := range got.Usage {
		byKey[u.Key] = u
	}
	if ci := byKey["ci"]; ci.Requests != 2 || ci.PromptTokens <= 0 || ci.CompletionTokens <= 0 {
		t.Errorf("ci's usage = %+v; want 2 requests with prompt and completion tokens", ci)
	}
	if bob := byKey["bob"]; bob.Requests != 1 || bob.CompletionTokens <= 0 {
		t.Errorf("bob's usage = %+v; want 1 request", bob)
	}
	if out, code := fleetCmd(t, data, "usage", "--by", "worker"); code != 0 || !strings.Contains(out, "/qwen3-4b") || !strings.Contains(out, "COMPLETION") {
		t.Errorf("usage --by worker: exit %d\n%s", code, out)
	}

	// /metrics needs a key now.
	if resp, err := http.Get("http://" + h.http + "/metrics"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without a key: %v %v; want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	// Engine metrics arrive with the hub's next scrape of each engine.
	var fams map[string]*dto.MetricFamily
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams = scrapeHub(t, "http://"+h.http, keys["bob"])
		if hasSeries(fams, "vllm:num_requests_running", "worker", "rig/qwen3-4b") && hasSeries(fams, "llamacpp:requests_deferred", "worker", "ultra/qwen3-4b") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no engine metrics of rig and ultra on /metrics within 60 s; families: %v", familyNames(fams))
		}
		time.Sleep(time.Second)
	}
	for _, m := range fams["vllm:num_requests_running"].GetMetric() {
		labels := labelMap(m)
		if labels["node"] != "rig" || labels["engine"] != "vllm" && labels["engine"] != "sim" {
			t.Errorf("vllm:num_requests_running labels %v; want node rig, engine vllm", labels)
		}
	}
	ready := 0
	for _, m := range fams["fleet_worker_state"].GetMetric() {
		if l := labelMap(m); l["state"] == "ready" && m.GetGauge().GetValue() == 1 {
			ready++
		}
	}
	if ready != 3 {
		t.Errorf("fleet_worker_state shows %d ready workers, want 3", ready)
	}
	limited := 0.0
	for _, m := range fams["fleet_router_key_limited_total"].GetMetric() {
		if labelMap(m)["limit"] == "requests" {
			limited = m.GetCounter().GetValue()
		}
	}
	if limited != 1 {
		t.Errorf("fleet_router_key_limited_total{limit=requests} = %v, want 1", limited)
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetValue(), "fk-") || l.GetValue() == "ci" || l.GetValue() == "bob" {
					t.Errorf("%s has a label naming an API key: %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}

	// The shipped dashboard queries only metrics the hub serves.
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json is not valid JSON: %v", err)
	}
	name := regexp.MustCompile(`\b(fleet_[a-z0-9_]+|vllm:[a-z0-9_:]+|llamacpp:[a-z0-9_:]+)`)
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				queried++
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suf); ok && fams[b].GetType() == dto.MetricType_HISTOGRAM {
						base = b
					}
				}
				if _, ok := fams[base]; !ok {
					t.Errorf("dashboard panel %q queries %s, which /metrics does not serve", p.Title, n)
				}
			}
		}
	}
	if queried < 20 {
		t.Errorf("the dashboard queries only %d metrics; did the expressions change shape?", queried)
	}
}

func scrapeHub(t *testing.T, base, key string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics with a key: %d %s", resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v", err)
	}
	return fams
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func hasSeries(fams map[string]*dto.MetricFamily, name, label, value string) bool {
	for _, m := range fams[name].GetMetric() {
		if labelMap(m)[label] == value {
			return true
		}
	}
	return false
}

func familyNames(fams map[string]*dto.MetricFamily) []string {
	var out []string
	for n := range fams {
		out = append(out, n)
	}
	return out
}
