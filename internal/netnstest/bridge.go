package netnstest

import (
	"crypto/rand"
	"fmt"
	"net"
	"os/exec"
	"sync"
	"testing"
)

// Bridge is a Linux bridge in the test's namespace with an address of its
// own on a private /24: one LAN that several namespaces join (Join), the
// test reaching each of them, and they each other, as machines on one
// switch do. Addresses are handed out in order; NewIP reserves one that no
// namespace gets, for a virtual IP.
type Bridge struct {
	t testing.TB
	// Name is the bridge's interface; IP the test's address on it.
	Name, IP string
	subnet   [3]byte // the /24's first three octets

	mu   sync.Mutex
	next byte // the last octet of the next address handed out
}

// BridgePrefix is the length of a Bridge's subnet.
const BridgePrefix = 24

// NewBridge makes a bridge on a free /24 in 10.232.0.0/16, up and
// addressed; it is deleted when the test ends (after the namespaces that
// joined it, which were made later).
func NewBridge(t testing.TB) *Bridge {
	t.Helper()
	Skip(t)
	b := &Bridge{t: t, Name: "flb" + randomHex(t, 4), next: 2}
	b.subnet = freeSlash24(t)
	b.IP = b.addr(1)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", b.Name).Run() })
	b.run("ip", "link", "add", b.Name, "type", "bridge")
	b.run("ip", "addr", "add", b.IP+fmt.Sprintf("/%d", BridgePrefix), "dev", b.Name)
	b.run("ip", "link", "set", b.Name, "up")
	return b
}

// NewIP returns an address on the bridge's subnet that nothing has yet.
func (b *Bridge) NewIP() string {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next == 255 {
		b.t.Fatalf("bridge %s: every address of its /24 is handed out", b.Name)
	}
	ip := b.addr(b.next)
	b.next++
	return ip
}

// Join makes a namespace on the bridge: loopback up, one veth whose far
// end is a port of the bridge, an address of its own on the bridge's
// subnet. HostIP is the bridge's address. It is removed when t ends, with
// every process still in it; Cut and Restore work as for New.
func (b *Bridge) Join(t testing.TB) *Namespace {
	t.Helper()
	id := randomHex(t, 4)
	n := &Namespace{t: t, Name: "fleet-test-" + id, HostIf: "fl" + id + "h", NSIf: "fl" + id + "n", HostIP: b.IP, IP: b.NewIP()}
	t.Cleanup(n.remove)
	n.ip("netns", "add", n.Name)
	n.ip("link", "add", n.HostIf, "type", "veth", "peer", "name", n.NSIf)
	n.ip("link", "set", n.NSIf, "netns", n.Name)
	n.ip("link", "set", n.HostIf, "master", b.Name)
	n.ip("link", "set", n.HostIf, "up")
	n.inside("ip", "link", "set", "lo", "up")
	n.inside("ip", "addr", "add", fmt.Sprintf("%s/%d", n.IP, BridgePrefix), "dev", n.NSIf)
	n.inside("ip", "link", "set", n.NSIf, "up")
	return n
}

func (b *Bridge) addr(last byte) string {
	return net.IPv4(b.subnet[0], b.subnet[1], b.subnet[2], last).String()
}

func (b *Bridge) run(argv ...string) {
	b.t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		b.t.Fatalf("%v: %v\n%s", argv, err, out)
	}
}

// String names the bridge and its subnet, for logs.
func (b *Bridge) String() string {
	return fmt.Sprintf("bridge %s (%s/%d)", b.Name, b.addr(0), BridgePrefix)
}

// freeSlash24 picks a /24 in 10.232.0.0/16 that no interface here touches.
func freeSlash24(t testing.TB) [3]byte {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		var r [1]byte
		if _, err := rand.Read(r[:]); err != nil {
			t.Fatal(err)
		}
		_, subnet, _ := net.ParseCIDR(fmt.Sprintf("10.232.%d.0/24", r[0]))
		taken := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && (subnet.Contains(ipn.IP) || ipn.Contains(subnet.IP)) {
				taken = true
			}
		}
		if !taken {
			return [3]byte{10, 232, r[0]}
		}
	}
	t.Fatal("no free /24 in 10.232.0.0/16")
	return [3]byte{}
}
