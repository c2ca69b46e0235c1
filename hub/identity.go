package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"fleet/store"
)

// dataHome is how a database names the data dir it belongs to: the dir's
// absolute path, symlinks resolved.
func dataHome(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("the data dir %s: %w", dir, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	return abs, nil
}

// ErrCopiedDatabase is a database opened in a data dir other than the one
// it belongs to: a copy, or a move nobody confirmed.
var ErrCopiedDatabase = errors.New("the database belongs to another data dir")

// checkHome lets a hub run on its own database only: one whose home is
// this data dir, or that has none yet (it is claimed now). A copy of the
// database in another dir names the same fleet and the same engines; a hub
// on it would adopt, and stop, the engines of the hub it was copied from.
// On PostgreSQL (databaseURL set) several hubs share the database, each
// with a data dir of its own, so a hub from another data dir is one more
// hub of the same fleet, not a copy; the home stays the first hub's, for
// fleet-id.
func checkHome(ctx context.Context, st *store.Store, dir, databaseURL string) error {
	home, err := dataHome(dir)
	if err != nil {
		return err
	}
	id, err := st.Identity(ctx)
	if err != nil {
		return err
	}
	switch {
	case id.Home == home:
		return nil
	case id.Home == "":
		return st.ClaimHome(ctx, home)
	case st.Clustered():
		// Several hubs share the database, each from a data dir of its
		// own: the database is the fleet's, not one dir's copy.
		return nil
	}
	where, env := "the database in "+dir, ""
	if databaseURL != "" {
		where, env = "the database "+st.Path()+" (for data dir "+dir+")", "FLEET_DATABASE_URL=URL "
	}
	return fmt.Errorf("%w: %s is fleet %s, whose data dir is %s: it was copied or moved here, and a hub on it "+
		"would take over that fleet's engines; nothing was changed. If this copy is to be a fleet of its own, run "+
		"`%sfleet --data %s fleet-id --new` (a new fleet ID; the original fleet's engines are forgotten here, never stopped); "+
		"if the fleet has moved here for good and no hub will run on %s again, run `%sfleet --data %s fleet-id --move`",
		ErrCopiedDatabase, where, id.FleetID, id.Home, env, dir, id.Home, env, dir)
}

// Identity is `fleet fleet-id`, run with the hub stopped (it takes the data
// dir's lock): it shows the fleet's identity, makes a copied database a
// fleet of its own (newFleet), moves the fleet to this data dir (move), or
// takes on the engines a newer copy of a restored database launched
// (restored).
// With databaseURL set the database is PostgreSQL's, as serve opens it, and
// it is refused while a hub runs on that database.
func Identity(ctx context.Context, dataDir, databaseURL string, newFleet, move, restored bool) (string, error) {
	if newFleet && (move || restored) {
		return "", errors.New("fleet-id: --new excludes --move and --restored: a copy is either a fleet of its own or the same fleet")
	}
	if _, err := os.Stat(filepath.Join(dataDir, "fleet.db")); err != nil && databaseURL == "" {
		return "", fmt.Errorf("fleet-id: no database in %s (%w); pass the data dir with --data (and set FLEET_DATABASE_URL for a hub on PostgreSQL)", dataDir, err)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return "", fmt.Errorf("fleet-id: %w", err)
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
	home, err := dataHome(dataDir)
	if err != nil {
		return "", err
	}
	id, err := st.Identity(ctx)
	if err != nil {
		return "", err
	}
	note := ""
	switch {
	case newFleet:
		old := id.FleetID
		if id, err = st.NewFleet(ctx, home); err != nil {
			return "", err
		}
		note = fmt.Sprintf("a fleet of its own now; the engines of fleet %s are not this hub's to adopt or stop\n", old)
	case move || restored:
		if move {
			if err := st.ClaimHome(ctx, home); err != nil {
				return "", err
			}
			note = fmt.Sprintf("moved here from %s; the hub here adopts and stops this fleet's engines\n", id.Home)
		}
		if restored {
			seen := id.NewestSeen
			if id, err = st.TakeOnNewerLaunches(ctx); err != nil {
				return "", err
			}
			note += fmt.Sprintf("restored from an older copy: the engines of launches up to %d are this hub's to adopt and stop\n", max(seen, id.Launches))
		}
	}
	if id.NewestSeen > 0 {
		note += fmt.Sprintf("engines of launches up to %d run that this database did not launch (restored from an older copy?): "+
			"`fleet fleet-id --restored` takes them on\n", id.NewestSeen)
	}
	return fmt.Sprintf("fleet ID:      %s\ndata dir:      %s\nlast launch:   %d\n%s", id.FleetID, id.Home, id.Launches, note), nil
}
