// Package netnstest gives a test a machine of its own on a network it can
// cut: a Linux network namespace joined to the test's namespace by a veth
// pair, with a private /30 that exists only between the two (New), or
// several namespaces on one LAN, a bridge in the test's namespace with a
// private /24 (NewBridge, Join). Cut makes a namespace's link drop every
// packet both ways with no reset and no ICMP, as a laptop going to sleep or
// a Wi-Fi drop does; Restore brings it back. Do runs Go code inside a
// namespace, so a test can listen there. It is imported only by _test.go
// files.
//
// It needs root (CAP_NET_ADMIN), iproute2's ip and nftables' nft (the
// silence is an nftables table inside the namespace, so nothing outside it
// changes); tests are skipped, with a message that says what is missing,
// only where they are absent.
package netnstest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Namespace is one network namespace with a veth link to the test's own,
// directly or through a Bridge.
type Namespace struct {
	t testing.TB
	// Name is the namespace's name (ip netns).
	Name string
	// HostIf and NSIf are the two ends of the veth pair; on a bridge,
	// HostIf is the bridge's port.
	HostIf, NSIf string
	// HostIP is the test's end of the link (the bridge's address), IP the
	// namespace's.
	HostIP, IP string
}

// Tools are the programs a Namespace needs, with their Debian packages.
var Tools = map[string]string{"ip": "iproute2", "nft": "nftables"}

// Skip skips t unless namespaces can be made here: root and iproute2.
func Skip(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespace tests need root (CAP_NET_ADMIN); run the tests as root, as CI does")
	}
	for tool, pkg := range Tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("network namespace tests need %s: install %s (.ci/run does)", tool, pkg)
		}
	}
}

// New makes a namespace with loopback up and a veth link to the test's
// namespace on a free private /30. It is removed when the test ends, even
// when it fails, with every process still running inside it.
func New(t testing.TB) *Namespace {
	t.Helper()
	Skip(t)
	id := randomHex(t, 4)
	n := &Namespace{t: t, Name: "fleet-test-" + id, HostIf: "fl" + id + "h", NSIf: "fl" + id + "n"}
	host, ip := freeSubnet(t)
	n.HostIP, n.IP = host, ip
	t.Cleanup(n.remove)
	n.ip("netns", "add", n.Name)
	n.ip("link", "add", n.HostIf, "type", "veth", "peer", "name", n.NSIf)
	n.ip("link", "set", n.NSIf, "netns", n.Name)
	n.ip("addr", "add", n.HostIP+"/30", "dev", n.HostIf)
	n.ip("link", "set", n.HostIf, "up")
	n.inside("ip", "link", "set", "lo", "up")
	n.inside("ip", "addr", "add", n.IP+"/30", "dev", n.NSIf)
	n.inside("ip", "link", "set", n.NSIf, "up")
	return n
}

// Command is argv run inside the namespace.
func (n *Namespace) Command(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", n.Name}, argv...)
}

// Do runs f on an OS thread moved into the namespace, so the sockets f
// opens (a listener, say) live there and stay there once it returns.
func (n *Namespace) Do(f func() error) error { return Do(n.Name, f) }

// Do is Namespace.Do for any namespace ip netns knows by name, one a test
// made itself included.
func Do(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open(filepath.Join("/run/netns", name))
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering netns %s: %w", name, err)
			return
		}
		err = f()
		// A thread that cannot get home ends with this goroutine rather
		// than run other goroutines in the wrong namespace.
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Cut makes the link drop every packet in both directions, silently:
// connections stay open on both ends and simply hear nothing.
func (n *Namespace) Cut() {
	n.t.Helper()
	rules := fmt.Sprintf(`table inet fleet_cut {
	chain in { type filter hook input priority -300; policy accept; iifname %q drop; }
	chain out { type filter hook output priority -300; policy accept; oifname %q drop; }
}
`, n.NSIf, n.NSIf)
	c := exec.Command("ip", "netns", "exec", n.Name, "nft", "-f", "-")
	c.Stdin = strings.NewReader(rules)
	if out, err := c.CombinedOutput(); err != nil {
		n.t.Fatalf("cutting %s: nft: %v\n%s", n, err, out)
	}
}

// Restore undoes Cut.
func (n *Namespace) Restore() {
	n.t.Helper()
	n.inside("nft", "delete", "table", "inet", "fleet_cut")
}

func (n *Namespace) remove() {
	// Processes left inside (engines a test launched there) are the
	// test's own by construction; they would keep the namespace alive.
	if out, err := exec.Command("ip", "netns", "pids", n.Name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = exec.Command("ip", "link", "del", n.HostIf).Run()
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
}

func (n *Namespace) ip(args ...string) { n.t.Helper(); n.run(append([]string{"ip"}, args...)...) }

func (n *Namespace) inside(argv ...string) { n.t.Helper(); n.run(n.Command(argv...)...) }

func (n *Namespace) run(argv ...string) {
	n.t.Helper()
	var out bytes.Buffer
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		n.t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out.String())
	}
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// freeSubnet picks a /30 in 10.231.0.0/16 that no interface here uses and
// returns its two host addresses.
func freeSubnet(t testing.TB) (string, string) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b := make([]byte, 2)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		base := net.IPv4(10, 231, b[0], b[1]&^3)
		_, subnet, _ := net.ParseCIDR(base.String() + "/30")
		taken := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && (subnet.Contains(ipn.IP) || ipn.Contains(base)) {
				taken = true
			}
		}
		if !taken {
			return net.IPv4(10, 231, b[0], b[1]&^3|1).String(), net.IPv4(10, 231, b[0], b[1]&^3|2).String()
		}
	}
	t.Fatal("no free /30 in 10.231.0.0/16")
	return "", ""
}

// String names the namespace and its addresses, for logs.
func (n *Namespace) String() string {
	return fmt.Sprintf("netns %s (%s, host %s)", n.Name, n.IP, n.HostIP)
}
