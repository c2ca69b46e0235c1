package consoletest

import (
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// Screen is an in-process terminal for driving the console in tests: what a
// program writes is drawn on the emulator, and what the terminal sends back
// (answers to the program's queries, the keys a test types) is pumped to the
// program's input.
type Screen struct {
	Emu *vt.SafeEmulator

	mu      sync.Mutex
	pumping bool
	stop    atomic.Bool
	done    chan struct{}
}

// NewScreen returns a w×h terminal.
func NewScreen(w, h int) *Screen {
	return &Screen{Emu: vt.NewSafeEmulator(w, h), done: make(chan struct{})}
}

// Pump copies the terminal's replies and keys to dst until Close. Write
// errors are dropped, not fatal: the reader must keep draining the emulator,
// whose input is a synchronous pipe, or typing would block.
func (s *Screen) Pump(dst io.Writer) {
	s.mu.Lock()
	s.pumping = true
	s.mu.Unlock()
	go func() {
		defer close(s.done)
		buf := make([]byte, 4096)
		var werr error
		for {
			n, err := s.Emu.Read(buf)
			if err != nil || s.stop.Load() {
				return
			}
			if werr == nil {
				_, werr = dst.Write(buf[:n])
			}
		}
	}()
}

// Text is the screen without colours.
func (s *Screen) Text() string { return ansi.Strip(s.Emu.Render()) }

// Type sends text as typed keys.
func (s *Screen) Type(text string) { s.Emu.SendText(text) }

// Close stops the pump and releases the emulator. Call it after whatever
// writes to the screen has stopped: the emulator's Close is not safe against
// a concurrent Write.
func (s *Screen) Close() {
	s.mu.Lock()
	pumping := s.pumping
	s.mu.Unlock()
	if pumping && !s.stop.Swap(true) {
		// Wake the pump from its blocking read so it sees stop.
		woke := make(chan struct{})
		go func() { s.Emu.SendText(" "); close(woke) }()
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
		}
		select {
		case <-woke:
		case <-time.After(time.Second):
		}
	}
	_ = s.Emu.Close()
}

// Row returns the first screen line containing substr, or "".
func (s *Screen) Row(substr string) string {
	for _, l := range strings.Split(s.Text(), "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}
