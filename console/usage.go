package console

import (
	"fmt"
	"strings"

	"charm.land/lipgloss/v2"

	"fleet"
)

// usageView is the last 24 hours' requests and tokens per worker and, for
// admins, per API key (the hub leaves key rows out for everyone else), as
// `fleet usage` prints them.
type usageView struct {
	*common
	list
	idx []int // into snap.Usage
}

func (v *usageView) name() string { return "usage" }
func (v *usageView) state() *list { return &v.list }
func (v *usageView) rows() int    { return len(v.idx) }
func (v *usageView) page() int    { return v.pageRows() }

func (v *usageView) refilter() {
	f := strings.ToLower(v.filter)
	v.idx = v.idx[:0]
	for i, u := range v.snap.Usage {
		if f == "" || strings.Contains(strings.ToLower(usageSubject(u)+" "+u.Model), f) {
			v.idx = append(v.idx, i)
		}
	}
}

// usageSubject names what a row counts: a key's rows say so.
func usageSubject(u fleet.Usage) string {
	switch {
	case u.Worker != "":
		return u.Worker
	case u.Key != "":
		return "key " + u.Key
	}
	return "key (none)"
}

func (v *usageView) render() []string {
	t := v.theme
	headers := []string{"Last 24 h", "Requests", "Prompt", "Cached", "Completion", "Total"}
	cells := make([][]string, 0, len(v.idx))
	for _, i := range v.idx {
		u := v.snap.Usage[i]
		cached := "-"
		if u.PromptTokens > 0 {
			cached = fmt.Sprintf("%s %3.0f%%", count(u.CachedTokens), 100*float64(u.CachedTokens)/float64(u.PromptTokens))
		}
		cells = append(cells, []string{usageSubject(u), fmt.Sprint(u.Requests), count(u.PromptTokens), cached,
			count(u.CompletionTokens), count(u.PromptTokens + u.CompletionTokens)})
	}
	return v.simpleTable(&v.list, headers, cells, func(row, col int) lipgloss.Style {
		if col == 0 {
			return t.Accent
		}
		return t.Text
	})
}

// count shortens a token count: 950, 12.3k, 4.56M.
func count(n int64) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
