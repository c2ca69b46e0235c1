package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"fleet"
)

// TestClosedKeptAliveConnectionIsRedialled: llama-server closes a
// connection after a streamed answer without saying so, and a request sent
// on it at once gets EOF before any byte of an answer. The router sends it
// again on a new connection to the same worker, instead of counting the
// worker as failed. The engine here answers the first request on each
// connection and closes the connection when a second one comes on it.
func TestClosedKeptAliveConnectionIsRedialled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if n > 0 {
						return // closed under the client's second request
					}
					body := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
				}
			}(c)
		}
	}()
	_, srv := startRouter(t, Options{MaxRetries: -1}, Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp,
		Addr: ln.Addr().String(), Context: 16384, Slots: 1})
	for i := range 4 {
		resp := post(t, context.Background(), srv.URL, `{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}]}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"hi"`) {
			t.Fatalf("request %d: HTTP %d %s", i, resp.StatusCode, b)
		}
	}
}
