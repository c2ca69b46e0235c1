// Package sim is a real HTTP server that behaves like a vLLM or a llama-server
// worker: the same endpoints, wire shapes, metrics names, slots and queueing,
// with decode speeds calibrated on the machines of the field reports
// (docs/field-reports.md). The demo and the tests run it where no GPU
// or Mac is at hand.
package sim

import "fleet/sim/profiles"

const mib = uint64(1) << 20

// Profile and SpeedPoint are the simulated machines of package profiles,
// named here as the engine has always named them.
type (
	Profile    = profiles.Profile
	SpeedPoint = profiles.SpeedPoint
)

// LookupProfile returns the named profile.
func LookupProfile(name string) (Profile, error) { return profiles.Lookup(name) }

// ProfileNames lists the known profiles, sorted.
func ProfileNames() []string { return profiles.Names() }
