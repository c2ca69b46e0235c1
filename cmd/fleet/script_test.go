package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"golang.org/x/crypto/ssh"

	"fleet"
)

// TestScript runs the scripts in testdata/script: the command tree and the
// roles, as soft-serve's testscript does. Each script gets its own demo hub
// (free ports, its own data directory) with an SSH console, and these
// commands beside testscript's own:
//
//	admin ARGS…, operator ARGS…, viewer ARGS…
//	        run a fleet command over SSH as a user of that role; a first
//	        argument -stdin=FILE sends FILE as the command's standard input
//	fleet ARGS…
//	        run the fleet binary on the script's hub (its control socket)
//	waitready N
//	        wait until N workers are ready
//
// and $NEWKEY, a file holding a public key no user has yet.
func TestScript(t *testing.T) {
	roles := map[fleet.Role]ssh.Signer{}
	authorized := map[fleet.Role]string{}
	for _, r := range []fleet.Role{fleet.RoleAdmin, fleet.RoleOperator, fleet.RoleViewer} {
		roles[r], authorized[r] = newSSHKey(t)
	}
	_, spare := newSSHKey(t)
	cmds := map[string]func(ts *testscript.TestScript, neg bool, args []string){
		"fleet":     cmdFleet,
		"waitready": cmdWaitReady,
	}
	for r, signer := range roles {
		cmds[string(r)] = cmdAs(signer)
	}
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Cmds:                cmds,
		Setup: func(e *testscript.Env) error {
			tb := e.T().(testing.TB)
			// Removed after the hub and its engines stop (launchHub's
			// cleanups), which run after the script's own.
			data := tb.TempDir()
			adminKeys := filepath.Join(data, "admin_keys")
			if err := os.WriteFile(adminKeys, []byte(authorized[fleet.RoleAdmin]+"\n"), 0o600); err != nil {
				return err
			}
			sshPort := freePort(tb)
			h := startHub(tb, data, freePort(tb), "--ssh", fmt.Sprintf("127.0.0.1:%d", sshPort), "--admin-keys", adminKeys, "--ssh-rate=-1")
			waitControl(tb, data)
			for _, r := range []fleet.Role{fleet.RoleOperator, fleet.RoleViewer} {
				if out, code := fleetCmdIn(tb, data, authorized[r]+"\n", "user", "add", string(r), "--role", string(r)); code != 0 {
					return fmt.Errorf("adding the %s user: exit %d: %s", r, code, out)
				}
			}
			newKey := filepath.Join(e.WorkDir, "new.pub")
			if err := os.WriteFile(newKey, []byte(spare+"\n"), 0o600); err != nil {
				return err
			}
			e.Setenv("NEWKEY", newKey)
			e.Setenv("FLEET_DATA", data)
			e.Setenv("ROUTER", "http://"+h.http)
			e.Setenv("SSH_PORT", strconv.Itoa(sshPort))
			e.Values[hostKeyValue{}] = &hostKey{}
			return nil
		},
	})
}

func newSSHKey(t *testing.T) (ssh.Signer, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
}

type hostKeyValue struct{}

// hostKey is the hub's host key as the script's first connection saw it;
// every later connection must meet the same.
type hostKey struct{ key ssh.PublicKey }

func (h *hostKey) check(_ string, _ net.Addr, key ssh.PublicKey) error {
	if h.key == nil {
		h.key = key
		return nil
	}
	if !bytes.Equal(h.key.Marshal(), key.Marshal()) {
		return errors.New("the hub's host key changed within the script")
	}
	return nil
}

// cmdAs runs a fleet command over SSH as the user whose key is signer.
func cmdAs(signer ssh.Signer) func(ts *testscript.TestScript, neg bool, args []string) {
	return func(ts *testscript.TestScript, neg bool, args []string) {
		var stdin []byte
		if len(args) > 0 && strings.HasPrefix(args[0], "-stdin=") {
			stdin = []byte(ts.ReadFile(strings.TrimPrefix(args[0], "-stdin=")))
			args = args[1:]
		}
		hk := ts.Value(hostKeyValue{}).(*hostKey)
		client, err := ssh.Dial("tcp", net.JoinHostPort("127.0.0.1", ts.Getenv("SSH_PORT")), &ssh.ClientConfig{
			User:            "fleet",
			Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
			HostKeyCallback: hk.check,
			Timeout:         10 * time.Second,
		})
		ts.Check(err)
		defer client.Close()
		sess, err := client.NewSession()
		ts.Check(err)
		defer sess.Close()
		sess.Stdout, sess.Stderr = ts.Stdout(), ts.Stderr()
		sess.Stdin = bytes.NewReader(stdin)
		done := make(chan error, 1)
		go func() { done <- sess.Run(strings.Join(args, " ")) }()
		select {
		case err = <-done:
		case <-time.After(60 * time.Second): // hang guard
			ts.Fatalf("%s did not end within 60 s", strings.Join(args, " "))
		}
		exitCheck(ts, err, neg)
	}
}

// cmdFleet runs the fleet binary on the script's hub.
func cmdFleet(ts *testscript.TestScript, neg bool, args []string) {
	exitCheck(ts, ts.Exec(fleetBin, append([]string{"--data", ts.Getenv("FLEET_DATA")}, args...)...), neg)
}

// cmdWaitReady waits until N workers are ready.
func cmdWaitReady(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitready N")
	}
	n, err := strconv.Atoi(args[0])
	ts.Check(err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		out, err := execOutput(ctx, fleetBin, "--data", ts.Getenv("FLEET_DATA"), "workers", "--json")
		var ws []fleet.WorkerView
		if err == nil && json.Unmarshal([]byte(out), &ws) == nil {
			ready := 0
			for _, w := range ws {
				if w.State == fleet.WorkerReady {
					ready++
				}
			}
			if ready == n {
				return
			}
		}
		select {
		case <-ctx.Done():
			ts.Fatalf("%d workers not ready within 60 s: %v %s", n, err, out)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func exitCheck(ts *testscript.TestScript, err error, neg bool) {
	switch {
	case neg && err == nil:
		ts.Fatalf("unexpected success")
	case !neg && err != nil:
		ts.Fatalf("%v", err)
	}
}

// execOutput runs a command and returns its combined output.
func execOutput(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}
