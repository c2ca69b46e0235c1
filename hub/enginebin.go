package hub

import (
	"path"

	"fleet"
)

// engineBin is where w's engine binary was found on its node, when the
// worker runs the binary the probe looked for (the engine's default): a
// recipe's own bin: is what its argv shows already.
func engineBin(w fleet.Worker, p *fleet.Platform) string {
	if p == nil || w.Simulated || len(w.Argv) == 0 {
		return ""
	}
	found := p.Engines[w.Engine]
	if found == "" || path.Base(found) != path.Base(w.Argv[0]) {
		return ""
	}
	return found
}

// sanitizeEngines makes the paths a node reported printable: a file name
// may hold any byte but / and NUL, a terminal's escapes included.
func sanitizeEngines(found map[fleet.EngineKind]string) map[fleet.EngineKind]string {
	if found == nil {
		return nil
	}
	out := make(map[fleet.EngineKind]string, len(found))
	for k, where := range found {
		out[k] = fleet.Sanitize(where)
	}
	return out
}
