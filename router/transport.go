package router

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"fleet/router/reasoning"
)

// NormalisingTransport wraps base so that chat completion answers come back
// rewritten to mode, exactly as the router rewrites them for clients. Checks
// that talk to one worker directly (the shape diff) use it to see the shape
// a client of the router gets.
func NormalisingTransport(base http.RoundTripper, mode reasoning.Mode) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if mode == reasoning.Off {
		return base
	}
	return normalisingTransport{base: base, mode: mode}
}

type normalisingTransport struct {
	base http.RoundTripper
	mode reasoning.Mode
}

func (t normalisingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, chatPath) {
		return t.base.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.Header.Del("Accept-Encoding") // as the router does: a body it can read
	resp, err := t.base.RoundTrip(req)
	if err != nil || !rewritable(resp) {
		return resp, err
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &normalisedStream{src: resp.Body, n: newSSENormaliser(t.mode)}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return resp, nil
	}
	body, err := readForRewrite(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	body, _ = rewriteJSONBody(body, t.mode) // on error the original passes, as in the router
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return resp, nil
}

// normalisedStream reads an SSE body through the router's stream normaliser.
type normalisedStream struct {
	src     io.ReadCloser
	n       *sseNormaliser
	pending []byte
	buf     [32 << 10]byte
	done    bool
}

func (s *normalisedStream) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.done {
			return 0, io.EOF
		}
		n, err := s.src.Read(s.buf[:])
		if n > 0 {
			s.pending = append(s.pending[:0], s.n.feed(s.buf[:n])...)
		}
		if err == io.EOF {
			s.done = true
			s.pending = append(s.pending, s.n.finish()...)
		} else if err != nil {
			return 0, err
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

func (s *normalisedStream) Close() error { return s.src.Close() }
