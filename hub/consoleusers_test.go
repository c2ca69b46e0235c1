package hub

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"fleet"
	"fleet/store"
)

// usersDB is a user table that can stop answering.
type usersDB struct {
	users map[string]fleet.User
	down  bool
}

func (d *usersDB) UserByFingerprint(_ context.Context, fp string) (fleet.User, error) {
	if d.down {
		return fleet.User{}, errors.New("failed to connect")
	}
	if u, ok := d.users[fp]; ok {
		return u, nil
	}
	return fleet.User{}, fmt.Errorf("user with key %s: %w", fp, store.ErrNotFound)
}
func (d *usersDB) CountUsers(context.Context) (int, error) { return len(d.users), nil }
func (d *usersDB) AddUser(_ context.Context, u fleet.User) error {
	d.users[u.Fingerprint] = u
	return nil
}

// TestConsoleUsersWithoutTheDatabase: while the database does not answer,
// a user this hub found before still logs in, as found then; one it never
// found, or found removed, does not.
func TestConsoleUsersWithoutTheDatabase(t *testing.T) {
	ctx := t.Context()
	op := fleet.User{Name: "op", Role: fleet.RoleOperator, Fingerprint: "SHA256:op"}
	gone := fleet.User{Name: "gone", Role: fleet.RoleAdmin, Fingerprint: "SHA256:gone"}
	db := &usersDB{users: map[string]fleet.User{op.Fingerprint: op, gone.Fingerprint: gone}}
	users := newConsoleUsers(db)
	for _, u := range []fleet.User{op, gone} {
		if got, err := users.UserByFingerprint(ctx, u.Fingerprint); err != nil || got != u {
			t.Fatalf("%s with the database up: %+v, %v", u.Name, got, err)
		}
	}
	delete(db.users, gone.Fingerprint)
	if _, err := users.UserByFingerprint(ctx, gone.Fingerprint); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a removed user with the database up: %v, want not found", err)
	}
	db.down = true
	for _, tc := range []struct {
		fp   string
		want fleet.User
		ok   bool
	}{
		{op.Fingerprint, op, true},
		{gone.Fingerprint, fleet.User{}, false},
		{"SHA256:stranger", fleet.User{}, false},
	} {
		got, err := users.UserByFingerprint(ctx, tc.fp)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%s with the database down: %+v, %v; want %+v, found %v", tc.fp, got, err, tc.want, tc.ok)
		}
	}
}
