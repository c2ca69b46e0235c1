package router

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopHeaders are connection-scoped (RFC 9110 §7.6.1) and never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopHeaders deletes the hop-by-hop headers from h: the fixed ones and
// every header a Connection header names (RFC 9110 §7.6.1), which a sender
// marks as meant for the next hop only, as httputil.ReverseProxy and Caddy
// do. A client's Connection-named header must not reach the engine, nor an
// engine's reach the client.
func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// hasHopHeaders reports whether removeHopHeaders would change h, so that a
// request without any is sent without copying its header.
func hasHopHeaders(h http.Header) bool {
	for _, name := range hopHeaders {
		if _, ok := h[name]; ok {
			return true
		}
	}
	return false
}
