// Package syncdir keeps application directories identical on the two data
// nodes, one way only: from the ACTIVE node to the PASSIVE one. The sender
// watches the trees with inotify and pushes each change over HTTP/2+TLS; the
// receiver applies it atomically inside the root. Both are fenced by the
// epoch of the ACTIVE key: a node refuses pushes while it is (becoming)
// ACTIVE and from any epoch lower than the highest it has recorded, and a
// sender stops the moment its node may no longer act as ACTIVE.
package syncdir

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Fence is what roled tells the sync about the node's role.
type Fence interface {
	// Holding is true while the node holds or is taking the active key:
	// the receiver then refuses all pushes.
	Holding() bool
	// ActiveEpoch returns the epoch, and true only if the node is ACTIVE
	// and its local deadline has not passed.
	ActiveEpoch() (int64, bool)
}

// rootState is one synced tree at run time.
type rootState struct {
	cfg       Root
	syncfsMin int // batches of this many files use syncfs (0: never)
	name      string
	abs       string
	ex        excluder
	rec       *record
	made      *madeDirs // directories made for a change not landed yet
	peerURL   string
	root      *os.Root // opened by Run

	fsFD *os.File // the root directory, for syncfs
	// journalOnFS: the record's journal is on the root's file system, so
	// a syncfs of the root makes it durable too (batch commits fold the
	// journal's fdatasync into their syncfs).
	journalOnFS bool
	dmu         sync.Mutex          // guards dirSyncs
	dirSyncs    map[string]*dirSync // group commits: per directory, and "fs"

	inQuarantine atomic.Int64 // files in the quarantine folder
}

// Syncer is the sender and the receiver of one node.
type Syncer struct {
	cfg        Config
	lg         *zap.Logger
	m          *Metrics
	fence      Fence
	node       string
	token      string
	roots      []*rootState
	rootByName map[string]*rootState
	epochs     *epochStore
	client     *http.Client
	bulk       *http.Client // HTTP/1.1, for big files (grow.go)
	serverTLS  *tls.Config
	st         stats

	qmu         sync.Mutex
	quarantined []QuarantinedFile

	// ln may be set before Run (tests) to serve on an existing listener.
	ln net.Listener
	// newWatcher builds the inotify watcher (replaced in tests).
	newWatcher func() (watcher, error)
	// afterBatchFile, when set (tests), runs after each file of a batch
	// body is read.
	afterBatchFile atomic.Pointer[func()]
	// afterMadeDir, when set (tests), runs once a directory a change needs
	// is made and listed as half-made, before that change.
	afterMadeDir atomic.Pointer[func(rel string)]

	mu      sync.Mutex
	runCtx  context.Context
	wg      sync.WaitGroup
	want    int64 // epoch to send with; 0 while PASSIVE
	running *senderRun

	// vmu guards view; separate from mu, which SetPassive holds while it
	// waits for the sender, and the sender publishes until it stops.
	vmu  sync.Mutex
	view senderView
}

type senderRun struct {
	epoch  int64
	cancel context.CancelFunc
	done   chan struct{}
}

// senderView is what the sender publishes for Status.
type senderView struct {
	queueDepth    int
	lag           time.Duration
	lastReconcile time.Time
	lastError     string
	lastErrorAt   time.Time
}

// New checks cfg and prepares the state directory; it starts nothing.
func New(cfg Config, lg *zap.Logger, m *Metrics, f Fence) (*Syncer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if f == nil {
		return nil, errors.New("syncdir: a Fence is required")
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	s := &Syncer{cfg: cfg, lg: lg, m: m, fence: f, node: cfg.Node, rootByName: map[string]*rootState{}, newWatcher: newInotify}
	s.st.errors, s.st.rejected = map[string]uint64{}, map[string]uint64{}
	if s.node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("syncdir: node name: %w", err)
		}
		s.node = h
	}
	if cfg.TokenFile != "" {
		t, err := readToken(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("syncdir: %w", err)
		}
		s.token = t
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("syncdir: state dir: %w", err)
	}
	var err error
	if s.epochs, err = openEpochStore(cfg.StateDir); err != nil {
		return nil, err
	}
	m.highestEpoch.Set(float64(s.epochs.get()))
	if err := s.setupTLS(); err != nil {
		return nil, err
	}
	for _, r := range cfg.Roots {
		if err := s.addRoot(r); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Syncer) addRoot(r Root) error {
	rec, err := openRecord(s.cfg.StateDir, r.name())
	if err != nil {
		return err
	}
	peer := r.Peer
	if peer == "" {
		peer = s.cfg.Peer
	}
	scheme := "https://"
	if s.cfg.Insecure && s.cfg.TLS.CertFile == "" {
		scheme = "http://"
	}
	rt := &rootState{cfg: r, name: r.name(), abs: r.Path, ex: newExcluder(r.excludes()), rec: rec, peerURL: scheme + peer, dirSyncs: map[string]*dirSync{},
		syncfsMin: s.cfg.SyncfsMinFiles, made: newMadeDirs(s.cfg.StateDir, r.name())}
	s.roots = append(s.roots, rt)
	s.rootByName[rt.name] = rt
	return nil
}

