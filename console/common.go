package console

import (
	"fmt"
	"log/slog"
	"sort"

	"fleet"
	"fleet/themes"
)

// common is what every view of one console shares, as soft-serve's pages
// share common.Common: the options, the theme, the window, the keymap and
// the last snapshot. Each view keeps only its own cursor and filter.
type common struct {
	opts   Options
	log    *slog.Logger
	theme  themes.Theme
	paints paints
	keys   *keyMap

	width, height int

	snap   fleet.Snapshot
	loaded bool
	// events are the snapshot's events and the audit trail, newest first.
	events []fleet.Event
}

// setSnapshot takes a new snapshot. The events view shows the audit trail
// interleaved with the events, so "who drained ultra" sits next to "ultra
// drained".
func (c *common) setSnapshot(s fleet.Snapshot) {
	c.snap, c.loaded = s, true
	c.events = append(c.events[:0], s.Events...)
	for _, a := range s.Audit {
		c.events = append(c.events, fleet.Event{
			ID: a.ID, At: a.At, Level: "audit", Subject: a.Target,
			Message: fmt.Sprintf("%s by %s: %s", a.Action, a.User, a.OutcomeText()),
		})
	}
	sort.SliceStable(c.events, func(a, b int) bool { return c.events[a].At.After(c.events[b].At) })
}

// bodyHeight is the rows between the title bar and the two bottom lines.
func (c *common) bodyHeight() int { return max(c.height-3, 1) }

// pageRows is how many data rows a table view shows (one goes to the header).
func (c *common) pageRows() int { return max(c.bodyHeight()-1, 1) }

func (c *common) workerByName(name string) (fleet.WorkerView, bool) {
	for _, w := range c.snap.Workers {
		if w.Name() == name {
			return w, true
		}
	}
	return fleet.WorkerView{}, false
}

// list is a view's cursor, scroll position and filter.
type list struct {
	cursor, offset int
	filter         string
}

// clamp keeps the cursor on one of n rows and within a window of page rows.
func (l *list) clamp(n, page int) {
	l.cursor = max(0, min(l.cursor, n-1))
	if l.cursor < l.offset {
		l.offset = l.cursor
	}
	if l.cursor >= l.offset+page {
		l.offset = l.cursor - page + 1
	}
	l.offset = max(0, min(l.offset, max(n-page, 0)))
	if l.cursor < l.offset {
		l.offset = l.cursor
	}
}

// tableView is one of the views tab cycles through.
type tableView interface {
	name() string
	state() *list
	rows() int
	// page is the window the cursor is kept in (models scroll by model block).
	page() int
	// refilter recomputes the rows shown from the snapshot and the filter.
	refilter()
	render() []string
}
