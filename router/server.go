package router

import (
	"context"
	"net"
	"net/http"
	"time"
)

// ClientSendBuffer is the socket send buffer of each client connection
// (Linux doubles it: 128 KiB). What a client has not read waits there and
// in the client's own receive window; the router's writes block only once
// both are full, and only then can the write timeout cut a client that
// stopped reading. Left to the kernel the send buffer grows to
// net.ipv4.tcp_wmem's maximum, 4 MiB: more than a 16k-token answer, so a
// client that never read held its engine slot as long as one that read.
// 128 KiB still carries 1 GB/s on loopback and over 10 MB/s at 10 ms of
// round trip, far beyond any engine's token rate.
const ClientSendBuffer = 64 << 10

// NewServer wraps h in an http.Server with the timeouts a public router
// needs against slow clients: a client must send its headers within 10 s
// and a keep-alive connection idles out after 2 min. There is deliberately
// no read or write timeout on the whole request: a streamed answer from a
// slow worker may run for minutes. The body has its own deadline
// (Options.BodyTimeout), set by the handler and lifted once the body is in.
// Each connection's send buffer is ClientSendBuffer.
func NewServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*net.TCPConn); ok {
				// A fixed size turns the kernel's growing of it off.
				_ = tc.SetWriteBuffer(ClientSendBuffer)
			}
			return ctx
		},
	}
}