func (s *Syncer) setupTLS() error {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
	tr := &http.Transport{
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: handshakeTimeout,
		DialContext:         dialer.DialContext,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:               10 * time.Second,
			PingTimeout:                   5 * time.Second,
			MaxReceiveBufferPerConnection: 8 << 20,
			MaxReceiveBufferPerStream:     1 << 20,
		},
	}
	tr.Protocols = new(http.Protocols)
	bulk := newBulkTransport(dialer)
	if s.cfg.TLS.CertFile == "" {
		// Only reachable with insecure: true (Validate).
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP2(true)
		cc, err := s.cfg.TLS.ClientConfig()
		if err != nil {
			return fmt.Errorf("syncdir: %w", err)
		}
		if s.cfg.Insecure && s.cfg.TLS.CAFile == "" {
			cc.InsecureSkipVerify = true
		}
		tr.TLSClientConfig = cc
		tr.DialTLSContext = dialTLS(dialer, cc, "h2")
		bulk.TLSClientConfig = cc
		bulk.DialTLSContext = dialTLS(dialer, cc, "http/1.1")
		sc, err := s.cfg.TLS.ServerConfig()
		if err != nil {
			return fmt.Errorf("syncdir: %w", err)
		}
		s.serverTLS = sc
	}
	s.client = &http.Client{Transport: tr}
	s.bulk = &http.Client{Transport: bulk}
	return nil
}

// newBulkTransport is the HTTP/1.1 transport of big files (bulkMin and
// up, streamed: grow.go). Each has a connection of its own: it spends no
// HTTP/2 flow control windows and its bytes take fewer copies on both sides
// (from the sender's buffer to TLS, and from TLS to the receiver's buffer,
// without HTTP/2 framing and stream buffers in between), and the small
// files keep the shared HTTP/2 connection to themselves meanwhile.
func newBulkTransport(d *net.Dialer) *http.Transport {
	t := &http.Transport{
		// Each transfer holds 4 MiB of buffers on either side (pipeCopy):
		// the big files of an initial sync queue for a connection.
		MaxConnsPerHost:     2 * maxEarly,
		MaxIdleConnsPerHost: 2 * maxEarly,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: handshakeTimeout,
		DialContext:         d.DialContext,
		WriteBufferSize:     64 << 10,
	}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP1(true)
	return t
}

// Run serves the receiver, runs the sender while the node is ACTIVE, and
// flushes the records; it returns when ctx is done and all is stopped.
func (s *Syncer) Run(ctx context.Context) error {
	if !s.cfg.Enabled() {
		s.lg.Info("sync disabled: no roots configured")
		<-ctx.Done()
		return nil
	}
	if err := s.openRoots(); err != nil {
		return err
	}
	defer s.closeRoots()
	s.sweepTemps()
	s.countQuarantine()
	ln := s.ln
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Listen); err != nil {
			return fmt.Errorf("syncdir: listen: %w", err)
		}
	}
	srv := s.newServer()
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.serve(srv, ln) }()
	s.lg.Info("sync receiver listening", zap.String("addr", ln.Addr().String()), zap.Bool("tls", s.serverTLS != nil))

	s.mu.Lock()
	s.runCtx = ctx
	if s.want != 0 {
		s.startSenderLocked()
	}
	s.mu.Unlock()

	err := s.loop(ctx, serveErr)

	s.mu.Lock()
	s.runCtx = nil
	s.mu.Unlock()
	s.SetPassive()
	s.wg.Wait()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		srv.Close()
	}
	s.flushRecords()
	s.client.CloseIdleConnections()
	s.bulk.CloseIdleConnections()
	return err
}

func (s *Syncer) loop(ctx context.Context, serveErr <-chan error) error {
	t := time.NewTicker(recordFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-serveErr:
			return fmt.Errorf("syncdir: receiver: %w", err)
		case <-t.C:
			s.flushRecords()
			s.countQuarantine()
		}
	}
}

// recordFlushInterval bounds how much of the record a crash can lose (which
// only means more quarantine after the restart).
const recordFlushInterval = 3 * time.Second

func (s *Syncer) flushRecords() {
	for _, rt := range s.roots {
		if err := rt.rec.flush(); err != nil {
			s.countError("state")
			s.lg.Error("sync record not saved", zap.String("root", rt.name), zap.Error(err))
		}
	}
}

