package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"fleet"
	"fleet/bench/sweep"
)

// BenchHistoryHub is what `bench --history` needs from the hub.
type BenchHistoryHub interface {
	// BenchHistory lists the stored sweeps of a worker, or of a model
	// (through the router and on its workers), newest first.
	BenchHistory(ctx context.Context, u fleet.User, worker string, limit int) ([]sweep.Result, error)
}

// printBenchHistory is one line per stored run: when, which split, and per
// concurrency level the total tok/s and TTFT p50.
func printBenchHistory(w io.Writer, worker string, runs []sweep.Result) error {
	if len(runs) == 0 {
		fmt.Fprintf(w, "no bench runs of %s yet; run one: bench %s [--split agent]\n", worker, worker)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHEN\tSPLIT\tTARGET\tCONCURRENCY\tTOTAL TOK/S\tTTFT P50\tFAILED")
	for _, r := range runs {
		split := r.Split
		if r.Turns > 1 {
			split = fmt.Sprintf("%s, %d turns", split, r.Turns)
		}
		var levels, tok, ttft []string
		failed := 0
		for _, l := range r.Levels {
			levels = append(levels, fmt.Sprint(l.Concurrency))
			tok = append(tok, fmt.Sprintf("%.0f", l.TotalTokPerSec))
			ttft = append(ttft, time.Duration(l.TTFT.P50*float64(time.Millisecond)).Round(time.Millisecond).String())
			failed += l.Failed
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", r.StartedAt.Local().Format(time.DateTime), split, r.Target,
			strings.Join(levels, "/"), strings.Join(tok, "/"), strings.Join(ttft, "/"), failed)
	}
	return tw.Flush()
}
