package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	// NewestSeen is the highest launch serial of this fleet seen on an
	// engine above Launches: the database is older than the fleet's
	// engines (restored from a backup).
	NewestSeen int64
}

// Identity reads the fleet's identity.
func (s *Store) Identity(ctx context.Context) (Identity, error) {
	var id Identity
	err := s.db.QueryRowContext(ctx, `SELECT fleet_id, home, launches, newest_seen FROM fleet_identity WHERE id = 1`).Scan(&id.FleetID, &id.Home, &id.Launches, &id.NewestSeen)
	if err != nil {
		return Identity{}, fmt.Errorf("read the fleet's identity from %s: %w", s.path, err)
	}
	return id, nil
}

// ClaimHome records home as the data dir the database belongs to.
func (s *Store) ClaimHome(ctx context.Context, home string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE fleet_identity SET home = ? WHERE id = 1`, home); err != nil {
		return fmt.Errorf("record the data dir %s as the fleet's home in %s: %w", home, s.path, err)
	}
	return nil
}

// NewFleet makes the database a fleet of its own, at home: a new fleet ID,
// and no engine of the old fleet on its books (workers keep their placement
// and hold but forget their PIDs and launches; pending stops are dropped),
// so the hub neither adopts nor stops the engines the database's original
// fleet runs. It returns the new identity.
func (s *Store) NewFleet(ctx context.Context, home string) (Identity, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return Identity{}, fmt.Errorf("make a fleet ID: %w", err)
	}
	id := hex.EncodeToString(b)
	// Exclusive on the fleet state: it forgets launches and pending stops,
	// which a launch or an apply in flight would write back.
	err := s.inChangeTx(ctx, change{state: stateExclusive}, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `UPDATE fleet_identity SET fleet_id = ?, home = ? WHERE id = 1`, id, home); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE workers SET pid = 0, pgid = 0, launch = 0,
				state = CASE WHEN state IN ('stopped', 'rejected') THEN state ELSE 'pending' END`); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM pending_stops`)
		return err
	})
	if err != nil {
		return Identity{}, fmt.Errorf("make %s a fleet of its own: %w", s.path, err)
	}
	return s.Identity(ctx)
}

// SawNewerLaunch records that an engine of this fleet carries launch, a
// serial above the last this database gave out. The maximum is taken in
// the one UPDATE, which READ COMMITTED runs again on the row as last
// committed if another write of it came first: no sighting is lost.
func (s *Store) SawNewerLaunch(ctx context.Context, launch int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE fleet_identity SET newest_seen = CASE WHEN newest_seen > ? THEN newest_seen ELSE ? END WHERE id = 1`, launch, launch); err != nil {
		return fmt.Errorf("record launch %d seen on an engine in %s: %w", launch, s.path, err)
	}
	return nil
}

// TakeOnNewerLaunches is an admin's word that the database was restored from
// an older copy and the engines of this fleet running now are its own: the
// launches seen above its last serial count as given out by it.
func (s *Store) TakeOnNewerLaunches(ctx context.Context) (Identity, error) {
	if _, err := s.db.ExecContext(ctx, `UPDATE fleet_identity SET launches = CASE WHEN launches > newest_seen THEN launches ELSE newest_seen END, newest_seen = 0 WHERE id = 1`); err != nil {
		return Identity{}, fmt.Errorf("take on the newer launches in %s: %w", s.path, err)
	}
	return s.Identity(ctx)
}
