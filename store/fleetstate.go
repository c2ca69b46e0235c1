package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"fleet"
)

// queryer is what reads need, so the same code runs on the pool or inside a
// transaction.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// LoadFleet returns the declared state in the order it was applied, with the
// runtime columns of the nodes (platform, state, host key) filled in.
func (s *Store) LoadFleet(ctx context.Context) (fleet.Fleet, error) {
	f, err := loadFleet(ctx, s.db)
	if err != nil {
		return fleet.Fleet{}, fmt.Errorf("load fleet from %s: %w", s.path, err)
	}
	return f, nil
}

func loadFleet(ctx context.Context, q queryer) (fleet.Fleet, error) {
	nodes, err := loadNodes(ctx, q, "")
	if err != nil {
		return fleet.Fleet{}, err
	}
	models, err := loadModels(ctx, q)
	if err != nil {
		return fleet.Fleet{}, err
	}
	placements, err := loadPlacements(ctx, q)
	if err != nil {
		return fleet.Fleet{}, err
	}
	return fleet.Fleet{Nodes: nodes, Models: models, Placements: placements}, nil
}

const nodeColumns = `name, address, identity, endpoint, port_min, port_max, host_key, platform, probed_at, state, reason, drained`

func scanNode(sc rowScanner) (fleet.Node, error) {
	var (
		n        fleet.Node
		platform sql.NullString
		probedAt int64
		state    string
		drained  int
	)
	if err := sc.Scan(&n.Name, &n.Address, &n.Identity, &n.Endpoint, &n.Ports.Min, &n.Ports.Max, &n.HostKey, &platform, &probedAt, &state, &n.Reason, &drained); err != nil {
		return fleet.Node{}, err
	}
	if platform.Valid {
		var p fleet.Platform
		if err := json.Unmarshal([]byte(platform.String), &p); err != nil {
			return fleet.Node{}, fmt.Errorf("node %s: stored platform is not valid JSON: %w", n.Name, err)
		}
		n.Platform = &p
	}
	n.ProbedAt = fromUnixNano(probedAt)
	n.State = fleet.NodeState(state)
	n.Drained = drained != 0
	return n, nil
}

func loadNodes(ctx context.Context, q queryer, name string) ([]fleet.Node, error) {
	query := `SELECT ` + nodeColumns + ` FROM nodes`
	var args []any
	if name != "" {
		query += ` WHERE name = ?`
		args = append(args, name)
	}
	return queryAll(ctx, q, "read nodes", scanNode, query+` ORDER BY position, name`, args...)
}

func loadModels(ctx context.Context, q queryer) ([]fleet.Model, error) {
	models, err := queryAll(ctx, q, "read models", func(r rowScanner) (fleet.Model, error) {
		var (
			m       fleet.Model
			aliases string
		)
		if err := r.Scan(&m.ID, &aliases, &m.Context, &m.MemoryGB, &m.SpeedTolerance, &m.Reasoning, &m.Reference); err != nil {
			return m, err
		}
		if err := json.Unmarshal([]byte(aliases), &m.Aliases); err != nil {
			return m, fmt.Errorf("model %s: stored aliases are not valid JSON: %w", m.ID, err)
		}
		if len(m.Aliases) == 0 {
			m.Aliases = nil
		}
		m.Recipes = map[fleet.EngineKind]fleet.Recipe{}
		return m, nil
	}, `SELECT id, aliases, context, memory_gb, speed_tolerance, reasoning, reference FROM models ORDER BY position, id`)
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(models))
	for i, m := range models {
		index[m.ID] = i
	}
	err = eachRow(ctx, q, "read recipes", func(row rowScanner) error {
		var (
			modelID, engine, args, env string
			r                          fleet.Recipe
			readyNS                    int64
		)
		if err := row.Scan(&modelID, &engine, &r.Model, &args, &r.Bin, &r.Install, &env, &r.Profile, &readyNS); err != nil {
			return err
		}
		r.Engine, r.ReadyTimeout = fleet.EngineKind(engine), time.Duration(readyNS)
		if err := json.Unmarshal([]byte(args), &r.Args); err != nil {
			return fmt.Errorf("recipe %s/%s: stored args are not valid JSON: %w", modelID, engine, err)
		}
		if err := json.Unmarshal([]byte(env), &r.Env); err != nil {
			return fmt.Errorf("recipe %s/%s: stored env is not valid JSON: %w", modelID, engine, err)
		}
		if len(r.Args) == 0 {
			r.Args = nil
		}
		if len(r.Env) == 0 {
			r.Env = nil
		}
		if i, ok := index[modelID]; ok { // always, with foreign keys on
			models[i].Recipes[r.Engine] = r
		}
		return nil
	}, `SELECT model_id, engine, model, args, bin, install, env, profile, ready_timeout FROM recipes`)
	if err != nil {
		return nil, err
	}
	return models, nil
}

