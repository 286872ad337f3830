package roled

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgChecker keeps one connection to the local PostgreSQL and asks whether it
// is writable. It is used by one goroutine at a time (the poller), so it needs
// no lock. On any error the connection is dropped and the next check
// reconnects.
type pgChecker struct {
	cfg  *pgx.ConnConfig
	tout time.Duration
	conn *pgx.Conn
}

// pgConnConfig parses dsn for one of roled's connections: its own
// application_name (so each shows up apart in pg_stat_activity) and the
// connect timeout.
func pgConnConfig(dsn, app string, timeout time.Duration) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres dsn: %w", err)
	}
	cc.ConnectTimeout = timeout
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = app
	return cc, nil
}

func newPGChecker(dsn string, timeout time.Duration) (*pgChecker, error) {
	cc, err := pgConnConfig(dsn, "hapair-roled", timeout)
	if err != nil {
		return nil, err
	}
	// A simple protocol keeps each check at one round trip and survives a
	// PostgreSQL restart without stale prepared statements.
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return &pgChecker{cfg: cc, tout: timeout}, nil
}

// replicaStats is what the replica agent needs from PostgreSQL.
type replicaStats struct {
	InRecovery     bool
	ReplayLSN      int64 // bytes; 0 on a primary
	ReceiveLag     int64 // received but not yet replayed, bytes
	Connections    int64 // client backends
	MaxConnections int64
}

// InRecovery connects if needed and runs SELECT pg_is_in_recovery().
func (p *pgChecker) InRecovery(ctx context.Context) (bool, error) {
	var rec bool
	err := p.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec)
	})
	return rec, err
}

// ReplicaStats reads recovery state, replay position, receive-replay lag and
// the connection count against max_connections in one round trip.
func (p *pgChecker) ReplicaStats(ctx context.Context) (replicaStats, error) {
	var s replicaStats
	const q = `SELECT pg_is_in_recovery(),
	  COALESCE(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'), 0)::bigint,
	  COALESCE(GREATEST(pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), 0), 0)::bigint,
	  (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
	  current_setting('max_connections')::bigint`
	err := p.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, q).Scan(&s.InRecovery, &s.ReplayLSN, &s.ReceiveLag, &s.Connections, &s.MaxConnections)
	})
	return s, err
}

func (p *pgChecker) query(ctx context.Context, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.tout)
	defer cancel()
	if p.conn == nil || p.conn.IsClosed() {
		c, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			return fmt.Errorf("postgres connect: %w", err)
		}
		p.conn = c
	}
	if err := f(ctx, p.conn); err != nil {
		p.Close()
		return fmt.Errorf("postgres query: %w", err)
	}
	return nil
}

// closeConn closes a PostgreSQL connection, waiting at most 200 ms for the
// server's goodbye (a frozen server must not hold the caller).
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_ = c.Close(ctx)
	cancel()
}

// Close drops the connection.
func (p *pgChecker) Close() {
	if p.conn != nil {
		closeConn(p.conn)
		p.conn = nil
	}
}
