package netnstest

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// listenIn opens a TCP listener at ip inside n that accepts and closes
// connections until the test ends.
func listenIn(t *testing.T, n *Namespace, ip string) string {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(ip, "0")); return err }); err != nil {
		t.Fatalf("listen in %s: %v", n, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// dialOnce tries once to connect to addr from n (nil: the test's
// namespace), giving up after half a second: a cut link answers nothing.
func dialOnce(n *Namespace, addr string) error {
	try := func() error {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	}
	if n == nil {
		return try()
	}
	return n.Do(try)
}

// dial connects to addr from n, trying for up to 10 s: a link just made
// or restored on a busy machine may lose the first SYN or ARP request.
func dial(n *Namespace, addr string) error {
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if err = dialOnce(n, addr); err == nil {
			return nil
		}
	}
	return err
}

func netnsExists(name string) bool {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name {
			return true
		}
	}
	return false
}

// TestVethNamespaceCutAndRestore: the test reaches a namespace over its
// /30; Cut silences it (a connection attempt hears nothing), Restore
// brings it back; the namespace is gone when its test ends.
func TestVethNamespaceCutAndRestore(t *testing.T) {
	Skip(t)
	var name string
	t.Run("namespace", func(t *testing.T) {
		n := New(t)
		name = n.Name
		addr := listenIn(t, n, n.IP)
		if err := dial(nil, addr); err != nil {
			t.Fatalf("the test cannot reach %s: %v", n, err)
		}
		n.Cut()
		if err := dialOnce(nil, addr); err == nil {
			t.Fatalf("the test still reaches %s after Cut", n)
		}
		n.Restore()
		if err := dial(nil, addr); err != nil {
			t.Fatalf("the test cannot reach %s after Restore: %v", n, err)
		}
	})
	if netnsExists(name) {
		t.Errorf("namespace %s outlived its test", name)
	}
}

// TestBridgeJoinsNamespaces: three namespaces on one bridge reach each
// other and are reached by the test at their own addresses; Cut silences
// one of them for everyone while the others still talk; after the test,
// the namespaces and the bridge are gone.
func TestBridgeJoinsNamespaces(t *testing.T) {
	Skip(t)
	var names []string
	var bridge string
	t.Run("bridge", func(t *testing.T) {
		b := NewBridge(t)
		bridge = b.Name
		var ns []*Namespace
		var addrs []string
		seen := map[string]bool{b.IP: true}
		for range 3 {
			n := b.Join(t)
			if seen[n.IP] || n.HostIP != b.IP {
				t.Fatalf("%s: address taken twice or host address is not the bridge's (%s)", n, b.IP)
			}
			seen[n.IP] = true
			ns, names = append(ns, n), append(names, n.Name)
			addrs = append(addrs, listenIn(t, n, n.IP))
		}
		if vip := b.NewIP(); seen[vip] || !strings.HasPrefix(vip, strings.TrimSuffix(b.IP, "1")) {
			t.Errorf("NewIP gave %s: taken, or not on %s", vip, b)
		}
		for i, addr := range addrs {
			if err := dial(nil, addr); err != nil {
				t.Errorf("the test cannot reach %s: %v", ns[i], err)
			}
			from := ns[(i+1)%3]
			if err := dial(from, addr); err != nil {
				t.Errorf("%s cannot reach %s across the bridge: %v", from, ns[i], err)
			}
		}
		ns[0].Cut()
		if err := dialOnce(nil, addrs[0]); err == nil {
			t.Errorf("the test still reaches %s after Cut", ns[0])
		}
		if err := dialOnce(ns[1], addrs[0]); err == nil {
			t.Errorf("%s still reaches %s after Cut", ns[1], ns[0])
		}
		if err := dial(ns[1], addrs[2]); err != nil {
			t.Errorf("cutting %s also cut %s from %s: %v", ns[0], ns[2], ns[1], err)
		}
		ns[0].Restore()
		if err := dial(ns[1], addrs[0]); err != nil {
			t.Errorf("%s cannot reach %s after Restore: %v", ns[1], ns[0], err)
		}
	})
	for _, n := range names {
		if netnsExists(n) {
			t.Errorf("namespace %s outlived its test", n)
		}
	}
	if exec.Command("ip", "link", "show", bridge).Run() == nil {
		t.Errorf("bridge %s outlived its test", bridge)
	}
}
