package hub

// Administration: console users, router API keys, the audit trail, themes.

import (
	"context"
	"fmt"

	"fleet"
	"fleet/themes"
)

// Audit lists recent audit entries; operators and admins may read it.
func (h *Hub) Audit(ctx context.Context, u fleet.User, limit int) ([]fleet.AuditEntry, error) {
	if err := h.authorize(u, fleet.RoleOperator, "audit", ""); err != nil {
		return nil, err
	}
	return h.store.Audit(ctx, limit)
}

// AddUser adds a console user (admin only).
func (h *Hub) AddUser(ctx context.Context, u fleet.User, nu fleet.User) error {
	if err := h.authorize(u, fleet.RoleAdmin, "user add", nu.Name); err != nil {
		return err
	}
	line, err := h.begin(u, "user add", nu.Name+" ("+string(nu.Role)+")")
	if err != nil {
		return err
	}
	err = h.store.AddUser(ctx, nu)
	line.endErr(err)
	return err
}

// RemoveUser removes a console user (admin only).
func (h *Hub) RemoveUser(ctx context.Context, u fleet.User, name string) error {
	if err := h.authorize(u, fleet.RoleAdmin, "user rm", name); err != nil {
		return err
	}
	line, err := h.begin(u, "user rm", name)
	if err != nil {
		return err
	}
	err = h.store.RemoveUser(ctx, name)
	line.endErr(err)
	return err
}

// Users lists console users (admin only).
func (h *Hub) Users(ctx context.Context, u fleet.User) ([]fleet.User, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "user list", ""); err != nil {
		return nil, err
	}
	return h.store.Users(ctx)
}

// CreateKey creates a router API key and returns it; only its hash is kept.
func (h *Hub) CreateKey(ctx context.Context, u fleet.User, name string) (string, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "key create", name); err != nil {
		return "", err
	}
	line, err := h.begin(u, "key create", name)
	if err != nil {
		return "", err
	}
	key, err := h.store.CreateAPIKey(ctx, name)
	line.endErr(err)
	return key, err
}

// Keys lists router API keys (names and dates, never the keys).
func (h *Hub) Keys(ctx context.Context, u fleet.User) ([]fleet.APIKey, error) {
	if err := h.authorize(u, fleet.RoleAdmin, "key list", ""); err != nil {
		return nil, err
	}
	return h.store.APIKeys(ctx)
}

// RevokeKey revokes a router API key at once.
func (h *Hub) RevokeKey(ctx context.Context, u fleet.User, name string) error {
	if err := h.authorize(u, fleet.RoleAdmin, "key revoke", name); err != nil {
		return err
	}
	line, err := h.begin(u, "key revoke", name)
	if err != nil {
		return err
	}
	err = h.store.RevokeAPIKey(ctx, name)
	line.endErr(err)
	return err
}

// SetTheme stores a user's own console theme ("" = from the terminal's background).
func (h *Hub) SetTheme(ctx context.Context, u fleet.User, name string) error {
	if name != "" {
		if _, err := themes.Named(name); err != nil {
			return err
		}
	}
	if u.Fingerprint == "" {
		return fmt.Errorf("%s is not a console user; themes are per SSH user (set one with: ssh -p PORT hub theme NAME)", u.Name)
	}
	return h.store.SetUserTheme(ctx, u.Name, name)
}
