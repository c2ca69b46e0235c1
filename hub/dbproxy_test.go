package hub

import (
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"fleet/internal/pgtest"
)

// dbProxy stands between a store and the test's PostgreSQL: a loopback
// TCP port that forwards to the cluster's unix socket, which the test can
// cut (every connection closed, new ones refused) and restore, as a
// database that becomes unreachable and comes back looks to a hub.
type dbProxy struct {
	t      *testing.T
	socket string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// newDBProxy makes a database (pgtest.URL) and a proxy to it, up; it
// returns the proxy and two URLs of that one database: through the proxy,
// and direct.
func newDBProxy(t *testing.T) (p *dbProxy, proxied, direct string) {
	direct = pgtest.URL(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	dir := q.Get("host")
	if dir == "" || !filepath.IsAbs(dir) {
		t.Skipf("the test database %s is not on a unix socket; this test cuts a proxy to one", direct)
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	p = &dbProxy{t: t, socket: filepath.Join(dir, ".s.PGSQL."+port), conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() {
		p.down()
		p.wg.Wait()
	})
	q.Del("host")
	q.Set("sslmode", "disable")
	u.Host = p.addr
	u.RawQuery = q.Encode()
	return p, u.String(), direct
}

func (p *dbProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", p.socket)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln { // cut meanwhile
				p.mu.Unlock()
				c.Close()
				s.Close()
				return
			}
			p.conns[c], p.conns[s] = true, true
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{c, s}, {s, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
}

// down cuts the database off: no connection works until up.
func (p *dbProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// up lets connections through again, on the same address.
func (p *dbProxy) up() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("the database proxy cannot listen on %s again: %v", p.addr, err)
	}
	p.serve(ln)
}
