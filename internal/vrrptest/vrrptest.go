// Package vrrptest runs keepalived, Debian's VRRP daemon, in network
// namespaces of a test, to move a virtual IP between hubs as a lab's
// machines would: each member holds the address only while its check of
// the hub (curl on /healthz) passes. It is imported only by _test.go files; the configuration it
// writes is the one docs/several-hubs.md shows.
//
// It needs root and keepalived (apt-get install keepalived; .ci/run does);
// tests are skipped, with a message saying what to install, only where it
// is absent.
package vrrptest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet/internal/netnstest"
	"fleet/internal/syncbuf"
)

// Member is one keepalived's view of the group.
type Member struct {
	// Name names the member in keepalived's log (router_id).
	Name string
	// Interface carries the VRRP adverts and the virtual IP; IP is this
	// member's address on it, Peers the other members' (VRRP by unicast,
	// so nothing depends on multicast on the LAN).
	Interface, IP string
	Peers         []string
	// VIP is the virtual IP with its prefix length, e.g. 10.0.0.100/24.
	VIP string
	// RouterID is VRRP's virtual_router_id (1-255), the same for every
	// member; Priority orders the members found healthy within about a
	// second of each other; the first found healthy takes the address
	// and keeps it (nopreempt) until its check fails.
	RouterID, Priority int
	// HealthURL is what the check script asks (curl, 1 s timeout); any
	// answer but 2xx, or none, is a failure.
	HealthURL string
}

// Curl is the check script's program.
const Curl = "/usr/bin/curl"

// Config is the keepalived.conf of m.
func Config(m Member) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global_defs {
    router_id %s
    # The check runs as nobody; keepalived refuses a script anyone could edit.
    script_user nobody
    enable_script_security
}

# /healthz answers 200 while this hub can route; one failure (the hub
# dead, hung for a second, or unable to route) takes the address away from
# it, two successes in a row make it a candidate again.
vrrp_script fleet_healthz {
    script "%s -fsS -m 1 -o /dev/null %s"
    interval 1
    timeout 2
    fall 1
    rise 2
}
`, m.Name, Curl, m.HealthURL)
	fmt.Fprintf(&b, `
