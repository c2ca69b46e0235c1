package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"fleet/hub"
)

// fleetIDCmd is `fleet fleet-id`: it runs here, on the data dir, with the
// hub stopped, because it decides which engines a hub may touch at all.
func fleetIDCmd(dataDir *string) *cobra.Command {
	var newFleet, move, restored bool
	c := &cobra.Command{
		Use:   "fleet-id",
		Short: "show the fleet's ID and data dir; make a copied database a fleet of its own (--new), move the fleet here (--move) or take on a restored database's engines (--restored)",
		Long: `Every engine a hub starts carries its fleet's ID (FLEET_ID) and the serial of
its launch (FLEET_LAUNCH); a hub adopts and stops only its own fleet's engines.
A database copied to another data dir names the same fleet, so a hub refuses
to start on it until an admin says what the copy is (with that hub stopped):

  --new   a fleet of its own: a new fleet ID; the workers forget the engines
          of the original fleet (their PIDs and launches), which this hub then
          never adopts or stops
  --move  the same fleet, moved here for good: no hub runs on the old data
          dir again; the hub here adopts and stops the fleet's engines

An engine of the fleet whose launch serial is above the last one the database
gave out was started from a newer copy of the database: this one was restored
from an older copy. The hub neither adopts nor stops it (the worker says so)
until an admin, with the hub stopped, runs

  --restored  take on the engines of the launches seen so far as this
              database's own

For a hub whose state is in PostgreSQL, set FLEET_DATABASE_URL to its
database's URL, as for serve.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			// The database serve would open: $FLEET_DATABASE_URL's, else the data dir's.
			out, err := hub.Identity(c.Context(), *dataDir, os.Getenv(databaseURLEnv), newFleet, move, restored)
			if err != nil {
				return err
			}
			fmt.Fprint(c.OutOrStdout(), out)
			return nil
		},
	}
	c.Flags().BoolVar(&newFleet, "new", false, "make this database a fleet of its own, with a new fleet ID (for a copy)")
	c.Flags().BoolVar(&restored, "restored", false, "the database was restored from an older copy: take on the fleet's engines of newer launches seen by the hub")
	c.Flags().BoolVar(&move, "move", false, "make this data dir the fleet's home (the fleet moved here; no hub runs on the old one again)")
	return c
}
