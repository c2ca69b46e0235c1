package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"fleet"
)

const workerColumns = `id, node, model, engine, state, reason, port, pid, pgid, argv, launch_argv, simulated, started_at, ctx, slots, engine_version, restarts, drained, held, launch, gpus`

func scanWorker(sc rowScanner) (fleet.Worker, error) {
	var (
		w                          fleet.Worker
		engine, state, argv, largv string
		gpus                       string // JSON, as argv
		simulated, drained, held   int
		startedAt                  int64
	)
	err := sc.Scan(&w.ID, &w.Node, &w.Model, &engine, &state, &w.Reason, &w.Port, &w.PID, &w.PGID,
		&argv, &largv, &simulated, &startedAt, &w.Context, &w.Slots, &w.EngineVersion, &w.Restarts, &drained, &held, &w.Launch, &gpus)
	if err != nil {
		return fleet.Worker{}, err
	}
	w.Engine = fleet.EngineKind(engine)
	w.State = fleet.WorkerState(state)
	if err := json.Unmarshal([]byte(argv), &w.Argv); err != nil {
		return fleet.Worker{}, fmt.Errorf("worker %s: stored argv is not valid JSON: %w", w.Name(), err)
	}
	if err := json.Unmarshal([]byte(largv), &w.LaunchArgv); err != nil {
		return fleet.Worker{}, fmt.Errorf("worker %s: stored launch argv is not valid JSON: %w", w.Name(), err)
	}
	if err := json.Unmarshal([]byte(gpus), &w.GPUs); err != nil {
		return fleet.Worker{}, fmt.Errorf("worker %s: stored GPUs are not valid JSON: %w", w.Name(), err)
	}
	if len(w.Argv) == 0 {
		w.Argv = nil
	}
	if len(w.LaunchArgv) == 0 {
		w.LaunchArgv = nil
	}
	if len(w.GPUs) == 0 {
		w.GPUs = nil
	}
	w.Simulated = simulated != 0
	w.Drained = drained != 0
	w.Held = held != 0
	w.StartedAt = fromUnixNano(startedAt)
	return w, nil
}

// Workers returns every worker, ordered by node then model.
func (s *Store) Workers(ctx context.Context) ([]fleet.Worker, error) {
	return queryAll(ctx, s.db, "read workers from "+s.path, scanWorker, `SELECT `+workerColumns+` FROM workers ORDER BY node, model`)
}

// Worker returns the worker of model on node.
func (s *Store) Worker(ctx context.Context, node, model string) (fleet.Worker, error) {
	return workerTx(ctx, s.db, node, model)
}

func workerTx(ctx context.Context, q queryer, node, model string) (fleet.Worker, error) {
	w, err := scanWorker(q.QueryRowContext(ctx, `SELECT `+workerColumns+` FROM workers WHERE node = ? AND model = ?`, node, model))
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Worker{}, fmt.Errorf("worker %s/%s: %w; `fleet workers` lists the existing ones", node, model, ErrNotFound)
	}
	if err != nil {
		return fleet.Worker{}, fmt.Errorf("read worker %s/%s: %w", node, model, err)
	}
	return w, nil
}

// SaveWorker inserts or updates the worker of w.Model on w.Node (w.ID is
// ignored: node and model name it) and returns it as stored, with its ID.
// The node and the model must be declared.
func (s *Store) SaveWorker(ctx context.Context, w fleet.Worker) (fleet.Worker, error) {
	if w.Node == "" || w.Model == "" {
		return fleet.Worker{}, fmt.Errorf("save worker %q: a worker needs both a node and a model", w.Name())
	}
	var saved fleet.Worker
	err := s.inChangeTx(ctx, change{state: stateShared, fenced: true, channel: ChannelWorkers, payload: w.Name()}, func(tx *txn) error {
		var err error
		saved, err = saveWorkerTx(ctx, tx, w)
		return err
	})
	if s.db.d.foreignKey(err) {
		return fleet.Worker{}, fmt.Errorf("save worker %s: node %q or model %q: %w in the fleet; apply a fleet file that declares both first",
			w.Name(), w.Node, w.Model, ErrNotFound)
	}
	if err != nil {
		return fleet.Worker{}, fmt.Errorf("save worker %s: %w", w.Name(), err)
	}
	return saved, nil
}

