package console

import (
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"fleet"
	"fleet/themes"
)

func TestBarChartRows(t *testing.T) {
	m := newModel(nil, Options{Theme: themes.Dark()})
	tests := []struct {
		name   string
		chart  barChart
		slot   int
		bar    int
		expect []string
	}{
		{
			name:  "labels sit on their bars",
			chart: barChart{title: "t", values: []float64{50, 100}, labels: []string{"50", "100"}, levels: []string{"1", "2"}},
			slot:  5, bar: 3,
			expect: []string{
				"t         ",
				"      100 ",
				"      ███ ",
				" 50   ███ ",
				" ███  ███ ",
				" ███  ███ ",
				"  1    2  ",
			},
		},
		{
			name:  "a zero level keeps its label on the floor",
			chart: barChart{title: "a wide title", values: []float64{0, 40}, labels: []string{"-", "40"}, levels: []string{"1", "4"}},
			slot:  4, bar: 2,
			expect: []string{
				"a wide title",
				"     40     ",
				"     ██     ",
				"     ██     ",
				"     ██     ",
				" -   ██     ",
				" 1   4      ",
			},
		},
		{
			name:  "partial blocks",
			chart: barChart{title: "p", values: []float64{10, 80}, labels: []string{"10", "80"}, levels: []string{"1", "2"}},
			slot:  4, bar: 2,
			expect: []string{
				"p       ",
				"     80 ",
				"     ██ ",
				"     ██ ",
				" 10  ██ ",
				" ▄▄  ██ ",
				" 1   2  ",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows := m.barChartRows(tt.chart, tt.slot, tt.bar)
			var got []string
			for _, r := range rows {
				got = append(got, ansi.Strip(r))
			}
			if strings.Join(got, "\n") != strings.Join(tt.expect, "\n") {
				t.Fatalf("rows:\n%s\nwant:\n%s", strings.Join(got, "|\n")+"|", strings.Join(tt.expect, "|\n")+"|")
			}
		})
	}
}

func TestBenchTable(t *testing.T) {
	seed := []fleet.BenchPoint{
		{Concurrency: 1, TotalTokPerSec: 87.2, PerRequestTokPerSec: 86.6, TTFTp50ms: 95},
		{Concurrency: 2, TotalTokPerSec: 130.4, PerRequestTokPerSec: 65, TTFTp50ms: 118},
		{Concurrency: 4, TotalTokPerSec: 136, PerRequestTokPerSec: 34.2, TTFTp50ms: 162},
	}
	tests := []struct {
		name  string
		pts   []fleet.BenchPoint
		width int
		want  []string
	}{
		{"the seed's wording when it fits", seed, 120,
			[]string{
				"1 request tok/s | 2 concurrent total | 4 concurrent total | per request at 4 |     TTFT p50",
				"             87 |                130 |                136 |               34 | 95/118/162ms"}},
		{"abbreviated in 80 columns", seed, 78,
			[]string{
				"1 req tok/s | 2 conc total | 4 conc total | per req at 4 |     TTFT p50",
				"         87 |          130 |          136 |           34 | 95/118/162ms"}},
		{"no single-request level", []fleet.BenchPoint{
			{Concurrency: 8, TotalTokPerSec: 400, PerRequestTokPerSec: 50, TTFTp50ms: 1500},
			{Concurrency: 16, TotalTokPerSec: 480, PerRequestTokPerSec: 30, TTFTp50ms: 3200}}, 200,
			[]string{
				"8 concurrent total | 16 concurrent total | per request at 16 |  TTFT p50",
				"               400 |                 480 |                30 | 1.5s/3.2s"}},
		{"slow and failed levels", []fleet.BenchPoint{
			{Concurrency: 1, TotalTokPerSec: 8.04, PerRequestTokPerSec: 8.04, TTFTp50ms: 24000},
			{Concurrency: 2, TotalTokPerSec: 0, TTFTp50ms: 0}}, 200,
			[]string{
				"1 request tok/s | 2 concurrent total | per request at 2 | TTFT p50",
				"            8.0 |                  - |                - |  24.0s/-"}},
		{"a row per level when even the short row does not fit", seed, 60, []string{
			"concurrency | total tok/s | per request | TTFT p50",
			"          1 |          87 |          87 |     95ms",
			"          2 |         130 |          65 |    118ms",
			"          4 |         136 |          34 |    162ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := benchTable(tt.pts, tt.width)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("table:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestWrapArgs(t *testing.T) {
	tests := []struct {
		name  string
		argv  []string
		width int
		want  []string
	}{
		{"fits", []string{"vllm", "serve", "m"}, 20, []string{"vllm serve m"}},
		{"breaks between arguments, never at a hyphen", []string{"vllm", "--port", "8001", "--tensor-parallel-size", "1"}, 22,
			[]string{"vllm --port 8001", "--tensor-parallel-size", "1"}},
		{"cuts an argument wider than the line", []string{"a", "0123456789abcdef", "b"}, 6, []string{"a", "012345", "6789ab", "cdef b"}},
		{"empty", nil, 10, []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := wrapArgs(tt.argv, tt.width)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("wrapArgs = %q, want %q", got, tt.want)
			}
		})
	}
}
