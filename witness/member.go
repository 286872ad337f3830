package witness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/hapair/hapair/internal/config"
)

// ErrStopped is returned by Run when the embedded etcd server stopped by
// itself (it was removed from the cluster, or hit a fatal error).
var ErrStopped = errors.New("witness: etcd server stopped")

// Member is one embedded etcd member: a data node's etcd (role member) or
// the witness's vote (role witness).
type Member struct {
	cfg Config
	lg  *zap.Logger
	m   *Metrics

	ready     chan struct{} // closed once the member has joined the quorum
	readyOnce sync.Once
	lastCheck atomic.Int64 // unix nanos of the last completed check, for the watchdog

	mu     sync.Mutex
	cancel context.CancelFunc // cancels a running Run; nil when not running
	done   chan struct{}      // closed when Run has returned

	warnedNoTransferee bool // log "no healthy data member" once per leadership
}

// New checks cfg and returns a member ready to Run. It starts nothing and
// touches no file.
func New(cfg Config, lg *zap.Logger, m *Metrics) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("witness: metrics are required")
	}
	return &Member{cfg: cfg, lg: lg, m: m, ready: make(chan struct{})}, nil
}

// Ready is closed once the member has joined the quorum (etcd's ReadyNotify):
// the moment to tell systemd READY=1.
func (w *Member) Ready() <-chan struct{} { return w.ready }

// Alive reports whether the member's check loop completed recently. Before
// the member is ready it reports true: joining may take a while and systemd's
// start timeout covers that phase.
func (w *Member) Alive() bool {
	last := w.lastCheck.Load()
	if last == 0 {
		return true
	}
	return time.Since(time.Unix(0, last)) < 3*w.cfg.CheckInterval+5*time.Second
}

// Run starts the member, joining the cluster first when the mode is join and
// the data directory is empty, and serves until ctx is done or etcd stops.
// It returns after etcd and the metrics listener are closed. On ctx
// cancellation it returns nil.
func (w *Member) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := w.begin(cancel); err != nil {
		return err
	}
	defer w.end()

	w.applyMemoryLimit()
	var ln net.Listener
	if w.cfg.MetricsListen != "" {
		var err error
		if ln, err = net.Listen("tcp", w.cfg.MetricsListen); err != nil {
			return fmt.Errorf("metrics-listen %s: %w", w.cfg.MetricsListen, err)
		}
		defer ln.Close()
	}
	ec, err := w.prepare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while joining
		}
		return err
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer w.stopEtcd(e)

	errc := make(chan error, 1)
	if ln != nil {
		stop := w.serveMetrics(ln, e.Server, errc)
		defer stop()
	}
	if err := w.waitReady(ctx, e, errc); err != nil {
		return err
	}
	rctx, stopReaper := context.WithCancel(ctx)
	reaperDone := make(chan struct{})
	go func() { defer close(reaperDone); w.runReaper(rctx, e.Server) }()
	defer func() { stopReaper(); <-reaperDone }() // before etcd stops
	return w.monitor(ctx, e, errc)
}

// Close stops a running Run and waits for it to return. It is safe to call
// more than once and when Run is not running.
func (w *Member) Close() error {
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	return nil
}

func (w *Member) begin(cancel context.CancelFunc) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		return errors.New("witness: member is already running")
	}
	w.cancel, w.done = cancel, make(chan struct{})
	return nil
}

func (w *Member) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.done)
	w.cancel = nil
	w.m.Ready.Set(0)
	w.m.IsLeader.Set(0)
}

// applyMemoryLimit sets the Go soft memory limit. It is process-wide, which
// is fine: the witness binary runs one member and nothing else.
func (w *Member) applyMemoryLimit() {
	_, _, _, limit := w.cfg.effective()
	if limit > 0 {
		debug.SetMemoryLimit(limit)
		w.lg.Info("go memory limit set", zap.Int64("bytes", limit))
	}
	if w.cfg.Role == RoleWitness && os.Getenv("GOGC") == "" {
		debug.SetGCPercent(witnessGCPercent)
	}
}

// prepare decides how etcd starts: a member with data restarts from it;
// otherwise bootstrap uses the static list and join adds itself first.
func (w *Member) prepare(ctx context.Context) (*embed.Config, error) {
	hasData, err := hasMemberData(w.cfg.DataDir)
	if err != nil {
		return nil, err
	}
	switch {
	case hasData:
		w.lg.Info("data dir holds a member, restarting it", zap.String("data_dir", w.cfg.DataDir))
		own := w.ownEntries()
		state := embed.ClusterStateFlagExisting
		if w.cfg.Mode == ModeBootstrap {
			own, state = strings.Join(w.cfg.InitialCluster, ","), embed.ClusterStateFlagNew
		}
		return w.embedConfig(own, state)
	case w.cfg.Mode == ModeJoin:
		initial, err := w.join(ctx)
		if err != nil {
			return nil, err
		}
		return w.embedConfig(initial, embed.ClusterStateFlagExisting)
	default:
		w.lg.Info("bootstrapping a new cluster", zap.Strings("initial_cluster", w.cfg.InitialCluster))
		return w.embedConfig(strings.Join(w.cfg.InitialCluster, ","), embed.ClusterStateFlagNew)
	}
}

