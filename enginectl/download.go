package enginectl

import (
	"context"
	"regexp"
	"strconv"
	"strings"
)

// downloadBar matches the progress lines engines print while they fetch
// weights: llama-server's "Downloading FILE ──── 45%" (common/download.cpp;
// curl-era builds printed a "###  45.2%" meter), and the tqdm bars of
// vLLM's Hugging Face download ("model-00001-of-00002.safetensors:  45%|███▌
// | 2.24G/4.97G [00:10<00:12, 215MB/s]", "Fetching 4 files:  50%|…").
var downloadBar = regexp.MustCompile(`(?i)downloading|[0-9]%\||#{2,}`)

// ansiEscape is a terminal control sequence (llama-server clears the line
// and moves the cursor between bars).
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// DownloadProgress finds the latest download progress bar in the tail of
// an engine's log: its percent and the bar's text. Bars redraw with \r, so
// the text is cut at \r as well as \n, and the last bar wins.
func DownloadProgress(tail []byte) (pct float64, line string, ok bool) {
	text := ansiEscape.ReplaceAllString(string(tail), "")
	segs := strings.FieldsFunc(text, func(r rune) bool { return r == '\r' || r == '\n' })
	for i := len(segs) - 1; i >= 0; i-- {
		s := strings.TrimSpace(segs[i])
		if !downloadBar.MatchString(s) {
			continue
		}
		if pct, ok := ProgressPercent(s); ok {
			return pct, s, true
		}
	}
	return 0, "", false
}

// LogTailBytes is the last n bytes of the engine's log on its node.
func LogTailBytes(ctx context.Context, r Runner, p Process, n int) ([]byte, error) {
	if p.LogPath == "" {
		return nil, nil
	}
	return runScript(ctx, r, "tailbytes", strconv.Itoa(n), p.LogPath)
}