vrrp_instance fleet {
    # Every hub starts as a backup; the first one found healthy takes the
    # address (priority decides only between hubs found healthy within
    # about a second of each other) and keeps it while its check passes
    # (nopreempt): a hub that starts later or comes back does not move the
    # clients again.
    state BACKUP
    nopreempt
    interface %s
    virtual_router_id %d
    priority %d
    version 3
    advert_int 0.5
    unicast_src_ip %s
    unicast_peer {
`, m.Interface, m.RouterID, m.Priority, m.IP)
	for _, p := range m.Peers {
		fmt.Fprintf(&b, "        %s\n", p)
	}
	fmt.Fprintf(&b, `    }
    virtual_ipaddress {
        %s dev %s
    }
    track_script {
        fleet_healthz
    }
`, m.VIP, m.Interface)
	b.WriteString("}\n")
	return b.String()
}

// Members are the members of one group on bridge b, one per namespace,
// holding vip (an address of b's subnet): priorities fall in the order of
// nss, so the first takes the address first. The caller sets HealthURL
// of each.
func Members(b *netnstest.Bridge, vip string, nss ...*netnstest.Namespace) []Member {
	ms := make([]Member, len(nss))
	for i, n := range nss {
		var peers []string
		for j, o := range nss {
			if j != i {
				peers = append(peers, o.IP)
			}
		}
		ms[i] = Member{
			Name: n.Name, Interface: n.NSIf, IP: n.IP, Peers: peers,
			VIP: fmt.Sprintf("%s/%d", vip, netnstest.BridgePrefix), RouterID: 51, Priority: 150 - 10*i,
		}
	}
	return ms
}

// Skip skips t unless keepalived can run here: root, iproute2, keepalived
// and curl.
func Skip(t testing.TB) {
	t.Helper()
	netnstest.Skip(t)
	if _, err := exec.LookPath("keepalived"); err != nil {
		t.Skip("keepalived is not installed: apt-get install keepalived (.ci/run does)")
	}
	if _, err := os.Stat(Curl); err != nil {
		t.Skipf("the check script needs %s: apt-get install curl", Curl)
	}
}

// Keepalived is one keepalived running in a namespace.
type Keepalived struct {
	t      testing.TB
	ns     *netnstest.Namespace
	member Member
	dir    string
	log    *syncbuf.Buffer
	cmd    *exec.Cmd
	done   chan struct{}
}

// Start writes m's keepalived.conf into a temp dir and runs keepalived in
// ns on it, in the foreground with pid files of its own (so several run on
// one machine), VRRP only. It is stopped when the test ends; its log is
// written to the test if it failed.
func Start(t testing.TB, ns *netnstest.Namespace, m Member) *Keepalived {
	t.Helper()
	Skip(t)
	k := &Keepalived{t: t, ns: ns, member: m, dir: t.TempDir(), log: &syncbuf.Buffer{}, done: make(chan struct{})}
	conf := filepath.Join(k.dir, "keepalived.conf")
	if err := os.WriteFile(conf, []byte(Config(m)), 0o644); err != nil {
		t.Fatal(err)
	}
	argv := ns.Command("keepalived", "--dont-fork", "--log-console", "--log-detail", "--no-syslog", "--vrrp",
		"--use-file", conf, "--pid", filepath.Join(k.dir, "keepalived.pid"),
		"--vrrp_pid", filepath.Join(k.dir, "vrrp.pid"), "--checkers_pid", filepath.Join(k.dir, "checkers.pid"))
	k.cmd = exec.Command(argv[0], argv[1:]...)
	k.cmd.Dir = k.dir
	k.cmd.Stdout, k.cmd.Stderr = k.log, k.log
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("starting keepalived in %s: %v", ns, err)
	}
	go func() { _ = k.cmd.Wait(); close(k.done) }()
	t.Cleanup(func() {
		k.Stop()
		// keepalived skips what it does not understand and says so, with
		// the line, and runs on without it.
		if strings.Contains(k.log.String(), conf+": Line ") {
			t.Errorf("keepalived in %s ignored parts of its configuration:\n%s\n%s", ns.Name, k.log.String(), Config(m))
		}
		if t.Failed() {
			t.Logf("keepalived in %s (%s):\n%s", ns.Name, m.Name, k.log.String())
		}
	})
	return k
}

// Stop ends keepalived (which drops the address if it holds it) and waits
// for it and its VRRP child to exit.
func (k *Keepalived) Stop() {
	select {
	case <-k.done:
		return
	default:
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(10 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
	// The VRRP child exits with its parent; a SIGKILLed parent leaves it
	// to the namespace's removal, which kills whatever is still inside.
}

// Holds says whether the member's namespace has the virtual IP now.
func (k *Keepalived) Holds() bool {
	k.t.Helper()
	out, err := exec.Command("ip", "-n", k.ns.Name, "-o", "addr", "show", "dev", k.member.Interface).CombinedOutput()
	if err != nil {
		k.t.Fatalf("ip addr in %s: %v\n%s", k.ns, err, out)
	}
	return strings.Contains(string(out), " "+k.member.VIP+" ")
}

// Log is keepalived's output so far.
func (k *Keepalived) Log() string { return k.log.String() }

// Holders are the indexes of the members of ks that hold the virtual IP
// now: one in a steady state, none or (for an advert's time) two while it
// moves.
func Holders(ks []*Keepalived) []int {
	var hs []int
	for i, k := range ks {
		if k.Holds() {
			hs = append(hs, i)
		}
	}
	return hs
}

// StartGroup starts members[i] in nss[i] in order, waiting for the first
// to hold the virtual IP before starting the others, so the first holds it
// until its check fails (nopreempt), whichever member keepalived would
// otherwise have elected.
func StartGroup(t testing.TB, nss []*netnstest.Namespace, members []Member) []*Keepalived {
	t.Helper()
	ks := []*Keepalived{Start(t, nss[0], members[0])}
	for deadline := time.Now().Add(60 * time.Second); !ks[0].Holds(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("keepalived in %s did not take the virtual IP %s within 60 s alone:\n%s", nss[0], members[0].VIP, ks[0].Log())
		}
	}
	for i := 1; i < len(nss); i++ {
		ks = append(ks, Start(t, nss[i], members[i]))
	}
	return ks
}
