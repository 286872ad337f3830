package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The local writer is the lab application's second writer (issue 19): on
// each data node it writes straight to 127.0.0.1 like a cron job or a queue
// worker would, with no balancer and no idea of roles. It connects as
// LocalWriterRole, which roled's database fence makes read-only while the
// node is not ACTIVE; every acknowledged row is appended to a log, so a
// scenario can tell which acknowledged rows survived and how long a node
// that left ACTIVE still took them.

// LocalWriterRole is the PostgreSQL role the local writer connects as, and
// the role listed in roled's postgres.fence.roles in the lab.
const LocalWriterRole = "localwriter"

// LocalWriterLog is the writer's log of acknowledged rows, in each node's
// state directory: one line per row, "<seq> <unix nanoseconds>".
const LocalWriterLog = "local-writes.log"

// LocalWriterStatus is GET /local-writes.
type LocalWriterStatus struct {
	Node      string    `json:"node"`
	Acked     int64     `json:"acked"`
	Refused   int64     `json:"refused"` // attempts the database refused or timed out
	LastAck   time.Time `json:"last_ack"`
	LastError string    `json:"last_error,omitempty"`
	LastErrAt time.Time `json:"last_error_at"`
}

type localWriter struct {
	node     string
	adminDSN string // sets up the role and the table (the app's superuser DSN)
	dsn      string
	every    time.Duration
	log      *os.File

	mu  sync.Mutex
	st  LocalWriterStatus
	seq int64
}

func newLocalWriter(node, adminDSN, dsn, logPath string, every time.Duration) (*localWriter, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	w := &localWriter{node: node, adminDSN: adminDSN, dsn: dsn, every: every, log: f}
	w.st.Node = node
	// Continue the sequence after a restart of the app.
	w.seq = time.Now().UnixNano() / int64(time.Millisecond)
	return w, nil
}

// run writes one row every interval until ctx ends.
func (w *localWriter) run(ctx context.Context) {
	defer w.log.Close()
	t := time.NewTicker(w.every)
	defer t.Stop()
	var conn *pgx.Conn
	ready := false
	for {
		select {
		case <-ctx.Done():
			if conn != nil {
				_ = conn.Close(context.Background())
			}
			return
		case <-t.C:
		}
		if !ready {
			ready = w.setup(ctx) == nil
			if !ready {
				continue // a replica, or the database is down: next tick
			}
		}
		var err error
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err = pgx.Connect(cctx, w.dsn)
			cancel()
			if err != nil {
				conn = nil
				w.refused(err)
				continue
			}
		}
		w.seq++
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = conn.Exec(qctx, "INSERT INTO lab_local_writes (node, seq) VALUES ($1, $2)", w.node, w.seq)
		cancel()
		if err != nil {
			_ = conn.Close(context.Background())
			conn = nil
			w.refused(err)
			continue
		}
		now := time.Now()
		fmt.Fprintf(w.log, "%d %d\n", w.seq, now.UnixNano())
		w.mu.Lock()
		w.st.Acked++
		w.st.LastAck = now
		w.mu.Unlock()
	}
}

func (w *localWriter) refused(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.st.Refused++
	w.st.LastError, w.st.LastErrAt = err.Error(), time.Now()
}

// setup creates the role and the table on the primary, as a DBA would once.
func (w *localWriter) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, w.adminDSN)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, q := range []string{
		`DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '` + LocalWriterRole + `') THEN CREATE ROLE ` + LocalWriterRole + ` LOGIN; END IF; END$$`,
		`CREATE TABLE IF NOT EXISTS lab_local_writes (node text NOT NULL, seq bigint NOT NULL, at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (node, seq))`,
		`GRANT SELECT, INSERT ON lab_local_writes TO ` + LocalWriterRole,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func (w *localWriter) handle(rw http.ResponseWriter, _ *http.Request) {
	w.mu.Lock()
	st := w.st
	w.mu.Unlock()
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(st)
}

// LocalAcks reads host's log of acknowledged local-writer rows: seq → the
// time the writer saw the commit acknowledged.
func (l *Lab) LocalAcks(host string) (map[int64]time.Time, error) {
	f, err := os.Open(l.path(host, "state", LocalWriterLog))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[int64]time.Time{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var seq, ns int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &seq, &ns); err == nil {
			out[seq] = time.Unix(0, ns)
		}
	}
	return out, sc.Err()
}

// LocalAudit is what became of host's local-writer rows acknowledged in a
// window, as seen on the primary afterwards.
type LocalAudit struct {
	Acked int       // acknowledged in the window
	Lost  int       // of those, missing on the primary now
	Last  time.Time // last acknowledgement in the window (zero: none)
}

func (a LocalAudit) String() string {
	return fmt.Sprintf("%d acknowledged, %d lost", a.Acked, a.Lost)
}

// AuditLocal compares host's acknowledged local-writer rows in [from, to)
// with lab_local_writes on primary.
func (l *Lab) AuditLocal(ctx context.Context, primary, host string, from, to time.Time) (LocalAudit, error) {
	var a LocalAudit
	acks, err := l.LocalAcks(host)
	if err != nil {
		return a, err
	}
	conn, err := l.PGConnect(ctx, primary, 2*time.Second)
	if err != nil {
		return a, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT seq FROM lab_local_writes WHERE node = $1", host)
	if err != nil {
		return a, err
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return a, err
	}
	present := make(map[int64]bool, len(have))
	for _, s := range have {
		present[s] = true
	}
	for seq, at := range acks {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		a.Acked++
		if !present[seq] {
			a.Lost++
		}
		if at.After(a.Last) {
			a.Last = at
		}
	}
	return a, nil
}

// reportLocalWriter puts the isolated or frozen node's local-writer figures
// into r: rows it acknowledged after the fault began and after roled said
// PASSIVE (the database fence's job is to make that 0, plus the time the
// fence takes), and how many of its acknowledged rows the primary lacks.
//
// The window ends at until: the node's next ACTIVE (its fence is lifted
// then, with a new epoch, and its writes are legitimate again) or the end.
// Rows from 2 s before the fault count for "lost": asynchronous
// replication's loss is the last few milliseconds before it.
func reportLocalWriter(ctx context.Context, l *Lab, r *Result, name, node, primary string, t0, passive, until time.Time) {
	all, err := l.AuditLocal(ctx, primary, node, t0.Add(-2*time.Second), until)
	if err != nil {
		r.note("%s: local writer audit: %v", name, err)
		return
	}
	after, _ := l.AuditLocal(ctx, primary, node, t0, until)
	r.fig(name+": local writer rows acked on "+node+" after the fault", float64(after.Acked), "")
	r.fig(name+": local writer rows lost ("+node+", from 2 s before)", float64(all.Lost), "")
	if !passive.IsZero() {
		late, _ := l.AuditLocal(ctx, primary, node, passive, until)
		r.fig(name+": local writer rows acked on "+node+" after PASSIVE", float64(late.Acked), "")
		if !late.Last.IsZero() {
			r.secs(name+": last local ack on "+node+" after PASSIVE", late.Last.Sub(passive))
		}
		// The fence takes milliseconds; seconds of acknowledged local writes
		// after PASSIVE mean it is not working.
		if !late.Last.IsZero() && late.Last.Sub(passive) > 5*time.Second {
			r.fail("%s: the local writer on %s kept writing %s after roled said PASSIVE (database fence)", name, node, late.Last.Sub(passive))
		}
	}
	r.note("%s: local writer on %s since the fault: %s; from 2 s before: %s (until %s)", name, node, after, all, until.Sub(t0).Round(time.Millisecond))
}
