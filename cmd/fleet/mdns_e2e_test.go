package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hmdns "github.com/hashicorp/mdns"
	"github.com/miekg/dns"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"fleet/internal/netnstest"
)

// lanPair is two network namespaces joined by a veth pair: the hub's
// machine and a laptop on the same LAN, with no other traffic on it.
type lanPair struct {
	hubNS, laptopNS string
	hubIP, laptopIP string
	hubIf, laptopIf string
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newLANPair makes the namespaces; they are removed when the test ends,
// failed or not (removing a namespace removes its end of the veth pair).
func newLANPair(t *testing.T) *lanPair {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2) to make network namespaces: apt-get install iproute2")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces (CI runs as root)")
	}
	id := os.Getpid() % 100000
	l := &lanPair{
		hubNS: fmt.Sprintf("fleet-mdns-hub-%d", id), laptopNS: fmt.Sprintf("fleet-mdns-lap-%d", id),
		hubIf: fmt.Sprintf("fmh%d", id), laptopIf: fmt.Sprintf("fml%d", id),
		hubIP: "10.213.0.1", laptopIP: "10.213.0.2",
	}
	t.Cleanup(func() {
		for _, ns := range []string{l.hubNS, l.laptopNS} {
			// What the test started in its namespaces (a daemonised
			// avahi-daemon among them) ends with them.
			if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
				for _, pid := range strings.Fields(string(out)) {
					exec.Command("kill", pid).Run()
				}
			}
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	ipCmd(t, "netns", "add", l.hubNS)
	ipCmd(t, "netns", "add", l.laptopNS)
	ipCmd(t, "link", "add", l.hubIf, "netns", l.hubNS, "type", "veth", "peer", "name", l.laptopIf, "netns", l.laptopNS)
	for _, side := range []struct{ ns, ifname, ip string }{{l.hubNS, l.hubIf, l.hubIP}, {l.laptopNS, l.laptopIf, l.laptopIP}} {
		ipCmd(t, "-n", side.ns, "addr", "add", side.ip+"/24", "dev", side.ifname)
		ipCmd(t, "-n", side.ns, "link", "set", side.ifname, "up")
		ipCmd(t, "-n", side.ns, "link", "set", "lo", "up")
	}
	// A laptop has a default route; this one has the multicast route that
	// stands for it.
	ipCmd(t, "-n", l.laptopNS, "route", "add", "224.0.0.0/4", "dev", l.laptopIf)
	return l
}

// queryA asks for name's A record the way a laptop's resolver does: a
// multicast query from port 5353 to 224.0.0.251:5353.
func queryA(name string) ([]net.IP, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: 5353})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.RecursionDesired = false
	b, err := q.Pack()
	if err != nil {
		return nil, err
	}
	if _, err := c.WriteTo(b, &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5353}); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 9000)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return nil, err
		}
		var m dns.Msg
		if m.Unpack(buf[:n]) != nil || !m.Response {
			continue // our own query, looped back, or noise
		}
		var ips []net.IP
		for _, rr := range m.Answer {
			if a, ok := rr.(*dns.A); ok && strings.EqualFold(a.Hdr.Name, dns.Fqdn(name)) {
				ips = append(ips, a.A)
			}
		}
		if len(ips) > 0 {
			return ips, nil
		}
	}
}

