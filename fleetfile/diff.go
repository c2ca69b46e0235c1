package fleetfile

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"fleet"
)

// ChangeKind is what a change does.
type ChangeKind string

const (
	Add    ChangeKind = "add"
	Modify ChangeKind = "change"
	Remove ChangeKind = "remove"
)

// What a change is about.
const (
	WhatNode      = "node"
	WhatModel     = "model"
	WhatPlacement = "placement"
)

// Change is one line of a plan.
type Change struct {
	Kind ChangeKind `json:"kind"`
	What string     `json:"what"` // node, model or placement
	// Name is the node name, the model id, or "MODEL on NODE".
	Name string `json:"name"`
	// Detail is the address of an added node, or "field old → new".
	Detail string `json:"detail,omitempty"`
}

func (c Change) String() string {
	sign := map[ChangeKind]string{Add: "+", Modify: "~", Remove: "-"}[c.Kind]
	s := sign + " " + c.What + " " + c.Name
	switch {
	case c.Detail == "":
	case c.Kind == Modify:
		s += ": " + c.Detail
	default:
		s += " (" + c.Detail + ")"
	}
	return s
}

// Plan is what applying a fleet would change, for `apply --dry-run`.
type Plan struct {
	Changes []Change `json:"changes"`
}

// Empty reports whether applying would change nothing.
func (p Plan) Empty() bool { return len(p.Changes) == 0 }

