package console

import (
	"strings"

	"charm.land/lipgloss/v2"

	"fleet"
	"fleet/themes"
)

// paint is a style reduced to the escape sequences around its text. Table
// cells only set colours and weight, so wrapping a cell in pre/post gives
// what Style.Render gives at a fraction of the cost (Render re-measures and
// re-splits every string); with 1,000 workers that is the frame budget.
type paint struct{ pre, post string }

func paintOf(s lipgloss.Style) paint {
	const probe = "\u2063" // invisible separator: never in a cell
	r := s.Render(probe)
	i := strings.Index(r, probe)
	if i < 0 {
		return paint{}
	}
	return paint{pre: r[:i], post: r[i+len(probe):]}
}

func (p paint) wrap(b *strings.Builder, text string) {
	b.WriteString(p.pre)
	b.WriteString(text)
	b.WriteString(p.post)
}

// paints are the theme's table styles, precomputed when the theme changes.
type paints struct {
	text, muted, marked, spark paint
	state                      map[fleet.WorkerState]paint
}

func newPaints(t themes.Theme) paints {
	p := paints{
		text: paintOf(t.Text), muted: paintOf(t.Muted), marked: paintOf(t.Marked), spark: paintOf(t.Spark),
		state: map[fleet.WorkerState]paint{},
	}
	for _, s := range []fleet.WorkerState{fleet.WorkerPending, fleet.WorkerInstalling, fleet.WorkerStarting,
		fleet.WorkerProbation, fleet.WorkerReady, fleet.WorkerDraining, fleet.WorkerStopped, fleet.WorkerFailed, fleet.WorkerRejected} {
		p.state[s] = paintOf(t.State(s))
	}
	return p
}

func (p paints) forState(s fleet.WorkerState) paint {
	if v, ok := p.state[s]; ok {
		return v
	}
	return p.text
}

// asciiWidth returns len(s) and true when s is plain ASCII, the common case
// for table cells, so fit can skip grapheme segmentation.
func asciiWidth(s string) (int, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 || s[i] < 0x20 {
			return 0, false
		}
	}
	return len(s), true
}
