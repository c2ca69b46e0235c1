package hub

import (
	"context"
	"errors"
	"sync"

	"fleet"
	"fleet/sshserver"
	"fleet/store"
)

// consoleUsers are the console's users as the SSH server asks for them:
// the database's, and, while it does not answer, the ones this hub last
// found there. An operator who logged in to this hub before can then still
// log in and read what the hub holds (status, workers) with PostgreSQL
// down; every action is refused meanwhile (its audit line cannot be
// written). A user removed on another hub keeps that much until the
// database answers this hub again, as a revoked API key does.
type consoleUsers struct {
	sshserver.UserStore
	mu   sync.Mutex
	seen map[string]fleet.User // by fingerprint
}

func newConsoleUsers(st sshserver.UserStore) *consoleUsers {
	return &consoleUsers{UserStore: st, seen: map[string]fleet.User{}}
}

func (c *consoleUsers) UserByFingerprint(ctx context.Context, fp string) (fleet.User, error) {
	u, err := c.UserStore.UserByFingerprint(ctx, fp)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
		c.seen[fp] = u
	case errors.Is(err, store.ErrNotFound):
		delete(c.seen, fp)
	default:
		if last, ok := c.seen[fp]; ok {
			return last, nil
		}
	}
	return u, err
}