func (p Plan) String() string {
	if p.Empty() {
		return "no changes\n"
	}
	var b strings.Builder
	for _, c := range p.Changes {
		b.WriteString(c.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Diff compares the declared parts of two fleets (runtime state such as a
// node's probe is ignored): nodes, then models, then placements; within
// each, additions and changes in the new order, then removals in the old.
func Diff(old, new fleet.Fleet) Plan {
	var p Plan
	add := func(kind ChangeKind, what, name, detail string) {
		p.Changes = append(p.Changes, Change{Kind: kind, What: what, Name: name, Detail: detail})
	}

	oldNodes := map[string]fleet.Node{}
	for _, n := range old.Nodes {
		oldNodes[n.Name] = n
	}
	newNodes := map[string]bool{}
	for _, n := range new.Nodes {
		newNodes[n.Name] = true
		o, ok := oldNodes[n.Name]
		if !ok {
			add(Add, WhatNode, n.Name, n.Address)
			continue
		}
		for _, f := range [][3]string{
			{"address", o.Address, n.Address},
			{"identity", o.Identity, n.Identity},
			{"endpoint", orDefault(o.Endpoint, "tunnel"), orDefault(n.Endpoint, "tunnel")},
			{"ports", orDefault(o.Ports.String(), "the hub's default"), orDefault(n.Ports.String(), "the hub's default")},
		} {
			if f[1] != f[2] {
				add(Modify, WhatNode, n.Name, fmt.Sprintf("%s %s → %s", f[0], orDefault(f[1], `""`), orDefault(f[2], `""`)))
			}
		}
	}
	for _, n := range old.Nodes {
		if !newNodes[n.Name] {
			add(Remove, WhatNode, n.Name, n.Address)
		}
	}

	oldModels := map[string]fleet.Model{}
	for _, m := range old.Models {
		oldModels[m.ID] = m
	}
	newModels := map[string]bool{}
	for _, m := range new.Models {
		newModels[m.ID] = true
		o, ok := oldModels[m.ID]
		if !ok {
			add(Add, WhatModel, m.ID, fmt.Sprintf("context %d, recipes %s", m.Context, engines(m.Recipes)))
			continue
		}
		for _, d := range modelChanges(o, m) {
			add(Modify, WhatModel, m.ID, d)
		}
	}
	for _, m := range old.Models {
		if !newModels[m.ID] {
			add(Remove, WhatModel, m.ID, "")
		}
	}

	type key struct{ model, node string }
	oldPlaced := map[key]fleet.Placement{}
	for _, pl := range old.Placements {
		oldPlaced[key{pl.Model, pl.Node}] = pl
	}
	newPlaced := map[key]bool{}
	for _, pl := range new.Placements {
		k := key{pl.Model, pl.Node}
		newPlaced[k] = true
		name := pl.Model + " on " + pl.Node
		o, ok := oldPlaced[k]
		switch {
		case !ok:
			add(Add, WhatPlacement, name, string(pl.Engine))
		default:
			if o.Engine != pl.Engine {
				add(Modify, WhatPlacement, name, fmt.Sprintf("engine %s → %s", engineOrAuto(o.Engine), engineOrAuto(pl.Engine)))
			}
			if o.Context != pl.Context {
				add(Modify, WhatPlacement, name, fmt.Sprintf("context %s → %s (the worker restarts)", contextOrModel(o.Context), contextOrModel(pl.Context)))
			}
		}
	}
	for _, pl := range old.Placements {
		if !newPlaced[key{pl.Model, pl.Node}] {
			add(Remove, WhatPlacement, pl.Model+" on "+pl.Node, "")
		}
	}
	return p
}

// readyTimeout names a recipe's ready timeout, 0 being the hub's default.
func readyTimeout(d time.Duration) string {
	if d == 0 {
		return "default"
	}
	return shortDuration(d)
}

// contextOrModel names a placement's context, 0 being the model's own.
func contextOrModel(n int) string {
	if n == 0 {
		return "the model's"
	}
	return strconv.Itoa(n)
}

func modelChanges(o, m fleet.Model) []string {
	var out []string
	field := func(name, a, b string) {
		if a != b {
			out = append(out, fmt.Sprintf("%s %s → %s", name, a, b))
		}
	}
	field("aliases", "["+strings.Join(o.Aliases, ", ")+"]", "["+strings.Join(m.Aliases, ", ")+"]")
	field("context", fmt.Sprint(o.Context), fmt.Sprint(m.Context))
	field("memory_gb", formatNumber(o.MemoryGB), formatNumber(m.MemoryGB))
	field("speed_tolerance", formatNumber(o.SpeedTolerance), formatNumber(m.SpeedTolerance))
	field("reasoning", orDefault(o.Reasoning, "off"), orDefault(m.Reasoning, "off"))
	field("reference", orDefault(o.Reference, "first placed node"), orDefault(m.Reference, "first placed node"))
	for _, e := range recipeOrder(m.Recipes) {
		r := m.Recipes[e]
		or, ok := o.Recipes[e]
		if !ok {
			out = append(out, fmt.Sprintf("recipe %s added", e))
			continue
		}
		prefix := "recipe " + string(e) + ": "
		field(prefix+"model", quoteEmpty(or.Model), quoteEmpty(r.Model))
		field(prefix+"args", "["+strings.Join(or.Args, " ")+"]", "["+strings.Join(r.Args, " ")+"]")
		field(prefix+"bin", quoteEmpty(or.Bin), quoteEmpty(r.Bin))
		field(prefix+"install", quoteEmpty(or.Install), quoteEmpty(r.Install))
		field(prefix+"env", envString(or.Env), envString(r.Env))
		field(prefix+"profile", quoteEmpty(or.Profile), quoteEmpty(r.Profile))
		field(prefix+"ready_timeout", readyTimeout(or.ReadyTimeout), readyTimeout(r.ReadyTimeout))
	}
	for _, e := range recipeOrder(o.Recipes) {
		if _, ok := m.Recipes[e]; !ok {
			out = append(out, fmt.Sprintf("recipe %s removed", e))
		}
	}
	return out
}

func engines(recipes map[fleet.EngineKind]fleet.Recipe) string {
	names := []string{}
	for _, e := range recipeOrder(recipes) {
		names = append(names, string(e))
	}
	return strings.Join(names, ", ")
}

func envString(env map[string]string) string {
	parts := []string{}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		parts = append(parts, k+"="+env[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func quoteEmpty(s string) string { return orDefault(s, `""`) }

func engineOrAuto(e fleet.EngineKind) string { return orDefault(string(e), "auto") }
