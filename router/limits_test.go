package router

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"

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
func TestUnknownModelNamesAreNotLabels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*hangGuard)
	defer cancel()
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	_, rsrv := startRouter(t, Options{}, b)
	const unique = 2000
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
