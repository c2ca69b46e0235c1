package simulate

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
)

// Text prints the policies side by side: latency percentiles, rejections and
// each worker's share of requests.
func Text(s Scenario, rs []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s: %d workers, load %.0f%% of capacity, %d requests, seed %d\n",
		s.Name, len(s.Workers), s.Load*100, s.Requests, s.Seed)
	if len(rs) > 0 && rs[0].CacheHitCeiling > 0 {
		fmt.Fprintf(&b, "agent sessions: %d kinds of prefix %v tokens, %d–%d turns; the workload allows a cache hit ratio of %.1f%%\n",
			len(s.Agent.System), s.Agent.System, s.Agent.MinTurns, s.Agent.MaxTurns, 100*rs[0].CacheHitCeiling)
	}
	fmt.Fprintln(&b)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tp50 TTFT\tp99 TTFT\tp50 E2E\tp90 E2E\tp99 E2E\tcache hit\trejected\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%d\t\n", r.Policy,
			msText(r.P50TTFTms), msText(r.P99TTFTms), msText(r.P50E2Ems), msText(r.P90E2Ems), msText(r.P99E2Ems), 100*r.CacheHit, r.Rejected)
	}
	tw.Flush()
	var workers []string
	seen := map[string]bool{}
	for _, r := range rs {
		for w := range r.Share {
			if !seen[w] {
				seen[w] = true
				workers = append(workers, w)
			}
		}
	}
	sort.Strings(workers)
	agents := len(rs) > 0 && rs[0].CacheHitCeiling > 0
	if agents {
		fmt.Fprintln(&b, "\nshare of requests per worker (and its cache hit ratio)")
	} else {
		fmt.Fprintln(&b, "\nshare of requests per worker")
	}
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "policy\t")
	for _, w := range workers {
		fmt.Fprintf(tw, "%s\t", w)
	}
	fmt.Fprintln(tw)
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t", r.Policy)
		for _, w := range workers {
			if h, ok := r.WorkerCacheHit[w]; ok && agents {
				fmt.Fprintf(tw, "%.1f%% (%.0f%%)\t", 100*r.Share[w], 100*h)
			} else {
				fmt.Fprintf(tw, "%.1f%%\t", 100*r.Share[w])
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	return b.String()
}

func msText(ms float64) string {
	if ms >= 10000 {
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	return fmt.Sprintf("%.0f ms", ms)
}
