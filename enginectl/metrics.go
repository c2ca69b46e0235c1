package enginectl

import (
	"context"
	"fmt"
	"net/http"

	"fleet"
)

// ErrNoMetrics means the engine serves no Prometheus metrics: Ollama never,
// llama-server only when started with --metrics.
var ErrNoMetrics = fmt.Errorf("engine serves no /metrics")

// MetricsText reads an engine's own Prometheus exposition (/metrics), as
// it is, for the hub to serve relabelled. It wraps ErrNoMetrics when the
// engine has none to give.
func MetricsText(ctx context.Context, r Runner, port int, engine fleet.EngineKind) ([]byte, error) {
	if engine == fleet.EngineOllama {
		return nil, fmt.Errorf("metrics of port %d: ollama: %w", port, ErrNoMetrics)
	}
	hc := httpClient(r)
	defer hc.CloseIdleConnections()
	status, body, err := get(ctx, hc, port, "/metrics")
	switch {
	case err != nil:
		return nil, fmt.Errorf("metrics of port %d: %w", port, err)
	case status == http.StatusNotFound || status == http.StatusNotImplemented:
		// llama-server without --metrics answers 501 (older builds 404).
		return nil, fmt.Errorf("metrics of port %d: /metrics answered %d (llama-server serves it with --metrics): %w", port, status, ErrNoMetrics)
	case status != http.StatusOK:
		return nil, fmt.Errorf("metrics of port %d: /metrics answered %d %s", port, status, snippet(body))
	}
	return body, nil
}
