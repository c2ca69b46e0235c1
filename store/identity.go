package store

import (
	"context"
	"fmt"
)

// Identity is who the fleet of this database is.
type Identity struct {
	// FleetID is random, made once when the database was created (or
	// upgraded to have one); every engine the hub launches carries it.
	FleetID string
	// Home is the data dir the database belongs to, host:path, as the first
	// hub to open it claimed it; "" until then.
	Home string
	// Launches is the serial of the last launch recorded: an engine of this
	// fleet carrying a higher one was launched by a newer copy of this
	// database.
	Launches int64
}

// Identity reads the fleet's identity.
func (s *Store) Identity(ctx context.Context) (Identity, error) {
	var id Identity
	err := s.db.QueryRowContext(ctx, `SELECT fleet_id, home, launches FROM fleet_identity WHERE id = 1`).Scan(&id.FleetID, &id.Home, &id.Launches)
	if err != nil {
		return Identity{}, fmt.Errorf("read the fleet's identity from %s: %w", s.path, err)
	}
	return id, nil
}