// TestSSHFleetLocalFromAnotherMachine: a hub whose console listens off
// loopback answers, on another machine of its LAN, the mDNS queries `ssh
// fleet.local` makes (fleet.local's address, the _ssh._tcp service and its
// port), and the console there takes the admin's key and nothing else. It
// prints the ~/.ssh/config stanza for its port; without --admin-keys (and
// no console user) it refuses to start off loopback.
func TestSSHFleetLocalFromAnotherMachine(t *testing.T) {
	lan := newLANPair(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	const port = 22022 // inside the test's own namespace: nothing else binds there
	console := fmt.Sprintf("0.0.0.0:%d", port)
	wrap := []string{"ip", "netns", "exec", lan.hubNS}

	out, code := runServe(t, wrap, data, "--ssh", console)
	if code == 0 || !strings.Contains(out, "no --admin-keys") {
		t.Fatalf("serve off loopback without admin keys: exit %d, want a refusal naming --admin-keys; output:\n%s", code, out)
	}

	key, pub := sshKey(t, dir, "admin")
	adminKeys := filepath.Join(dir, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(pub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hubOut, stopHub := serveIn(t, lan.hubNS, data, filepath.Join(dir, "hub.log"), "--ssh", console, "--admin-keys", adminKeys)
	waitOutput(t, hubOut, fmt.Sprintf("Host fleet.local\n        Port %d\n", port))

	// The laptop resolves fleet.local (what `ssh fleet.local` does first).
	var ips []net.IP
	err := netnstest.Do(lan.laptopNS, func() error {
		var err error
		for i := 0; i < 15; i++ {
			if ips, err = queryA("fleet.local"); err == nil {
				return nil
			}
		}
		return err
	})
	if err != nil || len(ips) != 1 || ips[0].String() != lan.hubIP {
		t.Fatalf("A query for fleet.local from the laptop's namespace: %v, %v; want [%s]", ips, err, lan.hubIP)
	}

	// It browses the console's _ssh._tcp service (as ssh-discovery tools and
	// Finder do) and finds the host and port.
	var found *hmdns.ServiceEntry
	err = netnstest.Do(lan.laptopNS, func() error {
		ifi, err := net.InterfaceByName(lan.laptopIf)
		if err != nil {
			return err
		}
		for i := 0; i < 15 && found == nil; i++ {
			entries := make(chan *hmdns.ServiceEntry, 16)
			p := hmdns.DefaultParams("_ssh._tcp")
			p.Entries, p.Interface, p.DisableIPv6, p.Timeout = entries, ifi, true, 2*time.Second
			p.Logger = log.New(io.Discard, "", 0)
			if err := hmdns.Query(p); err != nil {
				return err
			}
			close(entries)
			for e := range entries {
				if e.Host == "fleet.local." {
					found = e
				}
			}
		}
		return nil
	})
	if err != nil || found == nil {
		t.Fatalf("browsing _ssh._tcp from the laptop's namespace: %v, found %+v", err, found)
	}
	if found.Port != port || found.AddrV4.String() != lan.hubIP {
		t.Fatalf("_ssh._tcp says %s:%d; want %s:%d", found.AddrV4, found.Port, lan.hubIP, port)
	}

	// The laptop connects where mDNS said: the admin's key gets the console's
	// commands; a password and an unknown key get nothing.
	signer := loadSigner(t, key)
	strangerKey, _ := sshKey(t, dir, "stranger")
	stranger := loadSigner(t, strangerKey)
	target := net.JoinHostPort(ips[0].String(), fmt.Sprint(found.Port))
	run := func(auth ssh.AuthMethod, cmd string) (string, error) {
		var out string
		err := netnstest.Do(lan.laptopNS, func() error {
			conn, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				return err
			}
			cc, chans, reqs, err := ssh.NewClientConn(conn, "fleet.local:22022", &ssh.ClientConfig{
				User: "ops", Auth: []ssh.AuthMethod{auth},
				HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second,
			})
			if err != nil {
				conn.Close()
				return err
			}
			client := ssh.NewClient(cc, chans, reqs)
			defer client.Close()
			s, err := client.NewSession()
			if err != nil {
				return err
			}
			b, err := s.CombinedOutput(cmd)
			out = string(b)
			return err
		})
		return out, err
	}
	if out, err := run(ssh.PublicKeys(signer), "whoami"); err != nil || !strings.Contains(out, "(admin)") {
		t.Fatalf("the admin's key over the LAN: %q, %v; want the admin's identity", out, err)
	}
	if _, err := run(ssh.Password("admin"), "whoami"); err == nil {
		t.Fatal("a password logged in to the console off loopback; want public keys only")
	}
	if _, err := run(ssh.PublicKeys(stranger), "whoami"); err == nil {
		t.Fatal("an unknown key logged in to the console off loopback")
	}

	stopHub()

	// A console bound to the LAN address under another name is announced
	// as that name with that address; --mdns= announces nothing.
	for _, tt := range []struct {
		flag, answers, silent string
	}{
		{flag: "--mdns=lab", answers: "lab.local", silent: "fleet.local"},
		{flag: "--mdns=", silent: "fleet.local"},
	} {
		out, stop := serveIn(t, lan.hubNS, data, filepath.Join(dir, "hub"+tt.flag+".log"),
			"--ssh", net.JoinHostPort(lan.hubIP, fmt.Sprint(port)), tt.flag)
		if tt.answers != "" {
			var ips []net.IP
			err := netnstest.Do(lan.laptopNS, func() error {
				var err error
				for i := 0; i < 15; i++ {
					if ips, err = queryA(tt.answers); err == nil {
						return nil
					}
				}
				return err
			})
			if err != nil || len(ips) != 1 || ips[0].String() != lan.hubIP {
				t.Fatalf("%s: A query for %s: %v, %v; want [%s]\n%s", tt.flag, tt.answers, ips, err, lan.hubIP, out())
			}
			waitOutput(t, out, fmt.Sprintf("Host %s\n        Port %d\n", tt.answers, port))
		}
		err := netnstest.Do(lan.laptopNS, func() error {
			_, err := queryA(tt.silent)
			return err
		})
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%s: the hub answered for %s (err %v):\n%s", tt.flag, tt.silent, err, out())
		}
		if strings.Contains(out(), tt.silent) {
			t.Fatalf("%s: serve names %s:\n%s", tt.flag, tt.silent, out())
		}
		stop() // the next hub takes the data dir's lock
	}
}

// waitOutput waits for a hub to print want (the ~/.ssh/config stanza comes
// once the hub is ready, a moment after its control socket answers).
func waitOutput(t *testing.T, output func() string, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(output(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not print %q:\n%s", want, output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serveIn runs `fleet serve` in namespace ns until stop (or the test's
// end) and returns its output so far.
func serveIn(t *testing.T, ns, data, logPath string, flags ...string) (output func() string, stop func()) {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"netns", "exec", ns, fleetBin, "--data", data, "serve", "--http", "127.0.0.1:18080"}, flags...)
	hub := exec.Command("ip", args...)
	hub.Stdout, hub.Stderr = logf, logf
	if err := hub.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() {
		if hub.ProcessState == nil {
			hub.Process.Signal(unix.SIGTERM)
			hub.Wait()
		}
		logf.Close()
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", filepath.Base(logPath), b)
		}
	})
	waitControl(t, data)
	return func() string { b, _ := os.ReadFile(logPath); return string(b) }, stop
}

