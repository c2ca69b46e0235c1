package store

// migrations are applied in order, each in its own transaction, and recorded
// in schema_migrations; migration N is migrations[N-1]. Never edit a released
// migration: append a new one, because databases in the field already ran it.
//
// Times are INTEGER Unix nanoseconds (0 = unset) so they sort and compare
// without parsing; JSON columns hold values whose shape belongs to fleet.go.
var migrations = []string{
	// 1: the data model the hub started with.
	`
CREATE TABLE nodes (
	name      TEXT PRIMARY KEY,
	position  INTEGER NOT NULL,
	address   TEXT NOT NULL,
	identity  TEXT NOT NULL DEFAULT '',
	endpoint  TEXT NOT NULL DEFAULT '',
	host_key  TEXT NOT NULL DEFAULT '',
	platform  TEXT,
	probed_at INTEGER NOT NULL DEFAULT 0,
	state     TEXT NOT NULL DEFAULT 'unknown',
	reason    TEXT NOT NULL DEFAULT '',
	drained   INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE models (
	id              TEXT PRIMARY KEY,
	position        INTEGER NOT NULL,
	aliases         TEXT NOT NULL DEFAULT '[]',
	context         INTEGER NOT NULL,
	memory_gb       REAL NOT NULL DEFAULT 0,
	speed_tolerance REAL NOT NULL DEFAULT 0,
	reasoning       TEXT NOT NULL DEFAULT ''
);

CREATE TABLE recipes (
	model_id TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
	engine   TEXT NOT NULL,
	model    TEXT NOT NULL DEFAULT '',
	args     TEXT NOT NULL DEFAULT '[]',
	bin      TEXT NOT NULL DEFAULT '',
	install  TEXT NOT NULL DEFAULT '',
	env      TEXT NOT NULL DEFAULT '{}',
	profile  TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (model_id, engine)
);

CREATE TABLE placements (
	id       INTEGER PRIMARY KEY,
	position INTEGER NOT NULL,
	model    TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
	node     TEXT NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
	engine   TEXT NOT NULL DEFAULT '',
	UNIQUE (model, node)
);

CREATE TABLE workers (
	id             INTEGER PRIMARY KEY AUTOINCREMENT,
	node           TEXT NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
	model          TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
	engine         TEXT NOT NULL,
	state          TEXT NOT NULL,
	reason         TEXT NOT NULL DEFAULT '',
	port           INTEGER NOT NULL DEFAULT 0,
	pid            INTEGER NOT NULL DEFAULT 0,
	pgid           INTEGER NOT NULL DEFAULT 0,
	argv           TEXT NOT NULL DEFAULT '[]',
	launch_argv    TEXT NOT NULL DEFAULT '[]',
	simulated      INTEGER NOT NULL DEFAULT 0,
	started_at     INTEGER NOT NULL DEFAULT 0,
	ctx            INTEGER NOT NULL DEFAULT 0,
	slots          INTEGER NOT NULL DEFAULT 0,
	engine_version TEXT NOT NULL DEFAULT '',
	restarts       INTEGER NOT NULL DEFAULT 0,
	drained        INTEGER NOT NULL DEFAULT 0,
	UNIQUE (node, model)
);

CREATE TABLE samples (
	id            INTEGER PRIMARY KEY,
	worker        TEXT NOT NULL,
	at            INTEGER NOT NULL,
	kind          TEXT NOT NULL,
	ttft_ns       INTEGER NOT NULL DEFAULT 0,
	itl_ns        INTEGER NOT NULL DEFAULT 0,
	e2e_ns        INTEGER NOT NULL DEFAULT 0,
	output_tokens INTEGER NOT NULL DEFAULT 0,
	tok_s         REAL NOT NULL DEFAULT 0,
	detail        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX samples_worker_at ON samples (worker, at);
CREATE INDEX samples_at ON samples (at);

CREATE TABLE events (
	id      INTEGER PRIMARY KEY AUTOINCREMENT,
	at      INTEGER NOT NULL,
	level   TEXT NOT NULL,
	subject TEXT NOT NULL,
	message TEXT NOT NULL
);
CREATE INDEX events_subject ON events (subject, id);

CREATE TABLE users (
	name        TEXT PRIMARY KEY,
	role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
	public_key  TEXT NOT NULL,
	fingerprint TEXT NOT NULL UNIQUE,
	theme       TEXT NOT NULL DEFAULT ''
);

CREATE TABLE audit (
	id      INTEGER PRIMARY KEY AUTOINCREMENT,
	at      INTEGER NOT NULL,
	user    TEXT NOT NULL,
	action  TEXT NOT NULL,
	target  TEXT NOT NULL DEFAULT '',
	outcome TEXT NOT NULL DEFAULT ''
);

CREATE TABLE api_keys (
	name    TEXT PRIMARY KEY,
	hash    BLOB NOT NULL UNIQUE,
	created INTEGER NOT NULL,
	revoked INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE reference_shapes (
	model      TEXT PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
	shape      TEXT NOT NULL,
	pinned     INTEGER NOT NULL DEFAULT 0,
	updated_at INTEGER NOT NULL
);

CREATE TABLE bench_runs (
	id     INTEGER PRIMARY KEY,
	worker TEXT NOT NULL,
	run    TEXT NOT NULL,
	at     INTEGER NOT NULL
);
CREATE INDEX bench_runs_worker ON bench_runs (worker, id);
`,
	// 2: stopping a fleet. held is the operator's "stay stopped" (fleet stop),
	// kept apart from the observed state so a hub killed mid-restart does not
	// come back holding the worker. pending_stops keeps engines whose
	// placement or node was removed until the hub has stopped them; it has
	// no foreign keys, since the node row it needs to reach them is gone.
	`
ALTER TABLE workers ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
UPDATE workers SET held = 1 WHERE state = 'stopped' AND reason = 'stopped by an operator';

CREATE TABLE pending_stops (
	worker      TEXT PRIMARY KEY,
	node        TEXT NOT NULL,
	worker_json TEXT NOT NULL,
	node_json   TEXT NOT NULL,
	recorded_at INTEGER NOT NULL
);
`,
	// 3: the model's reference node (fleet file `reference:`), and where a
	// reference shape came from: the worker it was taken from and that
	// worker's command line, so a changed recipe on the reference node can
	// retake it.
	`
ALTER TABLE models ADD COLUMN reference TEXT NOT NULL DEFAULT '';
ALTER TABLE reference_shapes ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE reference_shapes ADD COLUMN argv TEXT NOT NULL DEFAULT '[]';
`,
	// 4: usage per router key, model and worker in minute buckets (bucket is
	// the minute's start in Unix seconds; key is '' when the router takes no
	// keys), and each key's optional limits (0: none).
	`
CREATE TABLE usage (
	bucket            INTEGER NOT NULL,
	key               TEXT NOT NULL,
	model             TEXT NOT NULL,
	worker            TEXT NOT NULL,
	requests          INTEGER NOT NULL DEFAULT 0,
	prompt_tokens     INTEGER NOT NULL DEFAULT 0,
	cached_tokens     INTEGER NOT NULL DEFAULT 0,
	completion_tokens INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (bucket, key, model, worker)
);
ALTER TABLE api_keys ADD COLUMN requests_per_minute INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN tokens_per_day INTEGER NOT NULL DEFAULT 0;
`,
	// 5: a placement's own context (fleet file `context:` on a placement),
	// smaller than its model's; 0 is the model's. A recipe's ready_timeout
	// in nanoseconds; 0 is the hub's default.
	`
ALTER TABLE placements ADD COLUMN context INTEGER NOT NULL DEFAULT 0;
ALTER TABLE recipes ADD COLUMN ready_timeout INTEGER NOT NULL DEFAULT 0;
`,
	// 6: a node's engine ports (fleet file `ports:`); 0-0 is the hub's
	// default.
	`
ALTER TABLE nodes ADD COLUMN port_min INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN port_max INTEGER NOT NULL DEFAULT 0;
`,
	// 7: an audit line that stands for repeats (a user's refusals of one
	// action within a minute) has count >= 1, how many, and last_at, when
	// the last was; an action's own line has count 0. The partial index
	// finds the repeat lines, which the audit's size cap prunes first.
	`
ALTER TABLE audit ADD COLUMN count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE audit ADD COLUMN last_at INTEGER NOT NULL DEFAULT 0;
CREATE INDEX audit_repeats ON audit (id) WHERE count > 0;
`,
	// 8: the fleet's identity and its launches. fleet_id is made once, here,
	// and every engine carries it with the serial of its launch; launches is
	// the last serial given out (a database restored from an older copy has
	// a smaller one than the engines it finds, and keeps the highest it saw
	// in newest_seen). home is the data dir the database belongs to ('' until
	// a hub claims it): a copy opened elsewhere is refused until an admin says
	// what it is. A worker's launch is recorded before its engine starts.
	`
CREATE TABLE fleet_identity (
	id          INTEGER PRIMARY KEY CHECK (id = 1),
	fleet_id    TEXT NOT NULL,
	home        TEXT NOT NULL DEFAULT '',
	launches    INTEGER NOT NULL DEFAULT 0,
	newest_seen INTEGER NOT NULL DEFAULT 0
);
INSERT INTO fleet_identity (id, fleet_id) VALUES (1, lower(hex(randomblob(16))));
ALTER TABLE workers ADD COLUMN launch INTEGER NOT NULL DEFAULT 0;
`,
	// 9: several hubs on one database (PostgreSQL; SQLite has the tables
	// too, for one hub that always leads). hubs: each hub's row, kept by its
	// heartbeat. lease: one row, the leader's, with an epoch that grows by
	// one each time the lease changes hands; every write about workers,
	// launches and pending stops carries the writer's epoch and PostgreSQL
	// refuses a stale one (fleet_fence). actions: an operator's action asked
	// on a follower, carried out by the leader. Times are the database's
	// clock, never a hub's.
	`
CREATE TABLE hubs (
	name         TEXT PRIMARY KEY,
	instance     TEXT NOT NULL,
	started_at   INTEGER NOT NULL,
	heartbeat_at INTEGER NOT NULL,
	http_addr    TEXT NOT NULL DEFAULT '',
	ssh_addr     TEXT NOT NULL DEFAULT '',
	version      TEXT NOT NULL DEFAULT '',
	home         TEXT NOT NULL DEFAULT ''
);
CREATE TABLE lease (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	holder     TEXT NOT NULL DEFAULT '',
	epoch      INTEGER NOT NULL DEFAULT 0,
	expires_at INTEGER NOT NULL DEFAULT 0
);
INSERT INTO lease (id) VALUES (1);
CREATE TABLE actions (
	id           INTEGER PRIMARY KEY,
	hub          TEXT NOT NULL,
	user_name    TEXT NOT NULL,
	action       TEXT NOT NULL,
	target       TEXT NOT NULL DEFAULT '',
	args         TEXT NOT NULL DEFAULT '{}',
	state        TEXT NOT NULL DEFAULT 'pending',
	result       TEXT NOT NULL DEFAULT '',
	epoch        INTEGER NOT NULL DEFAULT 0,
	requested_at INTEGER NOT NULL,
	done_at      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX actions_pending ON actions (state, id);
`,
	// 10: each hub's count of a key's requests admitted and tokens spent in
	// one minute (the minute's start in Unix seconds, by the database's clock),
	// which the hubs sharing one database read of each other to hold a
	// key's limits across them; rows go after a few minutes (key_name ''
	// is a hub's mark that it is there, with or without traffic).
	`
CREATE TABLE key_counts (
	minute   INTEGER NOT NULL,
	hub      TEXT NOT NULL,
	key_name TEXT NOT NULL,
	requests INTEGER NOT NULL DEFAULT 0,
	tokens   INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (minute, hub, key_name)
);
`,
	// 11: each hub's requests in flight on the workers its router has
	// drained (DrainInFlight), which the leader's drain, restart and stop
	// wait for; read_at is when the hub read the workers its router
	// follows, by the database's clock (Unix nanoseconds).
	`
CREATE TABLE drain_inflight (
	hub      TEXT NOT NULL,
	worker   TEXT NOT NULL,
	inflight INTEGER NOT NULL,
	read_at  INTEGER NOT NULL,
	PRIMARY KEY (hub, worker)
);
`,
	// 12: which hub wrote an audit line (its name, hubs.name) and which run
	// of it (hubs.instance): a hub started again marks the lines its killed
	// run left "started" as interrupted (InterruptAudit), and never
	// another running hub's.
	`
ALTER TABLE audit ADD COLUMN hub TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN instance TEXT NOT NULL DEFAULT '';
`,
	// 13: usage per hub as well (its name, hubs.name; '' before, and for a
	// store without a hub): each hub adds to rows of its own, so hubs
	// sharing a database never wait on each other's usage rows. Readers
	// sum over hubs. SQLite changes a primary key by copying the table.
	`
CREATE TABLE usage_by_hub (
	bucket            INTEGER NOT NULL,
	key               TEXT NOT NULL,
	model             TEXT NOT NULL,
	worker            TEXT NOT NULL,
	requests          INTEGER NOT NULL DEFAULT 0,
	prompt_tokens     INTEGER NOT NULL DEFAULT 0,
	cached_tokens     INTEGER NOT NULL DEFAULT 0,
	completion_tokens INTEGER NOT NULL DEFAULT 0,
	hub               TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (bucket, key, model, worker, hub)
);
INSERT INTO usage_by_hub (bucket, key, model, worker, requests, prompt_tokens, cached_tokens, completion_tokens)
	SELECT bucket, key, model, worker, requests, prompt_tokens, cached_tokens, completion_tokens FROM usage;
DROP TABLE usage;
ALTER TABLE usage_by_hub RENAME TO usage;
`,
	// 14: the GPUs a worker's engine holds (fleet.Worker.GPUs, a JSON array
	// of indices): a hub restarted adopts the engine with them, and places
	// no other engine on them.
	`
ALTER TABLE workers ADD COLUMN gpus TEXT NOT NULL DEFAULT '[]';
`,
}
