package nodes

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"fleet"
)

// curl redraws its progress bar with \r and ends it with one \n only when
// the download is done: an install that downloads with a real curl must show
// the percent on the worker as it goes, not only 100% at the end.
func TestManagerInstallFollowsCurlProgressBar(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed (apt-get install curl)")
	}
	// 16 pieces with a pause between each: curl redraws at most every
	// 100 ms, so each piece arriving 150 ms or more after the last gets a
	// bar of its own, however slow the machine.
	const pieces, pieceBytes = 16, 64 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(pieces*pieceBytes))
		piece := make([]byte, pieceBytes)
		for i := range pieces {
			if i > 0 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(150 * time.Millisecond):
				}
			}
			w.Write(piece)
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()

	h := newHarness(t, t.TempDir(), nil)
	bin := filepath.Join(t.TempDir(), "llama-server")
	cleanupEngines(t, h, bin)
	m := localModel()
	r := m.Recipes[fleet.EngineLlamaCpp]
	r.Bin = bin
	r.Install = curl + " -# -f -o /dev/null '" + srv.URL + "/llama.tar.gz' && cp '" + fakeEngine + "' '" + bin + "'"
	m.Recipes[fleet.EngineLlamaCpp] = r
	h.m.SetDesired(localFleet(m))
	h.run()
	h.waitReady("hub/qwen3-4b")

	h.rec.mu.Lock()
	var seen []float64
	for _, x := range h.rec.workers {
		if x.State == fleet.WorkerInstalling && x.Progress > 0 && (len(seen) == 0 || seen[len(seen)-1] != x.Progress) {
			seen = append(seen, x.Progress)
		}
	}
	h.rec.mu.Unlock()
	between := 0
	for i, p := range seen {
		if p < 100 {
			between++
		}
		if i > 0 && p < seen[i-1] {
			t.Errorf("install progress went back: %v", seen)
			break
		}
	}
	t.Logf("install progress: %v", seen)
	if between < 3 {
		t.Errorf("install progress reported %v while curl downloaded in %d pieces; want at least 3 figures below 100%%\n%s", seen, pieces, h.rec.dump())
	}
	if !h.rec.eventLike("install: ###") {
		t.Errorf("no event shows curl's bar\n%s", h.rec.dump())
	}
}