func loadSigner(t *testing.T, path string) ssh.Signer {
	t.Helper()
	pem, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSSHFleetLocalWithAvahi is `ssh fleet.local` as a Linux laptop types it:
// OpenSSH resolves the name through nss-mdns and avahi-daemon (run in the
// laptop's namespace, with its own /run and nsswitch.conf), with the
// ~/.ssh/config stanza exactly as serve printed it.
func TestSSHFleetLocalWithAvahi(t *testing.T) {
	for _, need := range []string{"/usr/sbin/avahi-daemon", "/usr/bin/unshare", "/usr/bin/ssh"} {
		if _, err := os.Stat(need); err != nil {
			t.Skipf("needs %s (apt-get install avahi-daemon libnss-mdns openssh-client util-linux; "+
				"with a policy-rc.d that keeps avahi from starting on the host's own network)", need)
		}
	}
	if matches, _ := filepath.Glob("/usr/lib/*/libnss_mdns4_minimal.so.2"); len(matches) == 0 {
		t.Skip("needs nss-mdns (apt-get install libnss-mdns)")
	}
	lan := newLANPair(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	key, pub := sshKey(t, dir, "admin")
	adminKeys := filepath.Join(dir, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(pub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := serveIn(t, lan.hubNS, data, filepath.Join(dir, "hub.log"), "--ssh", "0.0.0.0:22022", "--admin-keys", adminKeys)
	waitOutput(t, out, "        Port 22022\n")
	var stanza strings.Builder
	for _, line := range strings.SplitAfter(out(), "\n") {
		if strings.HasPrefix(line, "    Host ") || strings.HasPrefix(line, "        Port ") {
			stanza.WriteString(strings.TrimPrefix(line, "    "))
		}
	}
	files := map[string]string{
		"ssh_config":    stanza.String(),
		"avahi.conf":    "[server]\nuse-ipv6=no\nallow-interfaces=" + lan.laptopIf + "\nenable-dbus=no\n[publish]\ndisable-publishing=yes\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files mdns4_minimal [NOTFOUND=return]\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf(`set -e
mkdir -p /run/avahi-daemon && mount -t tmpfs tmpfs /run/avahi-daemon
mount --bind %[1]s/nsswitch.conf /etc/nsswitch.conf
avahi-daemon --no-drop-root --no-chroot -f %[1]s/avahi.conf -D
trap 'avahi-daemon -k' EXIT
for i in $(seq 1 30); do getent hosts fleet.local && break; sleep 1; done
ssh -F %[1]s/ssh_config -i %[2]s -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new \
  -o UserKnownHostsFile=%[1]s/known_hosts -o ConnectTimeout=10 -o LogLevel=ERROR fleet.local whoami
`, dir, key)
	cmd := exec.Command("ip", "netns", "exec", lan.laptopNS, "unshare", "-m", "--propagation", "private", "bash", "-c", script)
	got, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(got), lan.hubIP+" ") || !strings.Contains(string(got), "admin (admin)") {
		t.Fatalf("ssh fleet.local from the laptop (stanza %q): %v\n%s", stanza.String(), err, got)
	}
}
