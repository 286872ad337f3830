package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// AppPort is the test application's HTTP port on each data node.
const AppPort = 8080

// App is the lab's test application: like a real one it writes to its local
// database (always 127.0.0.1) and to the synced directory, and knows nothing
// about roles.
type App struct {
	node   string
	dir    string // synced directory; files go to <dir>/w/<id>.txt
	marker string // roled's marker file, copied into each file (epoch proof)
	dsn    string
	conns  chan *pgx.Conn // idle connections to the local database
	open   atomic.Int32   // connections open, idle or in use
	slots  chan struct{}  // bounds open connections, like any application pool
	table  atomic.Bool
}

// RunApp serves the test application until ctx ends ("hapair-lab app").
func RunApp(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	node := fs.String("node", "", "node name")
	listen := fs.String("listen", ":"+strconv.Itoa(AppPort), "listen address")
	dir := fs.String("dir", "", "synced directory")
	marker := fs.String("marker", "", "roled marker file")
	dsn := fs.String("dsn", "postgres://postgres:postgres@127.0.0.1:5432/postgres?connect_timeout=1", "local PostgreSQL")
	lwLog := fs.String("local-writer-log", "", "run the local writer (localwriter.go), logging acknowledged rows here")
	lwDSN := fs.String("local-writer-dsn", "postgres://"+LocalWriterRole+"@127.0.0.1:5432/postgres?connect_timeout=1", "the local writer's PostgreSQL")
	lwEvery := fs.Duration("local-writer-every", 100*time.Millisecond, "the local writer's period")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := pgx.ParseConfig(*dsn); err != nil {
		return fmt.Errorf("dsn: %w", err)
	}
	a := &App{node: *node, dir: *dir, marker: *marker, dsn: *dsn, conns: make(chan *pgx.Conn, 4),
		slots: make(chan struct{}, 4)}
	go a.keepWarm(ctx, 250*time.Millisecond)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", a.health)
	mux.HandleFunc("/write", a.write)
	mux.HandleFunc("/check", a.check)
	if *lwLog != "" {
		lw, err := newLocalWriter(*node, *dsn, *lwDSN, *lwLog, *lwEvery)
		if err != nil {
			return fmt.Errorf("local writer: %w", err)
		}
		go lw.run(ctx)
		mux.HandleFunc("/local-writes", lw.handle)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (a *App) health(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"node": a.node})
}

// WriteResult is /write's answer.
type WriteResult struct {
	Node  string `json:"node"`
	ID    int64  `json:"id"`
	Error string `json:"error,omitempty"`
}

// write inserts row id into the local database, then writes file w/<id>.txt.
// 503 when the database refuses (a replica is read-only).
func (a *App) write(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.URL.Query().Get("id"), 10, 64)
	res := WriteResult{Node: a.node, ID: id}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		res.Error = "id: " + err.Error()
		_ = json.NewEncoder(w).Encode(res)
		return
	}
	if err := a.insert(r.Context(), id); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		res.Error = err.Error()
		_ = json.NewEncoder(w).Encode(res)
		return
	}
	if err := a.writeFile(id); err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		res.Error = err.Error()
		_ = json.NewEncoder(w).Encode(res)
		return
	}
	_ = json.NewEncoder(w).Encode(res)
}

// CheckResult is /check's answer: whether write id is on this node (its row
// in the local database, its file in the synced directory).
type CheckResult struct {
	Node  string `json:"node"`
	ID    int64  `json:"id"`
	Row   bool   `json:"row"`
	File  bool   `json:"file"`
	Error string `json:"error,omitempty"`
}

// check answers hapairctl drill's lb.check-path: 200 when write id is on
// this node (row, and file when the app writes files), 404 when either is
// missing, 503 when the database cannot tell.
func (a *App) check(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.URL.Query().Get("id"), 10, 64)
	res := CheckResult{Node: a.node, ID: id}
	w.Header().Set("Content-Type", "application/json")
	code := http.StatusOK
	switch {
	case err != nil:
		code, res.Error = http.StatusBadRequest, "id: "+err.Error()
	default:
		res.Row, err = a.hasRow(r.Context(), id)
		res.File = a.dir == ""
		if !res.File {
			_, ferr := os.Stat(filepath.Join(a.dir, "w", fmt.Sprintf("%d.txt", id)))
			res.File = ferr == nil
		}
		switch {
		case err != nil:
			code, res.Error = http.StatusServiceUnavailable, err.Error()
		case !res.Row || !res.File:
			code = http.StatusNotFound
		}
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(res)
}

// hasRow reads row id from the local database on a pooled connection.
func (a *App) hasRow(ctx context.Context, id int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	case <-ctx.Done():
		return false, fmt.Errorf("no database connection free: %w", ctx.Err())
	}
	c, _, err := a.conn(ctx)
	if err != nil {
		return false, err
	}
	var n int
	err = c.QueryRow(ctx, `SELECT count(*) FROM lab_writes WHERE id = $1`, id).Scan(&n)
	a.release(c, err)
	return n > 0, err
}

// conn takes an idle connection or opens one; pooled says which.
func (a *App) conn(ctx context.Context) (c *pgx.Conn, pooled bool, err error) {
	select {
	case c := <-a.conns:
		return c, true, nil
	default:
		c, err := a.connect(ctx)
		return c, false, err
	}
}

// connect opens a connection and counts it.
func (a *App) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, a.dsn)
	if err == nil {
		a.open.Add(1)
	}
	return c, err
}

