package main

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/netnstest"
	"fleet/internal/pgtest"
	"fleet/internal/sshdtest"
	"fleet/internal/vrrptest"
)

// TestFollowerConsoleThroughTheVirtualIP: three hubs on one PostgreSQL
// database, each serving the SSH console as docs/several-hubs.md sets them
// up (one host key, keepalived moving one address), the address on a
// follower. The operator's OpenSSH client, in a real terminal (tmux),
// reaches the console through the virtual IP: its title says which hub and
// that it follows; a drain there is carried out by the leader. With
// PostgreSQL stopped, `fleet status` answers on every hub and says what it
// could not read, on the control socket and over SSH; once it is back, a
// hub killed with kill -9 is listed as gone.
func TestFollowerConsoleThroughTheVirtualIP(t *testing.T) {
	vrrptest.Skip(t)
	if _, err := os.Stat(sshdtest.Path); err != nil {
		t.Skipf("OpenSSH server not installed (%s missing): install openssh-server", sshdtest.Path)
	}
	for _, bin := range []string{"ssh", "ssh-keygen", "tmux"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (apt-get install -y openssh-client tmux): this test drives the real OpenSSH client inside tmux", bin)
		}
	}
	pg := pgtest.StartCluster(t)
	bridge := netnstest.NewBridge(t)

	nodeNS := bridge.Join(t)
	node := sshdtest.NewOn(t, nodeNS.IP, nodeNS.Command())
	node.Start()
	fleetFile := filepath.Join(t.TempDir(), "fleet.yaml")
	file := fmt.Sprintf("nodes:\n  - name: rig\n    address: %s\n    identity: %s\n", node.Address(), node.Identity()) +
		sshFleetModel + "placements:\n  - model: qwen3-4b\n    nodes: [rig]\n    engine: sim\n"
	if err := os.WriteFile(fleetFile, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}

	keys := t.TempDir()
	opKey, opPub := sshKey(t, keys, "operator")
	adminKeys := filepath.Join(keys, "admin_keys")
	if err := os.WriteFile(adminKeys, []byte(opPub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const port, sshPort = 8080, 2222 // every hub's, in its own namespace
	nss := []*netnstest.Namespace{bridge.Join(t), bridge.Join(t), bridge.Join(t)}
	names := []string{"hub1", "hub2", "hub3"}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	// Off loopback a hub requires an API key: made before any hub runs.
	create := exec.Command(fleetBin, "key", "create", "client", "--data", dirs[0])
	create.Env = append(os.Environ(), "FLEET_DATABASE_URL="+pg.URL())
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("key create: %v: %s", err, out)
	}
	consoleFlags := []string{"--ssh", fmt.Sprintf("0.0.0.0:%d", sshPort), "--admin-keys", adminKeys, "--ssh-rate=-1"}

	hubs := []*clusterHub{startClusterHub(t, nss[0], names[0], dirs[0], port, pg.URL(), append(consoleFlags, "--fleet", fleetFile)...)}
	waitControl(t, dirs[0])
	hubs[0].waitStatus(t, "the leader", 60*time.Second, func(s clusterStatus) bool { return s.HubRole == "leader" && s.Leader == "hub1" })
	hubs[0].readyPIDs(t, 1, 90*time.Second)
	// One host key for every hub, as the docs say: the clients meet one
	// whichever hub holds the address.
	hostKey, err := os.ReadFile(filepath.Join(dirs[0], "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatalf("hub1's console host key: %v", err)
	}
	for i := 1; i < 3; i++ {
		if err := os.WriteFile(filepath.Join(dirs[i], "ssh_host_ed25519_key"), hostKey, 0o600); err != nil {
			t.Fatal(err)
		}
		hubs = append(hubs, startClusterHub(t, nss[i], names[i], dirs[i], port, pg.URL(), consoleFlags...))
	}
	for _, h := range hubs[1:] {
		waitControl(t, h.data)
		h.waitStatus(t, "a follower of hub1", 60*time.Second, func(s clusterStatus) bool { return s.HubRole == "follower" && s.Leader == "hub1" })
		h.readyPIDs(t, 1, 60*time.Second)
	}

	// keepalived as the docs set it up; hub2's member starts first, so the
	// address is on a follower.
	vip := bridge.NewIP()
	order := []*netnstest.Namespace{nss[1], nss[0], nss[2]}
	members := vrrptest.Members(bridge, vip, order...)
	for i := range members {
		members[i].HealthURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", port)
	}
	vrrptest.StartGroup(t, order, members)

	sshArgs := []string{"-F", "/dev/null", "-p", fmt.Sprint(sshPort), "-i", opKey, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=" + filepath.Join(keys, "known_hosts"),
		"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10", vip}
	out, err := exec.Command("ssh", append(sshArgs, "status")...).CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^this hub +hub2, follower \(leader hub1\)`).Match(out) {
		t.Fatalf("ssh %s status (the console through the virtual IP): %v\n%s", vip, err, out)
	}

	tm := newTmux(t)
	tm.open("op", append([]string{"ssh", "-tt"}, sshArgs...))
	tm.waitFor("op", "the title of hub2's console, a follower of hub1, with rig ready", 30*time.Second, func(s string) bool {
		rows, _ := tableRows(s, "rig")
		return strings.Contains(s, "hub2 follower of hub1") && strings.Contains(rows["rig"], "ready")
	})
	tm.literal("op", "d")
	tm.waitFor("op", "the drain confirmation", 10*time.Second, func(s string) bool { return strings.Contains(s, "Drain rig/qwen3-4b?") })
	tm.literal("op", "y")
	tm.waitFor("op", "rig draining in hub2's console", 30*time.Second, func(s string) bool {
		rows, _ := tableRows(s, "rig")
		return strings.Contains(rows["rig"], "draining") || strings.Contains(rows["rig"], "drained")
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if w, ok := workerOn(hubs[0].workers(t), "rig"); ok && w.Drained {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader does not see rig drained 30 s after the drain on hub2's console: %+v", hubs[0].workers(t))
		}
	}
	// The leader carried it out: the action hub2 queued is done.
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var queued []string
	rows, err := db.QueryContext(t.Context(), `SELECT hub || ' ' || action || ' ' || target || ' ' || state FROM actions ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		queued = append(queued, s)
	}
	rows.Close()
	if want := []string{"hub2 drain rig/qwen3-4b done"}; strings.Join(queued, "\n") != strings.Join(want, "\n") {
		t.Errorf("the actions queued for the leader: %q, want %q", queued, want)
	}
	if lines := auditLines(t, dirs[0], fleet.ActionDrain, "rig/qwen3-4b"); len(lines) != 1 || lines[0].Outcome != "ok" || lines[0].User != "operator" {
		t.Errorf("the drain from hub2's console audited as %+v; want one line by operator, ok", lines)
	}

	// PostgreSQL stopped: status answers on every hub, from its memory,
	// and says what it could not read.
	pg.Stop()
	for _, h := range hubs {
		out, code := h.ctl("status")
		if code != 0 {
			t.Errorf("hub %s: fleet status with PostgreSQL stopped: exit %d:\n%s", h.name, code, out)
			continue
		}
		for _, want := range []string{`(?m)^this hub +` + h.name + `, `, `(?m)^hubs +unknown, the database did not answer`,
			`(?m)^router +.*\(1 API key as this hub last read them, the database did not answer`, `(?m)^workers +1: `} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("hub %s: fleet status with PostgreSQL stopped does not match %s:\n%s", h.name, want, out)
			}
		}
	}
	// And over SSH, through the virtual IP, by the operator hub2 knows.
	if out, err := exec.Command("ssh", append(sshArgs, "status")...).CombinedOutput(); err != nil ||
		!regexp.MustCompile(`(?m)^hubs +unknown, the database did not answer`).Match(out) {
		t.Errorf("ssh %s status with PostgreSQL stopped: %v\n%s", vip, err, out)
	}
	pg.Start()

	// kill -9 of hub3: listed as gone once its heartbeat lapsed.
	hubs[2].cmd.Process.Kill()
	hubs[2].cmd.Wait()
	hubs[1].waitStatus(t, "listing hub3 as gone", 60*time.Second, func(s clusterStatus) bool {
		for _, o := range s.Hubs {
			if o.Name == "hub3" {
				return o.Role == "gone"
			}
		}
		return false
	})
	if _, err := net.DialTimeout("tcp", net.JoinHostPort(vip, fmt.Sprint(sshPort)), 10*time.Second); err != nil {
		t.Errorf("the console through the virtual IP after hub3 died: %v", err)
	}
}
