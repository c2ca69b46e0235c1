package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"

	"fleet"
)

// AddUser lets a public key into the console with a role. The key is one
// authorized_keys line; its SHA256 fingerprint, which the SSH server looks
// users up by, is computed here and overrides u.Fingerprint.
func (s *Store) AddUser(ctx context.Context, u fleet.User) error {
	u.Name = strings.TrimSpace(u.Name)
	if u.Name == "" {
		return errors.New("add user: no name given; name the person or robot the key belongs to")
	}
	switch u.Role {
	case fleet.RoleViewer, fleet.RoleOperator, fleet.RoleAdmin:
	default:
		return fmt.Errorf("add user %s: role %q is not one of viewer, operator, admin", u.Name, u.Role)
	}
	key, comment, _, rest, err := ssh.ParseAuthorizedKey([]byte(u.PublicKey))
	if err != nil {
		return fmt.Errorf("add user %s: the public key is not an authorized_keys line (like \"ssh-ed25519 AAAA… you@host\"): %w", u.Name, err)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return fmt.Errorf("add user %s: give one public key, not several", u.Name)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	if comment != "" {
		line += " " + comment
	}
	u.PublicKey = line
	u.Fingerprint = ssh.FingerprintSHA256(key)

	_, err = s.db.ExecContext(ctx, `INSERT INTO users (name, role, public_key, fingerprint, theme) VALUES (?, ?, ?, ?, ?)`,
		u.Name, string(u.Role), u.PublicKey, u.Fingerprint, u.Theme)
	if s.db.d.unique(err) {
		if other, ferr := s.UserByFingerprint(ctx, u.Fingerprint); ferr == nil {
			return fmt.Errorf("add user %s: key %s already belongs to user %s; remove that user first", u.Name, u.Fingerprint, other.Name)
		}
		return fmt.Errorf("add user %s: a user with that name exists; remove it first or choose another name", u.Name)
	}
	if err != nil {
		return fmt.Errorf("add user %s: %w", u.Name, err)
	}
	return nil
}

// Users returns every user, by name.
func (s *Store) Users(ctx context.Context) ([]fleet.User, error) {
	return queryAll(ctx, s.db, "read users", scanUser, `SELECT name, role, public_key, fingerprint, theme FROM users ORDER BY name`)
}

func scanUser(sc rowScanner) (fleet.User, error) {
	var (
		u    fleet.User
		role string
	)
	err := sc.Scan(&u.Name, &role, &u.PublicKey, &u.Fingerprint, &u.Theme)
	u.Role = fleet.Role(role)
	return u, err
}

// UserByFingerprint finds the user whose key has fingerprint fp
// ("SHA256:…"), the way the SSH server identifies a session.
func (s *Store) UserByFingerprint(ctx context.Context, fp string) (fleet.User, error) {
	u, err := scanUser(s.db.QueryRowContext(ctx, `SELECT name, role, public_key, fingerprint, theme FROM users WHERE fingerprint = ?`, fp))
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.User{}, fmt.Errorf("user with key %s: %w; an admin can add it with `fleet user add`", fp, ErrNotFound)
	}
	if err != nil {
		return fleet.User{}, fmt.Errorf("find user with key %s: %w", fp, err)
	}
	return u, nil
}

// RemoveUser revokes a user's access.
func (s *Store) RemoveUser(ctx context.Context, name string) error {
	return s.execOne(ctx, "remove user "+name, "user "+name, "", `DELETE FROM users WHERE name = ?`, name)
}

// SetUserTheme remembers a user's console theme.
func (s *Store) SetUserTheme(ctx context.Context, name, theme string) error {
	return s.execOne(ctx, "set theme of user "+name, "user "+name, "", `UPDATE users SET theme = ? WHERE name = ?`, theme, name)
}