// close closes a connection and uncounts it.
func (a *App) close(c *pgx.Conn) {
	a.open.Add(-1)
	_ = c.Close(context.Background())
}

// release keeps a healthy connection for the next request.
func (a *App) release(c *pgx.Conn, err error) {
	if err != nil {
		a.close(c)
		return
	}
	select {
	case a.conns <- c:
	default:
		a.close(c)
	}
}

// keepWarm keeps the pool full of live connections, as application pools
// with a minimum of idle connections do (pgxpool MinConns, HikariCP
// minimumIdle). On the PASSIVE node they are connections to the local
// replica, which stay open across its promotion: the first writes on a new
// primary do not pay for connecting to it while it finishes its promotion
// (measured in the lab: 0.2-0.25 s per cold connection at that moment).
func (a *App) keepWarm(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			a.drain()
			return
		case <-t.C:
		}
		a.refresh(ctx)
	}
}

// refresh checks each idle connection once and opens what is missing. It
// takes a slot like a request does, so a request never finds the pool
// short because a connection is out being checked (it would open a cold
// one: 0.4 s measured on a new primary).
func (a *App) refresh(ctx context.Context) {
	checked := map[*pgx.Conn]bool{}
	for range cap(a.conns) {
		select {
		case a.slots <- struct{}{}:
		default:
			return // busy serving: the connections are in use, hence checked
		}
		ok := a.refreshOne(ctx, checked)
		<-a.slots
		if !ok {
			return // the database is down; try again next tick
		}
	}
}

// refreshOne opens a connection while fewer than the pool's size are open
// (after a restart of the database all of them died), else pings an idle
// one not yet checked in this round.
func (a *App) refreshOne(ctx context.Context, checked map[*pgx.Conn]bool) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if int(a.open.Load()) < cap(a.conns) {
		c, err := a.connect(cctx)
		if err != nil {
			return false
		}
		a.release(c, nil)
		return true
	}
	var c *pgx.Conn
	select {
	case c = <-a.conns:
	default:
		return true // all in use
	}
	if checked[c] {
		a.release(c, nil)
		return true
	}
	checked[c] = true
	err := c.Ping(cctx)
	a.release(c, err)
	return err == nil
}

// drain closes the idle connections at exit.
func (a *App) drain() {
	for {
		select {
		case c := <-a.conns:
			a.close(c)
		default:
			return
		}
	}
}

// insert writes the row; a pooled connection that died (the database was
// restarted by a switchover) is retried once on a fresh one, as any real
// application's pool would.
func (a *App) insert(ctx context.Context, id int64) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	t0 := time.Now()
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	case <-ctx.Done():
		return fmt.Errorf("no database connection free: %w", ctx.Err())
	}
	t1 := time.Now()
	c, pooled, err := a.conn(ctx)
	if err != nil {
		return err
	}
	t2 := time.Now()
	err = a.insertOn(ctx, c, id)
	a.release(c, err)
	if el := time.Since(t0); el > 100*time.Millisecond {
		// Logged for post-mortems of a switchover's longest waits.
		fmt.Fprintf(os.Stderr, "%s write %d: slow insert %v (slot %v, connection %v pooled=%v, statement %v, err %v)\n",
			time.Now().Format("15:04:05.000"), id, el.Round(time.Millisecond), t1.Sub(t0).Round(time.Millisecond),
			t2.Sub(t1).Round(time.Millisecond), pooled, time.Since(t2).Round(time.Millisecond), err)
	}
	if err == nil || !pooled {
		return err
	}
	// Logged for post-mortems: a retry costs a cold connection.
	fmt.Fprintf(os.Stderr, "%s write %d: pooled connection failed (%v), retrying on a new one\n",
		time.Now().Format("15:04:05.000"), id, err)
	if c, err = a.connect(ctx); err != nil {
		return err
	}
	err = a.insertOn(ctx, c, id)
	a.release(c, err)
	return err
}

func (a *App) insertOn(ctx context.Context, c *pgx.Conn, id int64) error {
	if !a.table.Load() {
		_, err := c.Exec(ctx, `CREATE TABLE IF NOT EXISTS lab_writes (
			id bigint PRIMARY KEY, node text NOT NULL, at timestamptz NOT NULL DEFAULT now())`)
		// A concurrent CREATE may lose the race on the catalog's unique
		// index; the INSERT below tells whether the table is there.
		if err == nil {
			a.table.Store(true)
		}
	}
	_, err := c.Exec(ctx, `INSERT INTO lab_writes (id, node) VALUES ($1, $2)`, id, a.node)
	return err
}

func (a *App) writeFile(id int64) error {
	if a.dir == "" {
		return nil
	}
	d := filepath.Join(a.dir, "w")
	// 0o777 less the umask, as programs do: a deployment whose file sync
	// runs as another user gives the application a umask that leaves the
	// directory group-writable (deploy/hosts' test unit: UMask=0002).
	if err := os.MkdirAll(d, 0o777); err != nil {
		return err
	}
	marker := ""
	if a.marker != "" {
		b, _ := os.ReadFile(a.marker)
		marker = strings.TrimSpace(string(b))
	}
	body := fmt.Sprintf("id=%d node=%s at=%s marker=%s\n", id, a.node, time.Now().UTC().Format(time.RFC3339Nano), marker)
	tmp := filepath.Join(d, fmt.Sprintf(".%d.tmp", id))
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(d, fmt.Sprintf("%d.txt", id)))
}