// ownEntries is the initial-cluster text naming only this member, enough
// for etcd to restart from its WAL.
func (w *Member) ownEntries() string {
	parts := make([]string, 0, len(w.cfg.AdvertisePeerURLs))
	for _, u := range w.cfg.AdvertisePeerURLs {
		parts = append(parts, w.cfg.Name+"="+u)
	}
	return strings.Join(parts, ",")
}

// hasMemberData reports whether dir already holds an etcd member (a WAL).
func hasMemberData(dir string) (bool, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "member", "wal"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("data-dir: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".wal") {
			return true, nil
		}
	}
	return false, nil
}

func (w *Member) embedConfig(initialCluster, state string) (*embed.Config, error) {
	// embed.NewConfig, not a zero Config: it enables the JSON gateway that
	// Patroni 3.0.2's etcd3 client needs (LAB.md §0.1).
	ec := embed.NewConfig()
	ec.Name, ec.Dir = w.cfg.Name, w.cfg.DataDir
	var err error
	if ec.ListenPeerUrls, err = parseURLs(w.cfg.ListenPeerURLs); err != nil {
		return nil, err
	}
	if ec.AdvertisePeerUrls, err = parseURLs(w.cfg.AdvertisePeerURLs); err != nil {
		return nil, err
	}
	if ec.ListenClientUrls, err = parseURLs(w.cfg.ListenClientURLs); err != nil {
		return nil, err
	}
	if ec.AdvertiseClientUrls, err = parseURLs(w.cfg.AdvertiseClientURLs); err != nil {
		return nil, err
	}
	ec.InitialCluster, ec.ClusterState, ec.InitialClusterToken = initialCluster, state, w.cfg.InitialClusterToken
	ec.TickMs = uint(w.cfg.HeartbeatInterval / time.Millisecond)
	ec.ElectionMs = uint(w.cfg.ElectionTimeout / time.Millisecond)
	ec.ListenMetricsUrls = nil // served by us, together with hapair_witness_*

	quota, snapshots, catchUp, _ := w.cfg.effective()
	if quota > 0 {
		ec.QuotaBackendBytes = quota
	}
	if snapshots > 0 {
		ec.SnapshotCount = snapshots
	}
	if catchUp > 0 {
		ec.SnapshotCatchUpEntries = catchUp
	}
	if r := w.cfg.AutoCompactionRetention; r > 0 {
		ec.AutoCompactionMode, ec.AutoCompactionRetention = embed.CompactorModePeriodic, r.String()
	}
	ec.ClientTLSInfo = tlsInfo(w.cfg.ClientTLS)
	ec.PeerTLSInfo = tlsInfo(w.cfg.PeerTLS)

	lvl, err := zapcore.ParseLevel(w.cfg.EtcdLogLevel)
	if err != nil {
		return nil, config.Errorf("etcd-log-level", w.cfg.EtcdLogLevel, "%v", err)
	}
	ec.LogLevel = w.cfg.EtcdLogLevel
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(w.lg.Named("etcd").WithOptions(zap.IncreaseLevel(lvl)))
	return ec, nil
}

func parseURLs(raw []string) ([]url.URL, error) {
	out := make([]url.URL, 0, len(raw))
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("url %q: %w", r, err)
		}
		out = append(out, *u)
	}
	return out, nil
}

// tlsInfo maps our TLS section to etcd's. A CA turns on client-certificate
// authentication: only holders of a certificate signed by it get in.
func tlsInfo(t config.TLS) transport.TLSInfo {
	return transport.TLSInfo{
		CertFile:       t.CertFile,
		KeyFile:        t.KeyFile,
		TrustedCAFile:  t.CAFile,
		ClientCertAuth: t.CAFile != "",
		ServerName:     t.ServerName,
	}
}

// serveMetrics serves etcd's health endpoints and both metric registries on
// ln. The returned func shuts the server down gracefully.
func (w *Member) serveMetrics(ln net.Listener, srv *etcdserver.EtcdServer, errc chan<- error) (stop func()) {
	mux := http.NewServeMux()
	etcdhttp.HandleHealth(w.lg.Named("health"), mux, srv)
	mux.Handle("/metrics", w.m.metricsHandler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case errc <- fmt.Errorf("metrics listener: %w", err):
			default:
			}
		}
	}()
	w.lg.Info("serving health and metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close()
		}
		<-served
	}
}

// waitReady blocks until the member has joined the quorum. A bootstrapping
// member waits for enough peers to come up, for as long as it takes: that is
// what systemd's start timeout is for.
func (w *Member) waitReady(ctx context.Context, e *embed.Etcd, errc <-chan error) error {
	start := time.Now()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("etcd: %w", err)
	case err := <-errc:
		return err
	case <-e.Server.StopNotify():
		return ErrStopped
	case <-ctx.Done():
		return nil
	}
	w.lastCheck.Store(time.Now().UnixNano())
	w.m.Ready.Set(1)
	w.readyOnce.Do(func() { close(w.ready) })
	w.lg.Info("member joined the quorum",
		zap.String("name", w.cfg.Name),
		zap.String("id", e.Server.MemberID().String()),
		zap.String("role", string(w.cfg.Role)),
		zap.Duration("took", time.Since(start)))
	return nil
}

// stopEtcd closes the member. As leader, etcd first hands the leadership
// over, which can take up to an election timeout or two.
func (w *Member) stopEtcd(e *embed.Etcd) {
	start := time.Now()
	e.Close()
	w.lg.Info("member stopped", zap.Duration("took", time.Since(start)))
}
