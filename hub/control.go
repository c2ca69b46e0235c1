package hub

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"fleet"
)

// The control socket lets `fleet workers` (and every other hub command) typed
// on the hub machine run inside the running hub, with the same command tree
// SSH exec uses. Only the hub's OS user can open it (mode 0600 in a 0700
// directory), and that user acts as an admin: they own the database anyway.
//
// Protocol: the client sends one JSON line {"args":[...]} and then its
// standard input until it half-closes; the hub answers with frames of
// [kind byte][uint32 length][payload]: 'o' stdout, 'e' stderr, 'x' exit status.
// An empty 'o' frame is a heartbeat while a command runs.

const (
	frameStdout = 'o'
	frameStderr = 'e'
	frameExit   = 'x'
)

// controlHeartbeat is how often a running command's client is checked for.
const controlHeartbeat = 2 * time.Second

// SocketName is the control socket's file name inside the data dir.
const SocketName = "hub.sock"

// maxControlRequest bounds the request line: an argv, which no shell passes
// anywhere near this long. It is the apply limit (a fleet file, the largest
// input a command takes, comes on standard input, not in the line), so a
// client that never sends a newline cannot grow the hub without bound.
const maxControlRequest = fleet.MaxFleetFileBytes

type controlRequest struct {
	Args []string `json:"args"`
}

// ExecFunc runs one command line and returns its exit status.
type ExecFunc func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int

func listenControl(dataDir string) (net.Listener, error) {
	path := filepath.Join(dataDir, SocketName)
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("another hub is already running on data dir %s (its control socket %s answers); stop it or pass another --data", dataDir, path)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("opening the control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restricting the control socket %s to the hub's user: %w", path, err)
	}
	return l, nil
}

func serveControl(ctx context.Context, l net.Listener, exec ExecFunc, log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("control socket stopped accepting", "err", err)
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			handleControl(ctx, conn, exec, log)
		}()
	}
}

type frameWriter struct {
	mu   *sync.Mutex
	w    io.Writer
	kind byte
	fail func()
}

func (f frameWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var hdr [5]byte
	hdr[0] = f.kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := f.w.Write(hdr[:]); err != nil {
		f.fail()
		return 0, err
	}
	if _, err := f.w.Write(p); err != nil {
		f.fail()
		return 0, err
	}
	return len(p), nil
}

func handleControl(ctx context.Context, conn net.Conn, exec ExecFunc, log *slog.Logger) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	br := bufio.NewReader(conn)
	mu := &sync.Mutex{}
	out := frameWriter{mu: mu, w: conn, kind: frameStdout, fail: cancel}
	errw := frameWriter{mu: mu, w: conn, kind: frameStderr, fail: cancel}
	line, err := readLine(br, maxControlRequest)
	if errors.Is(err, errLineTooLong) {
		log.Warn("control client sent an oversized request", "limit", maxControlRequest)
		fmt.Fprintf(errw, "fleet: the command line sent to the hub is over %d bytes, the most it reads; nothing was run. Pass large input on standard input (as apply -f does), not as arguments\n", maxControlRequest)
		_, _ = frameWriter{mu: mu, w: conn, kind: frameExit, fail: cancel}.Write([]byte("2"))
		return
	}
	if err != nil {
		log.Warn("control client sent no request", "err", err)
		return
	}
	var req controlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		log.Warn("control client sent a malformed request", "err", err)
		return
	}
	// An empty frame now and then finds out that the client left (its
	// Ctrl-C closes the socket, which only a write notices; the client
	// half-closed its side long ago, so a read cannot tell): a command that
	// prints nothing for a while, like a follow of a quiet log, is then
	// cancelled instead of running on, on the hub and on the node.
	beat, beating := make(chan struct{}), sync.WaitGroup{}
	beating.Go(func() {
		t := time.NewTicker(controlHeartbeat)
		defer t.Stop()
		for {
			select {
			case <-beat:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = out.Write(nil)
			}
		}
	})
	code := exec(ctx, req.Args, br, out, errw)
	close(beat)
	beating.Wait()
	_, _ = frameWriter{mu: mu, w: conn, kind: frameExit, fail: cancel}.Write([]byte(strconv.Itoa(code)))
}

var errLineTooLong = errors.New("line too long")

// readLine reads up to and including the next newline, or fails with
// errLineTooLong once it has more than max bytes without one.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// ErrNoHub means no hub answers on the data dir's control socket.
var ErrNoHub = errors.New("no hub is running")

// RunRemote sends one command line to the hub running on dataDir and copies
// its output; it returns the command's exit status.
func RunRemote(ctx context.Context, dataDir string, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	path := filepath.Join(dataDir, SocketName)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return 0, fmt.Errorf("%w on data dir %s (%v); start one with 'fleet serve' (add --demo for the demo fleet) or pass the hub's --data", ErrNoHub, dataDir, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	hdr, _ := json.Marshal(controlRequest{Args: args})
	if len(hdr)+1 > maxControlRequest {
		return 0, fmt.Errorf("the command line is %d bytes, over the %d bytes the hub reads; pass large input on standard input, not as arguments", len(hdr)+1, maxControlRequest)
	}
	if _, err := conn.Write(append(hdr, '\n')); err != nil {
		return 0, fmt.Errorf("sending the command to the hub: %w", err)
	}
	go func() {
		if stdin != nil {
			_, _ = io.Copy(conn, stdin)
		}
		if uc, ok := conn.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
	}()
	br := bufio.NewReader(conn)
	for {
		var h [5]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			if ctx.Err() != nil {
				return 1, ctx.Err()
			}
			return 0, fmt.Errorf("the hub closed the connection before the command finished (it may have stopped; see its log): %w", err)
		}
		n := binary.BigEndian.Uint32(h[1:])
		payload := make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			// A cancel closes the connection wherever the read is, in
			// the middle of a frame too (the hub writes a frame's
			// header and payload apart).
			if ctx.Err() != nil {
				return 1, ctx.Err()
			}
			return 0, fmt.Errorf("reading the hub's answer: %w", err)
		}
		switch h[0] {
		case frameStdout:
			_, _ = stdout.Write(payload)
		case frameStderr:
			_, _ = stderr.Write(payload)
		case frameExit:
			code, err := strconv.Atoi(string(payload))
			if err != nil {
				return 0, fmt.Errorf("the hub sent a malformed exit status %q", payload)
			}
			return code, nil
		default:
			return 0, fmt.Errorf("the hub sent an unknown frame kind %q; is the fleet binary the same version as the hub?", h[0])
		}
	}
}

// RunOrExit is RunRemote for the command line: a failure to reach the hub is
// printed and becomes exit status 1.
func RunOrExit(ctx context.Context, dataDir string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	code, err := RunRemote(ctx, dataDir, args, stdin, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "fleet: %v\n", err)
		return 1
	}
	return code
}
