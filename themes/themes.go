// Package themes holds the console's colour palettes: dark, light and high
// contrast. A Theme is a plain value of lipgloss styles; Bubble Tea downsamples
// the colours per program, so one theme serves every client's terminal.
package themes

import (
	"fmt"
	"image/color"
	"sort"
	"strings"

	"charm.land/lipgloss/v2"

	"fleet"
)

// Theme is a palette expressed as semantic styles, so views ask for "a warning"
// or "the selected row" and never pick colours themselves.
type Theme struct {
	Name string
	Dark bool

	Text     lipgloss.Style // ordinary cell text
	Muted    lipgloss.Style // secondary text: separators, timestamps, hints
	Title    lipgloss.Style // the top bar
	Header   lipgloss.Style // table header row
	Selected lipgloss.Style // the cursor row
	Marked   lipgloss.Style // the mark glyph of a marked row
	Key      lipgloss.Style // a key name in help and hints
	Accent   lipgloss.Style // the active tab, chart axes
	Spark    lipgloss.Style // sparklines and charts
	OK       lipgloss.Style // ready, up, success messages
	Warn     lipgloss.Style // probation, draining, warnings
	Err      lipgloss.Style // failed, rejected, unreachable, errors
	Info     lipgloss.Style // pending, installing, starting, notices
	Dialog   lipgloss.Style // confirmation box
}

// Names lists the built-in themes.
func Names() []string {
	names := make([]string, 0, len(builders))
	for n := range builders {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var builders = map[string]func() Theme{
	"dark":          Dark,
	"light":         Light,
	"high-contrast": HighContrast,
}

// Named returns the built-in theme called name (case-insensitive; "auto" and ""
// are not themes: the caller picks by background with ForBackground).
func Named(name string) (Theme, error) {
	b, ok := builders[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Theme{}, fmt.Errorf("unknown theme %q: choose one of %s", name, strings.Join(Names(), ", "))
	}
	return b(), nil
}

// ForBackground picks the dark or light theme for a terminal background.
func ForBackground(dark bool) Theme {
	if dark {
		return Dark()
	}
	return Light()
}

type palette struct {
	fg, muted, titleFG, titleBG, headerFG, selFG, selBG, mark, key, accent, spark, ok, warn, err, info, border color.Color
}

func build(name string, dark bool, p palette) Theme {
	s := lipgloss.NewStyle
	return Theme{
		Name:     name,
		Dark:     dark,
		Text:     s().Foreground(p.fg),
		Muted:    s().Foreground(p.muted),
		Title:    s().Foreground(p.titleFG).Background(p.titleBG).Bold(true),
		Header:   s().Foreground(p.headerFG).Bold(true).Underline(true),
		Selected: s().Foreground(p.selFG).Background(p.selBG).Bold(true),
		Marked:   s().Foreground(p.mark).Bold(true),
		Key:      s().Foreground(p.key).Bold(true),
		Accent:   s().Foreground(p.accent).Bold(true),
		Spark:    s().Foreground(p.spark),
		OK:       s().Foreground(p.ok),
		Warn:     s().Foreground(p.warn).Bold(true),
		Err:      s().Foreground(p.err).Bold(true),
		Info:     s().Foreground(p.info),
		Dialog:   s().Foreground(p.fg).Border(lipgloss.RoundedBorder()).BorderForeground(p.border).Padding(0, 1),
	}
}

// Dark suits a dark terminal background.
func Dark() Theme {
	c := lipgloss.Color
	return build("dark", true, palette{
		fg: c("#d0d0d0"), muted: c("#7a7a7a"), titleFG: c("#1c1c1c"), titleBG: c("#87afd7"),
		headerFG: c("#87afd7"), selFG: c("#ffffff"), selBG: c("#3a3a5a"), mark: c("#ffaf00"),
		key: c("#ffaf5f"), accent: c("#87d7ff"), spark: c("#5fd7af"), ok: c("#87d787"),
		warn: c("#ffd75f"), err: c("#ff5f5f"), info: c("#87afff"), border: c("#87afd7"),
	})
}

// Light suits a light terminal background.
func Light() Theme {
	c := lipgloss.Color
	return build("light", false, palette{
		fg: c("#262626"), muted: c("#767676"), titleFG: c("#ffffff"), titleBG: c("#005f87"),
		headerFG: c("#005f87"), selFG: c("#000000"), selBG: c("#d7d7ff"), mark: c("#af5f00"),
		key: c("#af5f00"), accent: c("#005faf"), spark: c("#008767"), ok: c("#00875f"),
		warn: c("#af8700"), err: c("#d70000"), info: c("#005fd7"), border: c("#005f87"),
	})
}

// HighContrast uses only the 16 basic colours, bold, and reverse video for the
// cursor, so it stays legible on any background and in low-colour terminals.
func HighContrast() Theme {
	c := lipgloss.Color
	t := build("high-contrast", true, palette{
		fg: c("15"), muted: c("7"), titleFG: c("0"), titleBG: c("15"),
		headerFG: c("15"), selFG: c("0"), selBG: c("15"), mark: c("11"),
		key: c("11"), accent: c("14"), spark: c("14"), ok: c("10"),
		warn: c("11"), err: c("9"), info: c("14"), border: c("15"),
	})
	t.Muted = t.Muted.Bold(false)
	t.Selected = lipgloss.NewStyle().Reverse(true).Bold(true)
	return t
}

// State is the style for a worker state, so every view colours a state alike.
func (t Theme) State(s fleet.WorkerState) lipgloss.Style {
	switch s {
	case fleet.WorkerReady:
		return t.OK
	case fleet.WorkerDraining, fleet.WorkerProbation:
		return t.Warn
	case fleet.WorkerFailed, fleet.WorkerRejected:
		return t.Err
	case fleet.WorkerStopped:
		return t.Muted
	}
	return t.Info
}

// NodeState is the style for a node state.
func (t Theme) NodeState(s fleet.NodeState) lipgloss.Style {
	switch s {
	case fleet.NodeUp:
		return t.OK
	case fleet.NodeUnreachable:
		return t.Err
	}
	return t.Muted
}

// Level is the style for an event level ("info", "warn", "error").
func (t Theme) Level(level string) lipgloss.Style {
	switch level {
	case "warn":
		return t.Warn
	case "error":
		return t.Err
	}
	return t.Info
}
