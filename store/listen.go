package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Notification is one change another hub (or this one) announced on a
// channel, or, with Resync set, word that changes on Channel may have been
// missed (the connection was lost and made again): read everything again.
type Notification struct {
	Channel string
	Payload string
	Resync  bool
}

// listenRetry bounds the wait between attempts to reconnect Listen's
// connection.
const (
	listenRetryMin = 250 * time.Millisecond
	listenRetryMax = 5 * time.Second
)

// Listen delivers the notifications on channels (ChannelWorkers, …) until
// ctx ends, then closes the channel it returned. It listens on a connection
// of its own to the PostgreSQL server, made again whenever it is lost; after
// each reconnection it sends one Resync per channel, since notifications
// sent meanwhile are lost. On SQLite the channel never fires: one hub, no
// one else to hear from. The first connection is made before Listen
// returns, so an unreachable server is an error here.
func (s *Store) Listen(ctx context.Context, channels ...string) (<-chan Notification, error) {
	out := make(chan Notification, 64)
	if s.pgConfig == nil {
		go func() {
			<-ctx.Done()
			close(out)
		}()
		return out, nil
	}
	if len(channels) == 0 {
		return nil, errors.New("listen for changes: no channel given")
	}
	conn, err := s.listenConn(ctx, channels)
	if err != nil {
		return nil, err
	}
	go s.listen(ctx, conn, channels, out)
	return out, nil
}

func (s *Store) listen(ctx context.Context, conn *pgx.Conn, channels []string, out chan<- Notification) {
	defer close(out)
	send := func(n Notification) bool {
		select {
		case out <- n:
			return true
		case <-ctx.Done():
			return false
		}
	}
	wait := listenRetryMin
	for {
		if conn == nil {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
			var err error
			if conn, err = s.listenConn(ctx, channels); err != nil {
				s.logger.Warn("cannot listen for the other hubs' changes; trying again", "db", s.path, "in", wait, "err", err)
				wait = min(2*wait, listenRetryMax)
				continue
			}
			wait = listenRetryMin
			s.logger.Info("listening for the other hubs' changes again; reading everything anew", "db", s.path)
			for _, ch := range channels {
				if !send(Notification{Channel: ch, Resync: true}) {
					conn.Close(context.Background())
					return
				}
			}
		}
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			if ctx.Err() != nil {
				return
			}
			s.logger.Warn("lost the connection listening for the other hubs' changes; reconnecting", "db", s.path, "err", err)
			continue
		}
		if !send(Notification{Channel: n.Channel, Payload: n.Payload}) {
			conn.Close(context.Background())
			return
		}
	}
}

// listenConn connects and listens on channels.
func (s *Store) listenConn(ctx context.Context, channels []string) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pgConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("listen for changes in %s: connect: %s", s.path, secretsHidden(s.pgConfig, err))
	}
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+quoteChannel(ch)); err != nil {
			conn.Close(context.Background())
			return nil, fmt.Errorf("listen for changes on %s in %s: %s", ch, s.path, secretsHidden(s.pgConfig, err))
		}
	}
	if s.listening != nil {
		s.listening(conn.PgConn().PID())
	}
	return conn, nil
}

// secretsHidden words a driver's error without the configuration's password.
func secretsHidden(cfg *pgx.ConnConfig, err error) string {
	if cfg.Password == "" {
		return secretsOf("")(err)
	}
	return secretsOf("postgres://u:" + cfg.Password + "@h/")(err)
}
