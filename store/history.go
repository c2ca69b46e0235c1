package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"fleet"
)

// AddSamples stores a batch of measurements at once, so a busy router pays
// one commit per batch rather than one per request. It inserts new rows
// only, numbered by the database: hubs adding samples at once wait on
// nothing of each other's.
func (s *Store) AddSamples(ctx context.Context, samples []fleet.Sample) error {
	if len(samples) == 0 {
		return nil
	}
	for i, sm := range samples {
		if sm.Worker == "" || sm.At.IsZero() {
			return fmt.Errorf("add samples: sample %d has no worker or no time; nothing was stored", i)
		}
	}
	const columns = 9
	err := s.insertRows(ctx, len(samples), func(lo, hi int) (string, []any) {
		args := make([]any, 0, columns*(hi-lo))
		for _, sm := range samples[lo:hi] {
			args = append(args, sm.Worker, unixNano(sm.At), sm.Kind, int64(sm.TTFT), int64(sm.ITL), int64(sm.E2E),
				sm.OutputTokens, sm.TokPerSec, sm.Detail)
		}
		return `INSERT INTO samples (worker, at, kind, ttft_ns, itl_ns, e2e_ns, output_tokens, tok_s, detail)
			VALUES ` + valueRows(hi-lo, columns), args
	})
	if err != nil {
		return fmt.Errorf("add %d samples to %s: %w", len(samples), s.path, err)
	}
	return nil
}

// Samples returns the newest limit samples of worker (all workers when
// worker is "") taken at or after since, oldest first as sparklines draw
// them. limit <= 0 means all.
func (s *Store) Samples(ctx context.Context, worker string, since time.Time, limit int) ([]fleet.Sample, error) {
	query := `SELECT worker, at, kind, ttft_ns, itl_ns, e2e_ns, output_tokens, tok_s, detail FROM samples WHERE at >= ?`
	args := []any{unixNano(since)}
	if worker != "" {
		query += ` AND worker = ?`
		args = append(args, worker)
	}
	query += ` ORDER BY at DESC, id DESC LIMIT ?`
	args = append(args, clampLimit(limit))
	samples, err := queryAll(ctx, s.db, fmt.Sprintf("read samples of %q", worker), func(r rowScanner) (fleet.Sample, error) {
		var (
			sm             fleet.Sample
			at             int64
			ttft, itl, e2e int64
		)
		err := r.Scan(&sm.Worker, &at, &sm.Kind, &ttft, &itl, &e2e, &sm.OutputTokens, &sm.TokPerSec, &sm.Detail)
		sm.At = fromUnixNano(at)
		sm.TTFT, sm.ITL, sm.E2E = time.Duration(ttft), time.Duration(itl), time.Duration(e2e)
		return sm, err
	}, query, args...)
	if err != nil {
		return nil, err
	}
	slices.Reverse(samples)
	return samples, nil
}

// AddEvent appends a line to a node's or worker's history and returns it
// with its ID (and At set to now when it was zero).
func (s *Store) AddEvent(ctx context.Context, e fleet.Event) (fleet.Event, error) {
	if e.Subject == "" || e.Message == "" {
		return fleet.Event{}, errors.New("add event: an event needs a subject (node or NODE/MODEL) and a message")
	}
	if e.At.IsZero() {
		e.At = s.now()
	}
	if e.Level == "" {
		e.Level = "info"
	}
	err := s.db.QueryRowContext(ctx, `INSERT INTO events (at, level, subject, message) VALUES (?, ?, ?, ?) RETURNING id`,
		unixNano(e.At), e.Level, e.Subject, e.Message).Scan(&e.ID)
	if err != nil {
		return fleet.Event{}, fmt.Errorf("add event for %s: %w", e.Subject, err)
	}
	e.At = fromUnixNano(unixNano(e.At))
	return e, nil
}

// Events returns the newest limit events with an ID above afterID, newest
// last. subject "" means every subject; a node's name also matches its
// workers' events (NODE/…), since a node's history includes theirs.
// limit <= 0 means all.
func (s *Store) Events(ctx context.Context, subject string, afterID int64, limit int) ([]fleet.Event, error) {
	query := `SELECT id, at, level, subject, message FROM events WHERE id > ?`
	args := []any{afterID}
	if subject != "" {
		query += ` AND (subject = ?`
		args = append(args, subject)
		if !strings.Contains(subject, "/") {
			// substr rather than LIKE: node names may hold '_', a LIKE wildcard.
			query += ` OR substr(subject, 1, ?) = ?`
			args = append(args, len(subject)+1, subject+"/")
		}
		query += `)`
	}
	query += ` ORDER BY id DESC LIMIT ?`
	args = append(args, clampLimit(limit))
	events, err := queryAll(ctx, s.db, fmt.Sprintf("read events of %q", subject), func(r rowScanner) (fleet.Event, error) {
		var (
			e  fleet.Event
			at int64
		)
		err := r.Scan(&e.ID, &at, &e.Level, &e.Subject, &e.Message)
		e.At = fromUnixNano(at)
		return e, err
	}, query, args...)
	if err != nil {
		return nil, err
	}
	slices.Reverse(events)
	return events, nil
}

