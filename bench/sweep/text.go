package sweep

import (
	"fmt"
	"strings"
)

// Text prints the sweep as the first field report printed its numbers (one row of
// the headline table), then every level in detail, then how each metric is
// defined.
func (r Result) Text() string {
	var sb strings.Builder
	turns := ""
	if r.Turns > 1 {
		turns = fmt.Sprintf(" in sessions of %d turns", r.Turns)
	}
	fmt.Fprintf(&sb, "Bench of %s (model %s), %s split%s, %d-token answers, started %s\n\n",
		r.Target, r.Model, r.Split, turns, r.OutputTokens, r.StartedAt.Format("2006-01-02 15:04:05"))
	sb.WriteString(Table(r))
	sb.WriteString("\n")
	sb.WriteString(r.Detail())
	sb.WriteString("\n")
	sb.WriteString(Definitions)
	sb.WriteString("\n")
	return sb.String()
}

// Table prints the field report's headline table, one row per result: "1 request
// tok/s | 2 concurrent total | 4 concurrent total | per request at 4 | TTFT
// p50" (the columns follow the levels swept; TTFT p50 lists every level).
func Table(results ...Result) string {
	if len(results) == 0 {
		return ""
	}
	levels := results[0].Levels
	header := []string{"Target"}
	for i, l := range levels {
		if i == 0 && l.Concurrency == 1 {
			header = append(header, "1 request tok/s")
		} else {
			header = append(header, fmt.Sprintf("%d concurrent total", l.Concurrency))
		}
	}
	if n := len(levels); n > 0 {
		header = append(header, fmt.Sprintf("per request at %d", levels[n-1].Concurrency))
	}
	header = append(header, "TTFT p50")
	rows := [][]string{header}
	for _, r := range results {
		row := []string{r.Target}
		for i, l := range r.Levels {
			if i >= len(levels) {
				break
			}
			v := l.TotalTokPerSec
			if i == 0 && l.Concurrency == 1 {
				v = l.PerRequestTokPerS
			}
			row = append(row, tokS(v, l))
		}
		var ttft []string
		for _, l := range r.Levels {
			ttft = append(ttft, fmtMS(l.TTFT.P50))
		}
		if n := len(r.Levels); n > 0 {
			row = append(row, tokS(r.Levels[n-1].PerRequestTokPerS, r.Levels[n-1]))
		}
		row = append(row, strings.Join(ttft, " / "))
		rows = append(rows, row)
	}
	return markdown(rows)
}

// Detail prints every level's figures.
func (r Result) Detail() string {
	rows := [][]string{{"concurrency", "requests", "failed", "total tok/s", "per req tok/s", "TTFT p50 / p90", "TPOT p50", "ITL p50 / p99", "E2E p50", "prompt tok", "cache hit"}}
	for _, l := range r.Levels {
		rows = append(rows, []string{
			fmt.Sprint(l.Concurrency), fmt.Sprint(l.Requests), fmt.Sprint(l.Failed),
			fmt.Sprintf("%.1f", l.TotalTokPerSec), fmt.Sprintf("%.1f", l.PerRequestTokPerS),
			fmtMS(l.TTFT.P50) + " / " + fmtMS(l.TTFT.P90), fmtMS(l.TPOT.P50),
			fmtMS(l.ITL.P50) + " / " + fmtMS(l.ITL.P99), fmtMS(l.E2E.P50), fmt.Sprint(l.PromptTokens),
			cacheHitText(l),
		})
	}
	out := markdown(rows)
	for _, l := range r.Levels {
		for _, e := range l.Errors {
			out += fmt.Sprintf("at concurrency %d: %s\n", l.Concurrency, e)
		}
		switch ok := l.Requests - l.Failed; {
		case l.CacheHit == nil && ok > 0:
			out += fmt.Sprintf("at concurrency %d: cache hit n/a: %s\n", l.Concurrency, NoCacheCount)
		case l.CacheHit != nil && l.CacheReported > 0 && l.CacheReported < ok:
			out += fmt.Sprintf("at concurrency %d: cache hit over the %d of %d requests whose engine reported its cached tokens; the others' did not (%s)\n",
				l.Concurrency, l.CacheReported, ok, vllmCacheFlag)
		}
		if l.CountedEvents {
			out += fmt.Sprintf("at concurrency %d: the server sent no usage; output tokens were counted from stream events\n", l.Concurrency)
		}
	}
	return out
}

// vllmCacheFlag is what makes vLLM report its cached tokens.
const vllmCacheFlag = "vLLM reports them only when launched with --enable-prompt-tokens-details: add it to the recipe's args"

// NoCacheCount says why a cache hit is unknown, for every place that
// prints one.
const NoCacheCount = "the engine reported no cached-token count (" + vllmCacheFlag + ")"

// cacheHitText is a level's cache hit: a percentage, or n/a when no engine
// reported a count.
func cacheHitText(l Level) string {
	if l.CacheHit == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100**l.CacheHit)
}

func tokS(v float64, l Level) string {
	if l.Requests == l.Failed {
		return "failed"
	}
	if v >= 20 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func fmtMS(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

// markdown renders rows as an aligned pipe table; the first row is the header.
func markdown(rows [][]string) string {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			if i < len(widths) {
				widths[i] = max(widths[i], len([]rune(c)))
			}
		}
	}
	var sb strings.Builder
	line := func(cells []string) {
		sb.WriteString("|")
		for i, w := range widths {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			sb.WriteString(" " + c + strings.Repeat(" ", w-len([]rune(c))) + " |")
		}
		sb.WriteString("\n")
	}
	line(rows[0])
	sep := make([]string, len(widths))
	for i, w := range widths {
		sep[i] = strings.Repeat("-", w)
	}
	line(sep)
	for _, row := range rows[1:] {
		line(row)
	}
	return sb.String()
}