// sweepTemps removes the temp files an earlier run left behind (killed
// while a file arrived; an unnamed file leaves nothing), then the
// directories it made for a change that never landed (halfmade.go),
// before the receiver serves: no request of this run has one yet.
func (s *Syncer) sweepTemps() {
	for _, rt := range s.roots {
		tmpDirs := s.sweepTempFiles(rt)
		n, err := s.sweepHalfMade(rt)
		n += tmpDirs
		if err != nil {
			s.countError("state")
			s.lg.Error("sync half-made directories of an earlier run not all removed", zap.String("root", rt.name), zap.Int("removed", n), zap.Error(err))
		}
		if n > 0 {
			s.m.staleDirs.Add(float64(n))
			s.lg.Info("sync removed half-made directories of an earlier run", zap.String("root", rt.name), zap.Int("dirs", n))
		}
	}
}

// sweepTempFiles removes the temp files, and the temp directories
// makeDirAt had not renamed into place yet (empty: nothing is made in
// them); it returns how many directories went.
func (s *Syncer) sweepTempFiles(rt *rootState) (dirs int) {
	n, bytes := 0, int64(0)
	err := fs.WalkDir(rt.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case p == quarantineDir:
			return fs.SkipDir
		case !strings.HasPrefix(d.Name(), tempPrefix):
			return nil
		case d.IsDir():
			if rt.root.Remove(p) != nil {
				return nil // not empty after all: not one of ours to remove
			}
			dirs++
			return fs.SkipDir
		}
		if fi, err := d.Info(); err == nil {
			bytes += fi.Size()
		}
		if err := rt.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		n++
		return nil
	})
	if err != nil {
		s.countError("state")
		s.lg.Error("sync temp files of an earlier run not all removed", zap.String("root", rt.name), zap.Int("removed", n), zap.Error(err))
	}
	if n > 0 {
		s.m.staleTemps.Add(float64(n))
		s.lg.Info("sync removed temp files of an earlier run", zap.String("root", rt.name), zap.Int("files", n), zap.Int64("bytes", bytes))
	}
	return dirs
}

// countQuarantine recounts the files waiting in each root's quarantine, so
// the gauge falls back to zero once an operator has dealt with them.
func (s *Syncer) countQuarantine() {
	for _, rt := range s.roots {
		n := 0
		err := fs.WalkDir(rt.root.FS(), quarantineDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				n++
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.lg.Warn("sync quarantine not counted", zap.String("root", rt.name), zap.Error(err))
			continue
		}
		rt.inQuarantine.Store(int64(n))
		s.m.inQuarantine.WithLabelValues(rt.name).Set(float64(n))
	}
}

func (s *Syncer) openRoots() error {
	for _, rt := range s.roots {
		if err := os.MkdirAll(rt.abs, 0o755); err != nil {
			return fmt.Errorf("syncdir: root %s: %w", rt.name, err)
		}
		r, err := os.OpenRoot(rt.abs)
		if err != nil {
			s.closeRoots()
			return fmt.Errorf("syncdir: root %s: %w", rt.name, err)
		}
		rt.root = r
		if rt.fsFD, err = r.Open("."); err != nil {
			s.closeRoots()
			return fmt.Errorf("syncdir: root %s: %w", rt.name, err)
		}
		rt.journalOnFS = sameFS(rt.fsFD, s.cfg.StateDir)
	}
	return nil
}

func (s *Syncer) closeRoots() {
	for _, rt := range s.roots {
		rt.made.close()
		if rt.fsFD != nil {
			rt.fsFD.Close()
		}
		if rt.root != nil {
			rt.root.Close()
		}
	}
}

