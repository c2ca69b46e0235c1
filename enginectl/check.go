package enginectl

import (
	"fmt"
	"maps"
	"slices"

	"fleet"
)

// CheckRecipes builds every recipe of m the way a launch would, on a neutral
// node, so an apply (and its dry run) refuses what the launcher would refuse
// later on the node: a flag fleet sets itself, missing weights, a bad env
// name. What depends on the node (its platform, a sim node's profile) is
// left to the launch.
func CheckRecipes(m fleet.Model) error {
	for _, k := range slices.Sorted(maps.Keys(m.Recipes)) {
		spec := Spec{Node: fleet.Node{Name: "check", Address: fleet.AddressLocal}, Model: m, Engine: k, Port: 18000, FleetBin: "fleet"}
		if k == fleet.EngineSim {
			p := m.Recipes[k].Profile
			if p == "" {
				continue // the profile comes from the sim node it is placed on
			}
			spec.Node.Address = fleet.AddressSimPrefix + p
		}
		if _, err := BuildCommand(spec); err != nil {
			return fmt.Errorf("%w (the engine would refuse to launch)", err)
		}
	}
	return nil
}
