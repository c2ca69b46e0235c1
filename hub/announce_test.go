package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"fleet"
	"fleet/store"
)

// TestRequireConsoleAdmins: a console off loopback starts only when someone
// can log in to it, from --admin-keys or an existing console user.
func TestRequireConsoleAdmins(t *testing.T) {
	ctx := context.Background()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		opts    Options
		hasUser bool
		refused bool
	}{
		{name: "no console", opts: Options{SSHAddr: ""}},
		{name: "loopback", opts: Options{SSHAddr: "127.0.0.1:2222"}},
		{name: "localhost", opts: Options{SSHAddr: "localhost:2222"}},
		{name: "LAN, nobody", opts: Options{SSHAddr: "0.0.0.0:2222"}, refused: true},
		{name: "LAN address, nobody", opts: Options{SSHAddr: "192.168.1.10:22"}, refused: true},
		{name: "LAN with admin keys", opts: Options{SSHAddr: "0.0.0.0:2222", AdminKeysFile: "/etc/fleet/admin_keys"}},
		{name: "LAN with a user", opts: Options{SSHAddr: "[::]:2222"}, hasUser: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, err := store.Open(ctx, filepath.Join(t.TempDir(), "fleet.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if tt.hasUser {
				if err := st.AddUser(ctx, fleet.User{Name: "ops", Role: fleet.RoleAdmin,
					PublicKey: string(ssh.MarshalAuthorizedKey(sshPub))}); err != nil {
					t.Fatal(err)
				}
			}
			err = requireConsoleAdmins(ctx, st, tt.opts)
			if tt.refused != (err != nil) {
				t.Fatalf("requireConsoleAdmins(%+v) = %v; refused want %v", tt.opts, err, tt.refused)
			}
			if err != nil && !strings.Contains(err.Error(), "--admin-keys") {
				t.Errorf("the refusal does not say what to pass: %v", err)
			}
		})
	}
}