func (s *Syncer) newServer() *http.Server {
	var tc *tls.Config
	if s.serverTLS != nil {
		// "h2" here makes Serve set up HTTP/2 on the TLS listener.
		tc = s.serverTLS.Clone()
		tc.NextProtos = []string{"h2", "http/1.1"}
	}
	srv := &http.Server{
		Handler:           s,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		TLSConfig:         tc,
		ErrorLog:          log.New(&serverLog{s: s}, "", 0),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          256,
			MaxReceiveBufferPerConnection: 16 << 20,
			MaxReceiveBufferPerStream:     4 << 20,
			MaxReadFrameSize:              1 << 20,
		},
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	if s.serverTLS != nil {
		srv.Protocols.SetHTTP2(true)
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	return srv
}

func (s *Syncer) serve(srv *http.Server, ln net.Listener) error {
	var err error
	if s.serverTLS != nil {
		// ServeTLS, but with reads buffered under the TLS layer (see
		// readBufConn).
		err = srv.Serve(tls.NewListener(readBufListener{ln}, srv.TLSConfig))
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// serverLog turns net/http's own complaints (bad TLS handshakes, broken
// connections) into log lines and rejection counts.
type serverLog struct{ s *Syncer }

func (l *serverLog) Write(b []byte) (int, error) {
	msg := strings.TrimSpace(string(b))
	if strings.Contains(msg, "TLS handshake error") {
		l.s.countRejected(ReasonTLS)
	}
	l.s.lg.Warn("sync receiver", zap.String("msg", msg))
	return len(b), nil
}

// SetActive starts the sender with epoch (after roled serves 200) and
// records epoch as the highest seen.
func (s *Syncer) SetActive(epoch int64) {
	if ok, err := s.epochs.admit(epoch); err != nil {
		s.countError("state")
		s.lg.Error("sync epoch not recorded", zap.Int64("epoch", epoch), zap.Error(err))
	} else if !ok {
		// The peer will refuse every push; say why up front.
		s.lg.Error("sync: active with an epoch below the highest recorded",
			zap.Int64("epoch", epoch), zap.Int64("highest", s.epochs.get()))
	}
	s.m.highestEpoch.Set(float64(s.epochs.get()))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.want == epoch && s.running != nil {
		return
	}
	s.stopSenderLocked()
	s.want = epoch
	if s.runCtx != nil {
		s.startSenderLocked()
	}
}

// SetPassive stops the sender and returns once it has stopped.
func (s *Syncer) SetPassive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want = 0
	s.stopSenderLocked()
}

func (s *Syncer) stopSenderLocked() {
	if s.running == nil {
		return
	}
	s.running.cancel()
	<-s.running.done
	s.running = nil
	s.m.sending.Set(0)
}

func (s *Syncer) startSenderLocked() {
	if len(s.roots) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(s.runCtx)
	r := &senderRun{epoch: s.want, cancel: cancel, done: make(chan struct{})}
	s.running = r
	s.m.sending.Set(1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(r.done)
		s.runSender(ctx, r.epoch)
	}()
}

// Status is the sync part of roled's /role answer.
type Status struct {
	Node             string            `json:"node"`
	Sending          bool              `json:"sending"`
	Epoch            int64             `json:"epoch"`
	HighestEpoch     int64             `json:"highest_epoch"`
	QueueDepth       int               `json:"queue_depth"`
	LagSeconds       float64           `json:"lag_seconds"`
	LastReconcile    *time.Time        `json:"last_reconcile,omitempty"`
	LastError        string            `json:"last_error,omitempty"`
	LastErrorAt      *time.Time        `json:"last_error_at,omitempty"`
	FilesSent        uint64            `json:"files_sent"`
	BytesSent        uint64            `json:"bytes_sent"`
	FilesReceived    uint64            `json:"files_received"`
	BytesReceived    uint64            `json:"bytes_received"`
	Errors           map[string]uint64 `json:"errors"`
	Rejected         map[string]uint64 `json:"rejected"`
	QuarantinedTotal uint64            `json:"quarantined_total"`
	QuarantineFiles  map[string]int64  `json:"quarantine_files"` // by root: files present now
	Quarantined      []QuarantinedFile `json:"quarantined"`
	Roots            []string          `json:"roots"`
}

// Status reports the sync state from memory.
func (s *Syncer) Status() Status {
	s.mu.Lock()
	st := Status{Node: s.node, Sending: s.running != nil, Epoch: s.want}
	s.mu.Unlock()
	s.vmu.Lock()
	st.QueueDepth, st.LagSeconds, st.LastError = s.view.queueDepth, s.view.lag.Seconds(), s.view.lastError
	if !s.view.lastReconcile.IsZero() {
		t := s.view.lastReconcile
		st.LastReconcile = &t
	}
	if !s.view.lastErrorAt.IsZero() {
		t := s.view.lastErrorAt
		st.LastErrorAt = &t
	}
	s.vmu.Unlock()
	st.HighestEpoch = s.epochs.get()
	st.FilesSent, st.BytesSent = s.st.filesSent.Load(), s.st.bytesSent.Load()
	st.FilesReceived, st.BytesReceived = s.st.filesReceived.Load(), s.st.bytesReceived.Load()
	st.Errors = copyCounts(&s.st.mu, s.st.errors)
	st.Rejected = copyCounts(&s.st.mu, s.st.rejected)
	st.QuarantinedTotal = s.st.quarantined.Load()
	s.qmu.Lock()
	st.Quarantined = append([]QuarantinedFile{}, s.quarantined...)
	s.qmu.Unlock()
	st.QuarantineFiles = make(map[string]int64, len(s.roots))
	for _, rt := range s.roots {
		st.Roots = append(st.Roots, filepath.Clean(rt.abs))
		st.QuarantineFiles[rt.name] = rt.inQuarantine.Load()
	}
	return st
}

func (s *Syncer) publish(f func(v *senderView)) {
	s.vmu.Lock()
	f(&s.view)
	s.vmu.Unlock()
}