// AddAudit records who did what to what, and how it ended.
func (s *Store) AddAudit(ctx context.Context, a fleet.AuditEntry) error {
	_, err := s.BeginAudit(ctx, a)
	return err
}

// BeginAudit writes the audit entry of an action about to happen and
// returns its id, for SetAuditOutcome to record how it ended. The hub writes
// it first so that an action whose audit cannot be written does not happen.
// One insert of a new row, numbered by the database: it waits on no other
// hub; SetAuditOutcome and SetAuditCount then write that row alone.
func (s *Store) BeginAudit(ctx context.Context, a fleet.AuditEntry) (int64, error) {
	if a.User == "" || a.Action == "" {
		return 0, errors.New("add audit entry: an entry needs a user and an action")
	}
	if a.At.IsZero() {
		a.At = s.now()
	}
	var id int64
	origin := s.auditOrigin.Load()
	if origin == nil {
		origin = &auditOrigin{}
	}
	err := s.db.QueryRowContext(ctx, `INSERT INTO audit (at, "user", action, target, outcome, count, last_at, hub, instance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		unixNano(a.At), a.User, a.Action, a.Target, a.Outcome, a.Count, unixNano(a.Last), origin.hub, origin.instance).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("add audit entry %q by %s: %w", a.Action, a.User, err)
	}
	return id, nil
}

// auditOrigin is the hub that writes audit lines, and the run of it.
type auditOrigin struct{ hub, instance string }

// SetAuditOrigin names the hub (hubs.name) and the run of it (a new
// instance each start) that write audit lines from now on, and the hub
// whose usage rows AddUsage adds to. Lines written before it is called, or
// by a command that opens the database without a hub, name neither.
func (s *Store) SetAuditOrigin(hub, instance string) {
	s.auditOrigin.Store(&auditOrigin{hub: hub, instance: instance})
}

// InterruptAudit gives the lines still saying started that an earlier run
// left (a hub killed while its action ran) the outcome interrupted, and
// returns how many. On SQLite, one hub at a time under the data dir's lock,
// that is every such line but this run's. On PostgreSQL, where other hubs
// may be running theirs, it is the lines of this hub's name from another
// run: a name is held by one running hub at a time (RegisterHub).
func (s *Store) InterruptAudit(ctx context.Context, started, interrupted string) (int64, error) {
	origin := s.auditOrigin.Load()
	if origin == nil || origin.instance == "" {
		return 0, errors.New("mark interrupted audit lines: this hub has not named itself (SetAuditOrigin)")
	}
	query, args := `UPDATE audit SET outcome = ? WHERE outcome = ? AND instance <> ?`, []any{interrupted, started, origin.instance}
	if s.Clustered() {
		query, args = query+` AND hub = ?`, append(args, origin.hub)
	}
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("mark the audit lines of actions a stopped hub left unfinished: %w", err)
	}
	return res.RowsAffected()
}

// SetAuditOutcome records how the action of audit entry id ended.
func (s *Store) SetAuditOutcome(ctx context.Context, id int64, outcome string) error {
	return s.execOne(ctx, fmt.Sprintf("record the outcome of audit entry %d", id), "no such entry", "",
		`UPDATE audit SET outcome = ? WHERE id = ?`, outcome, id)
}

// SetAuditCount records how many repeats audit line id stands for and when
// the last was (see fleet.AuditEntry.Count).
func (s *Store) SetAuditCount(ctx context.Context, id int64, count int, last time.Time) error {
	return s.execOne(ctx, fmt.Sprintf("record the count of audit entry %d", id), "no such entry", "",
		`UPDATE audit SET count = ?, last_at = ? WHERE id = ?`, count, unixNano(last), id)
}

// Audit returns the newest limit entries, newest last. limit <= 0 means all.
func (s *Store) Audit(ctx context.Context, limit int) ([]fleet.AuditEntry, error) {
	entries, err := queryAll(ctx, s.db, "read audit log", func(r rowScanner) (fleet.AuditEntry, error) {
		var (
			a          fleet.AuditEntry
			at, lastAt int64
		)
		err := r.Scan(&a.ID, &at, &a.User, &a.Action, &a.Target, &a.Outcome, &a.Count, &lastAt)
		a.At, a.Last = fromUnixNano(at), fromUnixNano(lastAt)
		return a, err
	}, `SELECT id, at, "user", action, target, outcome, count, last_at FROM audit ORDER BY id DESC LIMIT ?`, clampLimit(limit))
	if err != nil {
		return nil, err
	}
	slices.Reverse(entries)
	return entries, nil
}

// Reference is a model's stored reference shape and where it came from.
type Reference struct {
	// Shape is the bench package's JSON.
	Shape []byte
	// Pinned is set by `shape pin`: the shape stays until the reference
	// node's worker runs a different command line.
	Pinned bool
	// Source is the worker the shape was taken from; Argv is the command
	// line the model's reference worker ran when it was recorded.
	Source string
	Argv   []string
}

// SetReference stores the response shape workers of model must match.
func (s *Store) SetReference(ctx context.Context, model string, r Reference) error {
	if !json.Valid(r.Shape) {
		return fmt.Errorf("set reference shape of model %s: the shape is not valid JSON", model)
	}
	argv, err := toJSON(nonNil(r.Argv))
	if err != nil {
		return fmt.Errorf("set reference shape of model %s: %w", model, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO reference_shapes (model, shape, pinned, source, argv, updated_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (model) DO UPDATE SET shape = excluded.shape, pinned = excluded.pinned, source = excluded.source,
			argv = excluded.argv, updated_at = excluded.updated_at`,
		model, string(r.Shape), boolInt(r.Pinned), r.Source, argv, s.now().UnixNano())
	if s.db.d.foreignKey(err) {
		return fmt.Errorf("set reference shape: model %q: %w; `fleet models` lists the declared ones", model, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("set reference shape of model %s: %w", model, err)
	}
	return nil
}

// Reference returns the stored reference of model (ErrNotFound if none).
func (s *Store) Reference(ctx context.Context, model string) (Reference, error) {
	var (
		r           Reference
		shape, argv string
		pinned      int
	)
	err := s.db.QueryRowContext(ctx, `SELECT shape, pinned, source, argv FROM reference_shapes WHERE model = ?`, model).Scan(&shape, &pinned, &r.Source, &argv)
	if errors.Is(err, sql.ErrNoRows) {
		return Reference{}, fmt.Errorf("reference shape of model %q: %w; none was recorded yet", model, ErrNotFound)
	}
	if err != nil {
		return Reference{}, fmt.Errorf("read reference shape of model %s: %w", model, err)
	}
	if err := json.Unmarshal([]byte(argv), &r.Argv); err != nil {
		return Reference{}, fmt.Errorf("read reference shape of model %s: stored argv is not valid JSON: %w", model, err)
	}
	if len(r.Argv) == 0 {
		r.Argv = nil
	}
	r.Shape, r.Pinned = []byte(shape), pinned != 0
	return r, nil
}

// BenchRun is one stored bench result of a worker; Run is the bench
// package's JSON.
type BenchRun struct {
	ID     int64           `json:"id"`
	Worker string          `json:"worker"`
	At     time.Time       `json:"at"`
	Run    json.RawMessage `json:"run"`
}

// AddBenchRun stores a bench result (JSON) of worker NODE/MODEL.
func (s *Store) AddBenchRun(ctx context.Context, worker string, run []byte) error {
	if worker == "" {
		return errors.New("add bench run: no worker named")
	}
	if !json.Valid(run) {
		return fmt.Errorf("add bench run of %s: the result is not valid JSON", worker)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO bench_runs (worker, run, at) VALUES (?, ?, ?)`, worker, string(run), s.now().UnixNano()); err != nil {
		return fmt.Errorf("add bench run of %s: %w", worker, err)
	}
	return nil
}

// LatestBenchRuns returns the newest bench run of each worker and split
// (chat, agent), however many older ones are stored: what the hub charts
// at start.
func (s *Store) LatestBenchRuns(ctx context.Context) ([]BenchRun, error) {
	return queryAll(ctx, s.db, "read the latest bench runs", scanBenchRun, `SELECT id, worker, run, at FROM bench_runs
		WHERE id IN (SELECT MAX(id) FROM bench_runs GROUP BY worker, `+s.db.d.jsonField("run", "split")+`) ORDER BY worker, id`)
}

// BenchRuns returns a worker's stored bench runs, newest first, at most
// limit of them.
func (s *Store) BenchRuns(ctx context.Context, worker string, limit int) ([]BenchRun, error) {
	return queryAll(ctx, s.db, "read the bench runs of "+worker, scanBenchRun,
		`SELECT id, worker, run, at FROM bench_runs WHERE worker = ? ORDER BY id DESC LIMIT ?`, worker, limit)
}

func scanBenchRun(sc rowScanner) (BenchRun, error) {
	var (
		r   BenchRun
		run string
		at  int64
	)
	err := sc.Scan(&r.ID, &r.Worker, &run, &at)
	r.Run = json.RawMessage(run)
	r.At = fromUnixNano(at)
	return r, err
}
