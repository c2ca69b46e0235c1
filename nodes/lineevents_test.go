package nodes

import (
	"slices"
	"testing"
)

// Installer output arrives in arbitrary pieces: lines end at \n or \r\n
// (even split across writes), and a bar's redraws (\r) reach redraw as they
// come, the one still being written included.
func TestLineEventsSplitsLinesAndRedraws(t *testing.T) {
	tests := []struct {
		name          string
		writes        []string
		lines, redraw []string
	}{
		{"plain lines", []string{"a\nb\n"}, []string{"a", "b"}, nil},
		{"crlf split across writes", []string{"a\r", "\nb\r\n"}, []string{"a", "b"}, []string{"a"}},
		{"curl bar, \\r first", []string{"\r## 10.0%", "\r#### 20.0%", "\r######## 100.0%\n"},
			[]string{"######## 100.0%"}, []string{"## 10.0%", "## 10.0%", "#### 20.0%", "#### 20.0%"}},
		{"tqdm bar, \\r last", []string{" 50%|█ |\r", "100%|██|\n"}, []string{"100%|██|"}, []string{"50%|█ |", "50%|█ |"}},
		{"blank segments dropped", []string{"\r\r\n\n"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lines, redraws []string
			l := &lineEvents{
				emit:   func(s string) { lines = append(lines, s) },
				redraw: func(s string) { redraws = append(redraws, s) },
			}
			for _, w := range tt.writes {
				l.Write([]byte(w))
			}
			l.Flush()
			if !slices.Equal(lines, tt.lines) || !slices.Equal(redraws, tt.redraw) {
				t.Errorf("lines %q, redraws %q; want %q, %q", lines, redraws, tt.lines, tt.redraw)
			}
		})
	}
}
