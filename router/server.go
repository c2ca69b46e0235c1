package router

import (
	"net/http"
	"time"
)

// NewServer wraps h in an http.Server with the timeouts a public router
// needs against slow clients: a client must send its headers within 10 s
// and a keep-alive connection idles out after 2 min. There is deliberately
// no read or write timeout on the whole request: a streamed answer from a
// slow worker may run for minutes. The body has its own deadline
// (Options.BodyTimeout), set by the handler and lifted once the body is in.
func NewServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}