func loadPlacements(ctx context.Context, q queryer) ([]fleet.Placement, error) {
	return queryAll(ctx, q, "read placements", func(r rowScanner) (fleet.Placement, error) {
		var (
			p      fleet.Placement
			engine string
		)
		err := r.Scan(&p.Model, &p.Node, &engine, &p.Context)
		p.Engine = fleet.EngineKind(engine)
		return p, err
	}, `SELECT model, node, engine, context FROM placements ORDER BY position, id`)
}

// ApplyFleet replaces the declared state (nodes, models with their recipes,
// placements) with f in one transaction: a crash leaves either the old state
// or f, never a mix. Nodes that stay keep what the hub learned about them
// (host key, platform, state, drain) unless their address changed, since a
// new address is a different machine whose pinned key would be wrong.
// Workers whose placement disappears are deleted with it; those with an
// engine are kept as pending stops (PendingStops) until the hub stopped them.
func (s *Store) ApplyFleet(ctx context.Context, f fleet.Fleet) error {
	if err := checkFleet(f); err != nil {
		return fmt.Errorf("apply fleet: %w; nothing was changed", err)
	}
	pause := s.applyPause
	if pause == nil {
		pause = func(string) {}
	}
	// Exclusive on the fleet state: it reads the workers to record pending
	// stops and deletes those without a placement, so no worker write of
	// the leader's may slip in between (lockFleetState).
	err := s.inChangeTx(ctx, change{state: stateExclusive, fenced: true, channel: ChannelFleet}, func(tx *txn) error {
		if err := tx.notify(ctx, ChannelWorkers, ""); err != nil {
			return err
		}
		if err := recordPendingStops(ctx, tx, f); err != nil {
			return err
		}
		if err := applyNodes(ctx, tx, f.Nodes); err != nil {
			return err
		}
		pause("nodes")
		if err := applyModels(ctx, tx, f.Models); err != nil {
			return err
		}
		pause("models")
		if err := applyPlacements(ctx, tx, f.Placements); err != nil {
			return err
		}
		pause("placements")
		if _, err := tx.ExecContext(ctx, `DELETE FROM workers WHERE NOT EXISTS (
			SELECT 1 FROM placements p WHERE p.model = workers.model AND p.node = workers.node)`); err != nil {
			return fmt.Errorf("delete workers without a placement: %w", err)
		}
		pause("workers")
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply fleet to %s: %w; nothing was changed", s.path, err)
	}
	pause("committed")
	return nil
}

// checkFleet refuses what the schema would refuse anyway, with words an
// operator can act on instead of a constraint name.
func checkFleet(f fleet.Fleet) error {
	nodes := map[string]bool{}
	for _, n := range f.Nodes {
		if n.Name == "" {
			return errors.New("a node has no name")
		}
		if nodes[n.Name] {
			return fmt.Errorf("node %s is declared twice", n.Name)
		}
		if n.Address == "" {
			return fmt.Errorf("node %s has no address", n.Name)
		}
		nodes[n.Name] = true
	}
	models := map[string]bool{}
	for _, m := range f.Models {
		if m.ID == "" {
			return errors.New("a model has no id")
		}
		if models[m.ID] {
			return fmt.Errorf("model %s is declared twice", m.ID)
		}
		if m.Context <= 0 {
			return fmt.Errorf("model %s: context must be a positive number of tokens, not %d", m.ID, m.Context)
		}
		models[m.ID] = true
	}
	placed := map[[2]string]bool{}
	for _, p := range f.Placements {
		if !models[p.Model] {
			return fmt.Errorf("placement on node %s names model %s, which the fleet does not declare", p.Node, p.Model)
		}
		if !nodes[p.Node] {
			return fmt.Errorf("placement of model %s names node %s, which the fleet does not declare", p.Model, p.Node)
		}
		key := [2]string{p.Model, p.Node}
		if placed[key] {
			return fmt.Errorf("model %s is placed twice on node %s; a node runs one worker per model", p.Model, p.Node)
		}
		placed[key] = true
	}
	return nil
}

func applyNodes(ctx context.Context, tx *txn, nodes []fleet.Node) error {
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if err := deleteMissing(ctx, tx, "nodes", "name", names); err != nil {
		return fmt.Errorf("remove nodes: %w", err)
	}
	for i, n := range nodes {
		// A changed address forgets the runtime columns: they described
		// the machine at the old address.
		_, err := tx.ExecContext(ctx, `INSERT INTO nodes (name, position, address, identity, endpoint, port_min, port_max)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET
				position = excluded.position,
				identity = excluded.identity,
				endpoint = excluded.endpoint,
				port_min = excluded.port_min,
				port_max = excluded.port_max,
				host_key  = CASE WHEN nodes.address = excluded.address THEN nodes.host_key ELSE '' END,
				platform  = CASE WHEN nodes.address = excluded.address THEN nodes.platform ELSE NULL END,
				probed_at = CASE WHEN nodes.address = excluded.address THEN nodes.probed_at ELSE 0 END,
				state     = CASE WHEN nodes.address = excluded.address THEN nodes.state ELSE 'unknown' END,
				reason    = CASE WHEN nodes.address = excluded.address THEN nodes.reason ELSE '' END,
				address   = excluded.address`,
			n.Name, i, n.Address, n.Identity, n.Endpoint, n.Ports.Min, n.Ports.Max)
		if err != nil {
			return fmt.Errorf("save node %s: %w", n.Name, err)
		}
	}
	return nil
}

func applyModels(ctx context.Context, tx *txn, models []fleet.Model) error {
	ids := make([]string, 0, len(models))
	for _, m := range models {
		ids = append(ids, m.ID)
	}
	if err := deleteMissing(ctx, tx, "models", "id", ids); err != nil {
		return fmt.Errorf("remove models: %w", err)
	}
	for i, m := range models {
		aliases, err := toJSON(nonNil(m.Aliases))
		if err != nil {
			return fmt.Errorf("save model %s: %w", m.ID, err)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO models (id, position, aliases, context, memory_gb, speed_tolerance, reasoning, reference)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET
				position = excluded.position, aliases = excluded.aliases, context = excluded.context,
				memory_gb = excluded.memory_gb, speed_tolerance = excluded.speed_tolerance,
				reasoning = excluded.reasoning, reference = excluded.reference`,
			m.ID, i, aliases, m.Context, m.MemoryGB, m.SpeedTolerance, m.Reasoning, m.Reference)
		if err != nil {
			return fmt.Errorf("save model %s: %w", m.ID, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM recipes WHERE model_id = ?`, m.ID); err != nil {
			return fmt.Errorf("save model %s: replace recipes: %w", m.ID, err)
		}
		engines := make([]fleet.EngineKind, 0, len(m.Recipes))
		for e := range m.Recipes {
			engines = append(engines, e)
		}
		slices.Sort(engines)
		for _, e := range engines {
			r := m.Recipes[e]
			args, err := toJSON(nonNil(r.Args))
			if err != nil {
				return fmt.Errorf("save model %s: recipe %s: %w", m.ID, e, err)
			}
			env := "{}"
			if len(r.Env) > 0 {
				if env, err = toJSON(r.Env); err != nil {
					return fmt.Errorf("save model %s: recipe %s: %w", m.ID, e, err)
				}
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO recipes (model_id, engine, model, args, bin, install, env, profile, ready_timeout)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				m.ID, string(e), r.Model, args, r.Bin, r.Install, env, r.Profile, int64(r.ReadyTimeout))
			if err != nil {
				return fmt.Errorf("save model %s: recipe %s: %w", m.ID, e, err)
			}
		}
	}
	return nil
}

func applyPlacements(ctx context.Context, tx *txn, placements []fleet.Placement) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM placements`); err != nil {
		return fmt.Errorf("replace placements: %w", err)
	}
	for i, p := range placements {
		_, err := tx.ExecContext(ctx, `INSERT INTO placements (position, model, node, engine, context) VALUES (?, ?, ?, ?, ?)`,
			i, p.Model, p.Node, string(p.Engine), p.Context)
		if err != nil {
			return fmt.Errorf("save placement of model %s on node %s: %w", p.Model, p.Node, err)
		}
	}
	return nil
}

// deleteMissing deletes the rows of table whose key is not in keep. The key
// list goes through JSON so any number of names is one statement.
func deleteMissing(ctx context.Context, tx *txn, table, column string, keep []string) error {
	list, err := toJSON(nonNil(keep))
	if err != nil {
		return err
	}
	// table and column are constants of this package, never input.
	_, err = tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+column+` NOT IN (`+tx.d.jsonStrings+`)`, list)
	return err
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Node returns one node with its runtime state.
func (s *Store) Node(ctx context.Context, name string) (fleet.Node, error) {
	nodes, err := loadNodes(ctx, s.db, name)
	if err != nil {
		return fleet.Node{}, fmt.Errorf("read node %s: %w", name, err)
	}
	if name == "" || len(nodes) == 0 {
		return fleet.Node{}, fmt.Errorf("node %q: %w; `fleet nodes` lists the declared ones", name, ErrNotFound)
	}
	return nodes[0], nil
}

// Nodes returns every node in declared order.
func (s *Store) Nodes(ctx context.Context) ([]fleet.Node, error) {
	nodes, err := loadNodes(ctx, s.db, "")
	if err != nil {
		return nil, fmt.Errorf("read nodes from %s: %w", s.path, err)
	}
	return nodes, nil
}

// updateNode runs one UPDATE on a node and turns "no row" into ErrNotFound.
// It needs no named lock: one statement on one row, which waits for an
// apply only if that apply writes the same node.
func (s *Store) updateNode(ctx context.Context, what, name, query string, args ...any) error {
	return s.changeOne(ctx, change{channel: ChannelFleet, payload: name}, fmt.Sprintf("set %s of node %s", what, name), fmt.Sprintf("node %q", name),
		"; `fleet nodes` lists the declared ones", query, append(args, name)...)
}

// SetNodeProbe records what a probe learned about a node.
func (s *Store) SetNodeProbe(ctx context.Context, name string, p fleet.Platform, at time.Time) error {
	js, err := toJSON(p)
	if err != nil {
		return fmt.Errorf("set platform of node %s: %w", name, err)
	}
	return s.updateNode(ctx, "platform", name, `UPDATE nodes SET platform = ?, probed_at = ? WHERE name = ?`, js, unixNano(at))
}

// SetNodeState records whether the hub can reach a node, and why not.
func (s *Store) SetNodeState(ctx context.Context, name string, st fleet.NodeState, reason string) error {
	switch st {
	case fleet.NodeUnknown, fleet.NodeUp, fleet.NodeUnreachable:
	default:
		return fmt.Errorf("set state of node %s: %q is not a node state (want %s, %s or %s)", name, st, fleet.NodeUnknown, fleet.NodeUp, fleet.NodeUnreachable)
	}
	return s.updateNode(ctx, "state", name, `UPDATE nodes SET state = ?, reason = ? WHERE name = ?`, string(st), reason)
}

// SetNodeHostKey pins the SSH host key of a node (authorized_keys format).
func (s *Store) SetNodeHostKey(ctx context.Context, name, key string) error {
	return s.updateNode(ctx, "host key", name, `UPDATE nodes SET host_key = ? WHERE name = ?`, key)
}

// SetNodeDrained marks a node drained (no new workers, no new requests) or not.
func (s *Store) SetNodeDrained(ctx context.Context, name string, drained bool) error {
	return s.updateNode(ctx, "drain flag", name, `UPDATE nodes SET drained = ? WHERE name = ?`, boolInt(drained))
}
