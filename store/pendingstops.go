package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"fleet"
)

// PendingStop is an engine whose placement (or node) was removed from the
// fleet while it may still run. The hub keeps it, with the node as it was
// declared, until it has stopped the engine: removing a node from the fleet
// file must not leave its engines running untracked.
type PendingStop struct {
	Worker     fleet.Worker
	Node       fleet.Node
	RecordedAt time.Time
}

// recordPendingStops keeps, inside an apply's transaction and before the
// nodes and workers are replaced, every worker with an engine (or with a
// launch recorded whose engine may have started) whose
// placement f no longer has.
func recordPendingStops(ctx context.Context, tx *txn, f fleet.Fleet) error {
	placed := map[[2]string]bool{}
	for _, p := range f.Placements {
		placed[[2]string{p.Node, p.Model}] = true
	}
	workers, err := queryAll(ctx, tx, "read the workers a removed placement leaves running", scanWorker,
		`SELECT `+workerColumns+` FROM workers WHERE pid > 0 OR launch > 0 ORDER BY node, model`)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, w := range workers {
		if placed[[2]string{w.Node, w.Model}] {
			continue
		}
		nodes, err := loadNodes(ctx, tx, w.Node)
		if err != nil || len(nodes) == 0 {
			return fmt.Errorf("read node %s of removed worker %s: %w", w.Node, w.Name(), err)
		}
		if err := putPendingStop(ctx, tx, PendingStop{Worker: w, Node: nodes[0], RecordedAt: now}); err != nil {
			return err
		}
	}
	return nil
}

func putPendingStop(ctx context.Context, tx *txn, p PendingStop) error {
	wj, err := toJSON(p.Worker)
	if err != nil {
		return fmt.Errorf("record the pending stop of %s: %w", p.Worker.Name(), err)
	}
	// The platform and state are history; the address, identity and host
	// key are what reaching the node again needs.
	p.Node.Platform, p.Node.State, p.Node.Reason = nil, "", ""
	nj, err := toJSON(p.Node)
	if err != nil {
		return fmt.Errorf("record the pending stop of %s: %w", p.Worker.Name(), err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO pending_stops (worker, node, worker_json, node_json, recorded_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (worker) DO UPDATE SET node = excluded.node, worker_json = excluded.worker_json,
			node_json = excluded.node_json, recorded_at = excluded.recorded_at`,
		p.Worker.Name(), p.Node.Name, wj, nj, unixNano(p.RecordedAt))
	if err != nil {
		return fmt.Errorf("record the pending stop of %s: %w", p.Worker.Name(), err)
	}
	return nil
}

// PendingStops lists the engines of removed placements the hub has yet to
// stop, oldest first.
func (s *Store) PendingStops(ctx context.Context) ([]PendingStop, error) {
	out, err := queryAll(ctx, s.db, "read pending stops from "+s.path, func(r rowScanner) (PendingStop, error) {
		var (
			wj, nj string
			at     int64
			p      PendingStop
		)
		if err := r.Scan(&wj, &nj, &at); err != nil {
			return p, err
		}
		if err := json.Unmarshal([]byte(wj), &p.Worker); err != nil {
			return p, fmt.Errorf("stored worker is not valid JSON: %w", err)
		}
		if err := json.Unmarshal([]byte(nj), &p.Node); err != nil {
			return p, fmt.Errorf("stored node is not valid JSON: %w", err)
		}
		p.RecordedAt = fromUnixNano(at)
		return p, nil
	}, `SELECT worker_json, node_json, recorded_at FROM pending_stops ORDER BY recorded_at, worker`)
	if err != nil || len(out) == 0 {
		return nil, err
	}
	return out, nil
}

// DeletePendingStop forgets the pending stop of worker (NODE/MODEL) once its
// engine is stopped; forgetting one that is not recorded is not an error.
func (s *Store) DeletePendingStop(ctx context.Context, worker string) error {
	err := s.inChangeTx(ctx, change{state: stateShared, fenced: true}, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM pending_stops WHERE worker = ?`, worker)
		return err
	})
	if err != nil {
		return fmt.Errorf("forget the pending stop of %s: %w", worker, err)
	}
	return nil
}
