package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"fleet"
)

const (
	// postgresConnectTimeout bounds one connection attempt when the URL
	// sets no connect_timeout, so an unreachable server fails a hub's start
	// with a message instead of hanging it.
	postgresConnectTimeout = 10 * time.Second
	// postgresMaxConns is how many connections one hub holds at most: a
	// burst of console readers and router writes queues in the hub rather
	// than using up the server's max_connections (100 by default), which
	// several hubs share.
	postgresMaxConns = 10
)

// exampleURL shows the form a database URL takes.
const exampleURL = "postgres://fleet:PASSWORD@db.lab:5432/fleet"

// OpenPostgres opens the PostgreSQL database at databaseURL
// (postgres://USER:PASSWORD@HOST:PORT/DATABASE?OPTIONS, pgx's options) and
// brings its schema up to date, as Open does for SQLite. The URL's password
// appears in no error and no log: the store names the database by
// fleet.RedactText of its URL.
func OpenPostgres(ctx context.Context, databaseURL string, opts ...Option) (*Store, error) {
	shown := fleet.RedactText(databaseURL)
	if !strings.HasPrefix(databaseURL, "postgres://") && !strings.HasPrefix(databaseURL, "postgresql://") {
		return nil, fmt.Errorf("open database: the database URL %q is not a PostgreSQL URL; give one like %s", shown, exampleURL)
	}
	hide := secretsOf(databaseURL)
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("open database %s: the URL is malformed: %s; give one like %s", shown, hide(err), exampleURL)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = postgresConnectTimeout
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(postgresMaxConns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		at := cfg.Host
		if !strings.HasPrefix(at, "/") {
			at = net.JoinHostPort(at, strconv.Itoa(int(cfg.Port)))
		}
		return nil, fmt.Errorf("open database %s: cannot reach the PostgreSQL server at %s as user %q, database %q: %s; "+
			"check that the server runs and the URL's host, port, user, password and database are right",
			shown, at, cfg.User, cfg.Database, hide(err))
	}
	listen := cfg.Copy()
	return open(ctx, db, &postgresDialect, shown, "is the PostgreSQL server still up?", append(opts, func(s *Store) { s.pgConfig = listen }))
}

// secretsOf returns a function that writes an error of the driver with the
// URL's password (in its user info or a password= option) replaced, and the
// rest through fleet.RedactText, since drivers may quote what they parsed.
func secretsOf(databaseURL string) func(error) string {
	var secrets []string
	if u, err := url.Parse(databaseURL); err == nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			secrets = append(secrets, pw, url.PathEscape(pw), url.QueryEscape(pw))
		}
		if pw := u.Query().Get("password"); pw != "" {
			secrets = append(secrets, pw, url.QueryEscape(pw))
		}
	} else if _, rest, ok := strings.Cut(databaseURL, "://"); ok {
		// Unparsable: hide whatever stands between the user's colon and the
		// host's @.
		if userinfo, _, ok := strings.Cut(rest, "@"); ok {
			if _, pw, ok := strings.Cut(userinfo, ":"); ok && pw != "" {
				secrets = append(secrets, pw)
			}
		}
	}
	return func(err error) string {
		msg := err.Error()
		for _, s := range secrets {
			msg = strings.ReplaceAll(msg, s, fleet.Redacted)
		}
		return fleet.RedactText(msg)
	}
}

// ErrOtherHub is wrapped when a change made without a hub is refused
// because a hub runs on the database.
var ErrOtherHub = errors.New("a hub runs on this database")
