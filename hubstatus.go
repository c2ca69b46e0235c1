package fleet

import (
	"slices"
	"strings"
	"time"
)

// What `fleet status` shows and what a bench run is asked to measure: the
// hub answers and is asked in these types, so they live here, below the hub
// and the CLI; the CLI speaks the hub's vocabulary and the hub never
// imports the CLI.

// MaxFleetFileBytes is the most `apply` reads; longer input is refused
// whole, never cut.
const MaxFleetFileBytes = 4 << 20

// BenchOptions choose what a bench run measures.
type BenchOptions struct {
	Levels   []int
	Split    string
	Requests int
	Tokens   int
	// Turns is the agent split's turns per session (0 or 1: one).
	Turns int
}

// HubStatus is the one-screen summary of `fleet status`.
type HubStatus struct {
	Version string `json:"version"`
	// DataDir is the hub's data dir, for admins only ("" for the others).
	DataDir string `json:"data_dir,omitempty"`
	// Database names the PostgreSQL database holding the state, its URL
	// without password or options, for admins only ("" with SQLite in the
	// data dir, and for the others).
	Database  string    `json:"database,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	// UptimeSeconds is how long the hub has served, 0 before it does.
	UptimeSeconds float64 `json:"uptime_s"`
	// Router is the router's base URL, "" before it listens.
	Router       string `json:"router"`
	KeysRequired bool   `json:"keys_required"`
	// Keys counts the router API keys not revoked. KeysError says why it
	// is not the database's count now (it did not answer); Keys is then
	// the hub's own copy's when KeysFromMemory (a hub that checks keys
	// keeps one), else unknown (0).
	Keys           int    `json:"keys"`
	KeysError      string `json:"keys_error,omitempty"`
	KeysFromMemory bool   `json:"keys_from_memory,omitempty"`
	// Console is the SSH console's address ("" = none); ConsoleName its
	// mDNS name when announced.
	Console     string `json:"console,omitempty"`
	ConsoleName string `json:"console_name,omitempty"`
	// EnginePorts are the hub's engine ports, "MIN-MAX", for nodes that
	// set no ports: of their own.
	EnginePorts string `json:"engine_ports"`
	// Nodes and Workers count by state; the names are of those not up or
	// not ready, which are the ones to look at.
	Nodes   []StateCount  `json:"nodes"`
	Workers []StateCount  `json:"workers"`
	Models  []ModelStatus `json:"models"`
	// Hub is this hub's name (serve --hub-name), HubRole "leader" (it
	// drives the nodes) or "follower", Leader the leading hub's name (""
	// when none holds the lease). A hub on SQLite is the leader always.
	Hub     string `json:"hub"`
	HubRole string `json:"hub_role"`
	Leader  string `json:"leader"`
	// Hubs are the hubs sharing the PostgreSQL database, with their last
	// heartbeats (none on SQLite).
	Hubs []HubView `json:"hubs,omitempty"`
	// HubsError says why Hubs could not be read (the database did not
	// answer); Hub, HubRole and Leader are this hub's own knowledge.
	HubsError string `json:"hubs_error,omitempty"`
}

// HubView is one hub of a fleet of several, as status shows it.
type HubView struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// Role is "leader", "follower" or "gone": a hub whose heartbeat
	// lapsed (killed, frozen or cut off; its name may be taken).
	// HeartbeatAgeSeconds is how long ago it last heartbeated, by the
	// database's clock.
	HeartbeatAgeSeconds float64 `json:"heartbeat_age_s"`
	Router              string  `json:"router,omitempty"`
	Console             string  `json:"console,omitempty"`
	Version             string  `json:"version,omitempty"`
}

// StateCount is how many nodes or workers are in one state, and which.
type StateCount struct {
	State string   `json:"state"`
	Count int      `json:"count"`
	Names []string `json:"names"`
}

// ModelStatus is a model and how many of its workers are ready.
type ModelStatus struct {
	ID      string   `json:"id"`
	Aliases []string `json:"aliases,omitempty"`
	Context int      `json:"context"`
	Ready   int      `json:"ready"`
	Workers int      `json:"workers"`
}

// CountStates groups names by state, in the order of order (states not in
// it after, by name).
func CountStates(states map[string]string, order []string) []StateCount {
	by := map[string][]string{}
	for name, s := range states {
		by[s] = append(by[s], name)
	}
	var keys []string
	for s := range by {
		keys = append(keys, s)
	}
	rank := func(s string) int {
		if i := slices.Index(order, s); i >= 0 {
			return i
		}
		return len(order)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	out := make([]StateCount, 0, len(keys))
	for _, s := range keys {
		names := by[s]
		slices.Sort(names)
		out = append(out, StateCount{State: s, Count: len(names), Names: names})
	}
	return out
}