func saveWorkerTx(ctx context.Context, tx *txn, w fleet.Worker) (fleet.Worker, error) {
	argv, err := toJSON(nonNil(w.Argv))
	if err != nil {
		return fleet.Worker{}, err
	}
	largv, err := toJSON(nonNil(w.LaunchArgv))
	if err != nil {
		return fleet.Worker{}, err
	}
	gpus, err := toJSON(nonNil(w.GPUs))
	if err != nil {
		return fleet.Worker{}, err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO workers (node, model, engine, state, reason, port, pid, pgid, argv, launch_argv,
			simulated, started_at, ctx, slots, engine_version, restarts, drained, held, launch, gpus)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (node, model) DO UPDATE SET
			engine = excluded.engine, state = excluded.state, reason = excluded.reason, port = excluded.port,
			pid = excluded.pid, pgid = excluded.pgid, argv = excluded.argv, launch_argv = excluded.launch_argv,
			simulated = excluded.simulated, started_at = excluded.started_at, ctx = excluded.ctx,
			slots = excluded.slots, engine_version = excluded.engine_version, restarts = excluded.restarts,
			drained = excluded.drained, held = excluded.held, launch = excluded.launch, gpus = excluded.gpus`,
		w.Node, w.Model, string(w.Engine), string(w.State), w.Reason, w.Port, w.PID, w.PGID, argv, largv,
		boolInt(w.Simulated), unixNano(w.StartedAt), w.Context, w.Slots, w.EngineVersion, w.Restarts, boolInt(w.Drained), boolInt(w.Held), w.Launch, gpus)
	if err != nil {
		return fleet.Worker{}, err
	}
	return workerTx(ctx, tx, w.Node, w.Model)
}

// RecordLaunch gives w's next engine launch its serial and stores the worker
// with it, in one transaction, before the engine starts: a hub killed after
// the start but before it learnt the PID finds the engine by the serial.
// It returns the worker as stored.
func (s *Store) RecordLaunch(ctx context.Context, w fleet.Worker) (fleet.Worker, error) {
	var saved fleet.Worker
	// The serial is one UPDATE … RETURNING: two launches at once queue on
	// the identity row, and each gets its own.
	err := s.inChangeTx(ctx, change{state: stateShared, fenced: true, channel: ChannelWorkers, payload: w.Name()}, func(tx *txn) error {
		if err := tx.QueryRowContext(ctx, `UPDATE fleet_identity SET launches = launches + 1 RETURNING launches`).Scan(&w.Launch); err != nil {
			return err
		}
		var err error
		saved, err = saveWorkerTx(ctx, tx, w)
		return err
	})
	if s.db.d.foreignKey(err) {
		return fleet.Worker{}, fmt.Errorf("record the launch of %s: node %q or model %q: %w in the fleet", w.Name(), w.Node, w.Model, ErrNotFound)
	}
	if err != nil {
		return fleet.Worker{}, fmt.Errorf("record the launch of %s in %s before starting its engine (nothing was started; free disk space or fix the database, and the launch is tried again): %w", w.Name(), s.path, err)
	}
	return saved, nil
}

// DeleteWorker forgets the worker of model on node.
func (s *Store) DeleteWorker(ctx context.Context, node, model string) error {
	return s.changeOne(ctx, change{state: stateShared, fenced: true, channel: ChannelWorkers, payload: node + "/" + model}, "delete worker "+node+"/"+model, "worker "+node+"/"+model,
		"; `fleet workers` lists the existing ones", `DELETE FROM workers WHERE node = ? AND model = ?`, node, model)
}