// CountUsers says how many users exist; zero means the console is open to
// its first key, which becomes admin.
func (s *Store) CountUsers(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM users`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count users: %w", err)
	}
	return n, nil
}

// execOne runs a statement that must touch exactly one row, and says which
// name was missing (with hint, an operator's next step) when none was.
func (s *Store) execOne(ctx context.Context, doing, missing, hint, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %s: %w%s", doing, missing, ErrNotFound, hint)
	}
	return nil
}

// APIKeyPrefix starts every router key, so a leaked key is recognisable.
const APIKeyPrefix = "fk-"

// CreateAPIKey makes a router key named name and returns it; only its
// SHA-256 is stored, so this is the one time anyone sees it. A revoked key's
// name may be reused.
func (s *Store) CreateAPIKey(ctx context.Context, name string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return "", errors.New("create API key: no name given; name the client that will use it")
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", fmt.Errorf("create API key %s: %w", name, err)
	}
	key := APIKeyPrefix + base64.RawURLEncoding.EncodeToString(secret)
	hash := HashAPIKey(key)
	exists := fmt.Errorf("create API key: a key named %s exists; revoke it first or choose another name", name)
	// One upsert, not a delete of the revoked key and an insert: two hubs
	// creating one name at once, or a create while a revoke of the name is
	// in flight, then queue on the name's row and decide by the row as last
	// committed (a live key stays, a revoked one is replaced, its limits
	// with it), where the delete would have missed a revoke committed in
	// between and the insert failed on the name.
	err := s.inChangeTx(ctx, change{channel: ChannelKeys, payload: name}, func(tx *txn) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO api_keys (name, hash, created) VALUES (?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET hash = excluded.hash, created = excluded.created, revoked = 0,
				requests_per_minute = 0, tokens_per_day = 0
			WHERE api_keys.revoked != 0`, name, hash[:], s.now().UnixNano())
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return cmp.Or(err, exists) // nothing written: no notice either
		}
		return nil
	})
	if errors.Is(err, exists) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("create API key %s: %w", name, err)
	}
	return key, nil
}

// APIKeys lists router keys, revoked ones included, by name.
func (s *Store) APIKeys(ctx context.Context) ([]fleet.APIKey, error) {
	return queryAll(ctx, s.db, "list API keys", func(r rowScanner) (fleet.APIKey, error) {
		var (
			k                fleet.APIKey
			created, revoked int64
		)
		err := r.Scan(&k.Name, &created, &revoked, &k.RequestsPerMinute, &k.TokensPerDay)
		k.Created, k.Revoked = fromUnixNano(created), fromUnixNano(revoked)
		return k, err
	}, `SELECT name, created, revoked, requests_per_minute, tokens_per_day FROM api_keys ORDER BY name`)
}

// RevokeAPIKey stops a router key from working; it stays listed as revoked.
// One UPDATE of the key's row: a create of its name in flight waits for it
// (CreateAPIKey).
func (s *Store) RevokeAPIKey(ctx context.Context, name string) error {
	return s.changeOne(ctx, change{channel: ChannelKeys, payload: name}, "revoke API key "+name, "live API key "+name, "",
		`UPDATE api_keys SET revoked = ? WHERE name = ? AND revoked = 0`, s.now().UnixNano(), name)
}

// KeyHash is a live router key's name and the SHA-256 of the key.
type KeyHash struct {
	Name string
	Hash [sha256.Size]byte
}

// LiveAPIKeyHashes lists every live router key's hash, for a hub that
// checks keys from memory (a revoked key is absent).
func (s *Store) LiveAPIKeyHashes(ctx context.Context) ([]KeyHash, error) {
	return queryAll(ctx, s.db, "read API key hashes", func(r rowScanner) (KeyHash, error) {
		var (
			k    KeyHash
			hash []byte
		)
		if err := r.Scan(&k.Name, &hash); err != nil {
			return k, err
		}
		if len(hash) != sha256.Size {
			return k, fmt.Errorf("API key %s has a %d-byte hash, not SHA-256's %d; revoke it and create another", k.Name, len(hash), sha256.Size)
		}
		k.Hash = [sha256.Size]byte(hash)
		return k, nil
	}, `SELECT name, hash FROM api_keys WHERE revoked = 0`)
}

// HashAPIKey is the SHA-256 a key is stored and looked up by.
func HashAPIKey(key string) [sha256.Size]byte { return sha256.Sum256([]byte(key)) }
