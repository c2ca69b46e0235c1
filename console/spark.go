package console

import (
	"math"
	"strings"
)

var sparkTicks = []rune("▁▂▃▄▅▆▇█")

// Spark renders the last width samples as a one-row sparkline scaled to
// [0, hi]. Missing samples (a short history, NaN) are blanks, so a new worker
// shows a short line rather than a fake flat one.
func Spark(samples []float64, width int, hi float64) string {
	if width <= 0 {
		return ""
	}
	if len(samples) > width {
		samples = samples[len(samples)-width:]
	}
	var b strings.Builder
	b.Grow(width * 3)
	for i := 0; i < width-len(samples); i++ {
		b.WriteByte(' ')
	}
	for _, v := range samples {
		if math.IsNaN(v) || v < 0 {
			b.WriteByte(' ')
			continue
		}
		idx := 0
		if hi > 0 {
			idx = int(v / hi * float64(len(sparkTicks)-1))
		}
		idx = max(0, min(idx, len(sparkTicks)-1))
		b.WriteRune(sparkTicks[idx])
	}
	return b.String()
}

// SparkBound is the top of a sparkline's scale: a quarter above the window's
// peak (nvitop's rule) so the peak does not pin to the ceiling, and never
// below floor so a quiet worker's noise does not look like a spike.
func SparkBound(samples []float64, floor float64) float64 {
	peak := 0.0
	for _, v := range samples {
		if !math.IsNaN(v) && v > peak {
			peak = v
		}
	}
	return max(1.25*peak, floor)
}

// Chart renders samples as a multi-row bar chart, height rows of width
// columns, top row first. Each column is one sample (newest on the right);
// partial blocks give eight steps per row.
func Chart(samples []float64, width, height int, hi float64) []string {
	if width <= 0 || height <= 0 {
		return nil
	}
	if len(samples) > width {
		samples = samples[len(samples)-width:]
	}
	pad := width - len(samples)
	rows := make([]strings.Builder, height)
	for r := range rows {
		rows[r].Grow(width * 3)
		for i := 0; i < pad; i++ {
			rows[r].WriteByte(' ')
		}
	}
	for _, v := range samples {
		eighths := 0
		if hi > 0 && !math.IsNaN(v) && v > 0 {
			eighths = int(math.Round(v / hi * float64(height*8)))
			// A non-zero sample must stay visible.
			eighths = max(1, min(eighths, height*8))
		}
		for r := 0; r < height; r++ {
			level := height - 1 - r // rows[0] is the top
			fill := eighths - level*8
			switch {
			case fill >= 8:
				rows[r].WriteRune('█')
			case fill > 0:
				rows[r].WriteRune(sparkTicks[fill-1])
			default:
				rows[r].WriteByte(' ')
			}
		}
	}
	out := make([]string, height)
	for r := range rows {
		out[r] = rows[r].String()
	}
	return out
}
