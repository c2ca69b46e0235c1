package hub

// Administration: console users, router API keys, the audit trail, themes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"fleet"
	"fleet/sshserver"
	"fleet/store"
)

// Admin answers the administration commands: console users, router API
// keys, reading the audit trail, a user's theme. The hub composes one; each
// command is authorized and audited by the hub's guard, and a key's limits
// reach the router through the Ledger.
type Admin struct {
	guard  *guard
	store  *store.Store
	ledger *Ledger
}

// Audit lists recent audit entries; operators and admins may read it.
func (ad *Admin) Audit(ctx context.Context, u fleet.User, limit int) (es []fleet.AuditEntry, err error) {
	err = ad.guard.do(u, fleet.ActionAudit, "", func() (string, error) {
		ad.guard.flushRefusals()
		es, err = ad.store.Audit(ctx, limit)
		if !u.Role.Allows(fleet.RoleAdmin) {
			es = fleet.RedactAudit(es)
		}
		return "", err
	})
	return es, err
}

// AddUser adds a console user (admin only).
func (ad *Admin) AddUser(ctx context.Context, u fleet.User, nu fleet.User) error {
	a, err := ad.guard.authorize(u, fleet.ActionUserAdd, nu.Name)
	if err != nil {
		return err
	}
	return ad.guard.run(u, a, nu.Name+" ("+string(nu.Role)+")", func() (string, error) {
		return "", ad.store.AddUser(ctx, nu)
	})
}

// RemoveUser removes a console user (admin only).
func (ad *Admin) RemoveUser(ctx context.Context, u fleet.User, name string) error {
	return ad.guard.do(u, fleet.ActionUserRemove, name, func() (string, error) {
		return "", ad.store.RemoveUser(ctx, name)
	})
}

// Users lists console users (admin only).
func (ad *Admin) Users(ctx context.Context, u fleet.User) (us []fleet.User, err error) {
	err = ad.guard.do(u, fleet.ActionUserList, "", func() (string, error) {
		us, err = ad.store.Users(ctx)
		return "", err
	})
	return us, err
}

// CreateKey creates a router API key and returns it; only its hash is kept.
func (ad *Admin) CreateKey(ctx context.Context, u fleet.User, name string) (key string, err error) {
	err = ad.guard.do(u, fleet.ActionKeyCreate, name, func() (string, error) {
		key, err = ad.store.CreateAPIKey(ctx, name)
		if err != nil {
			return "", err
		}
		// A revoked key's name reused starts without the old key's limits.
		return "", ad.ledger.reloadKeys(ctx)
	})
	return key, err
}

// CreateKeyWithoutHub creates a router API key in the database of a hub on
// dataDir while no hub runs there: the first key of a hub that requires
// keys, which will not start without one. The database is the data dir's,
// or PostgreSQL's at databaseURL when it is set, as serve opens it. It
// holds the data dir's lock while it writes, and on PostgreSQL it is refused
// while any hub heartbeats on the database, so it is refused while a hub
// runs (a command then goes through that hub), and it is audited as the
// local admin's, as the control socket's commands are.
// A failure to record the outcome after the key was made is told on warn.
func CreateKeyWithoutHub(ctx context.Context, dataDir, databaseURL, name string, warn io.Writer) (key string, err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("creating the data dir %s: %w", dataDir, err)
	}
	if err := checkWritable(dataDir); err != nil {
		return "", err
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		if le, ok := errors.AsType[*lockedError](err); ok {
			return "", fmt.Errorf("a hub%s holds data dir %s but its control socket did not answer; nothing was changed: "+
				"retry once it has started (it creates the key itself then), or stop it and run this again", le.holder, dataDir)
		}
		return "", err
	}
	defer lock.Close()
	st, err := openStore(ctx, Options{DataDir: dataDir, DatabaseURL: databaseURL, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", err
	}
	defer st.Close()
	if err := refuseLiveHubs(ctx, st); err != nil {
		return "", err
	}
	id, err := st.BeginAudit(ctx, auditEntry(LocalAdmin(), fleet.ActionKeyCreate, name, auditStarted))
	if err != nil {
		return "", fmt.Errorf("key create %s was not done: its audit line could not be written (%w); nothing was changed. "+
			"Free disk space or repair the database (%s), then try again", name, err, st.Path())
	}
	key, err = st.CreateAPIKey(ctx, name)
	outcome := "ok (without a running hub)"
	if err != nil {
		outcome = "failed: " + err.Error()
	}
	if aerr := st.SetAuditOutcome(ctx, id, fleet.Clip(outcome, auditOutcomeBytes)); aerr != nil && err == nil {
		// The key exists and is printed: the audit line says "started".
		fmt.Fprintf(warn, "fleet: the key was created, but its audit line could not be completed (it says %q): %v\n", auditStarted, aerr)
	}
	return key, err
}

// Keys lists router API keys (names and dates, never the keys), each with
// when it was last used and its requests today (UTC).
func (ad *Admin) Keys(ctx context.Context, u fleet.User) (keys []fleet.APIKey, err error) {
	err = ad.guard.do(u, fleet.ActionKeyList, "", func() (string, error) {
		// What the router counted in the last seconds shows at once.
		ad.ledger.writeUsage(ctx)
		keys, err = ad.store.APIKeys(ctx)
		if err != nil {
			return "", err
		}
		used, err := ad.store.KeyActivity(ctx, time.Now().UTC().Truncate(24*time.Hour))
		if err != nil {
			return "", err
		}
		for i := range keys {
			a := used[keys[i].Name]
			keys[i].LastUsed, keys[i].RequestsToday = a.LastUsed, a.RequestsToday
		}
		return "", nil
	})
	return keys, err
}

// RevokeKey revokes a router API key at once.
func (ad *Admin) RevokeKey(ctx context.Context, u fleet.User, name string) error {
	return ad.guard.do(u, fleet.ActionKeyRevoke, name, func() (string, error) {
		if err := ad.store.RevokeAPIKey(ctx, name); err != nil {
			return "", err
		}
		return "", ad.ledger.reloadKeys(ctx)
	})
}

// SetTheme stores a user's own console theme ("" = from the terminal's background).
func (ad *Admin) SetTheme(ctx context.Context, u fleet.User, name string) error {
	return ad.guard.do(u, fleet.ActionTheme, name, func() (string, error) {
		if err := sshserver.CheckTheme(name); err != nil {
			return "", err
		}
		if u.Fingerprint == "" {
			return "", fmt.Errorf("%s is not a console user; themes are per SSH user (set one with: ssh -p PORT hub theme NAME)", u.Name)
		}
		return "", ad.store.SetUserTheme(ctx, u.Name, name)
	})
}
