package syncdir

import (
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

type key struct {
	root int
	rel  string
}

// pend is a path that changed and is not yet confirmed by the peer.
type pend struct {
	since     time.Time // first unconfirmed change: the lag clock
	last      time.Time // last event: the debounce clock
	force     bool      // send even if the record says the peer has it
	writing   bool      // written and not yet closed: wait for the close
	closed    bool      // its writer closed it: no reason to wait
	noRename  bool
	early     bool      // stream it while it is still being written (grow.go)
	sized     time.Time // last look at its size for that
	attempts  int
	notBefore time.Time
}

type jobKind uint8

const (
	jobPut jobKind = iota
	jobMkdir
	jobSymlink
	jobDelete
	jobRename
	jobBatch // small puts of one root in one request
)

type noteVal struct {
	at time.Time
	st writeState
}

// holdOpen is how long a file still open for writing is held back when its
// writer goes quiet without closing it (logs, databases, hard links).
const holdOpen = time.Second

type job struct {
	kind   jobKind
	k      key
	to     string // rename target
	ent    entry  // local state when dispatched
	target string // symlink target
	p      *pend
	p2     *pend    // rename target's pend
	batch  []job    // jobBatch: the puts it carries
	small  bool     // a small put or a batch: counts against maxSmallInflight
	grow   *growing // a put streamed while the file is written
	early  bool     // planned to stream while written (plan makes grow)
	queued time.Time
}

type result struct {
	j     job
	ent   entry // state actually sent (put)
	err   error
	batch []result // jobBatch: one per put
	echo  bool     // err is the batch request's, already noted with another file

	start, end time.Time // the request's timeline, for the debug trace
}

// sender is one run of the sending side, from SetActive to SetPassive.
type sender struct {
	s     *Syncer
	epoch int64
	tree  *tree

	mu       sync.Mutex
	incoming map[key]noteVal
	rescan   bool
	fatalErr error
	wake     chan struct{}

	pending  map[key]*pend
	inflight map[key]*pend
	queue    []job
	small    int // small puts and batches in flight
	jobs     chan job
	results  chan result

	// streams are the files sent while still written, by key; the watcher
	// tells them about writes and the close. noEarly: paths whose early
	// stream failed, sent the ordinary way from then on.
	streams sync.Map
	nEarly  int
	noEarly map[key]bool

	needReconcile bool
	pauseUntil    time.Time
	backoff       time.Duration
	nextReconcile time.Time
	published     time.Time
}

// runSender runs a sender until ctx ends; setup failures (inotify limit)
// are retried with backoff and reported in Status.
func (s *Syncer) runSender(ctx context.Context, epoch int64) {
	s.lg.Info("sync sender starting", zap.Int64("epoch", epoch))
	defer s.lg.Info("sync sender stopped", zap.Int64("epoch", epoch))
	wait := s.cfg.RetryMin
	for {
		err := s.runSenderOnce(ctx, epoch)
		if ctx.Err() != nil {
			return
		}
		s.noteError("sender", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, s.cfg.RetryMax)
	}
}

func (s *Syncer) noteError(kind string, err error) {
	s.countError(kind)
	s.lg.Error("sync sender error", zap.String("kind", kind), zap.Error(err))
	s.publish(func(v *senderView) { v.lastError, v.lastErrorAt = err.Error(), time.Now().UTC() })
}

func (s *Syncer) runSenderOnce(ctx context.Context, epoch int64) error {
	w, err := s.newWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	sd := &sender{
		s: s, epoch: epoch, incoming: map[key]noteVal{}, wake: make(chan struct{}, 1),
		pending: map[key]*pend{}, inflight: map[key]*pend{}, noEarly: map[key]bool{},
		jobs: make(chan job), results: make(chan result, s.cfg.Concurrency),
		needReconcile: true,
	}
	sd.tree = &tree{s: s, w: w, note: sd.note, dirs: map[string]bool{}, roots: s.roots}
	for i := range s.roots {
		if err := sd.tree.add(i, ".", false); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		sd.drain()
	}()
	wg.Add(1)
	go func() { defer wg.Done(); sd.tree.run(ctx, sd.requestRescan, sd.fatal) }()
	for n := 0; n < s.cfg.Concurrency; n++ {
		wg.Add(1)
		go func() { defer wg.Done(); sd.worker(ctx) }()
	}
	return sd.loop(ctx)
}

// drain records what the peer confirmed just before the sender stopped, so
// a switchover does not leave delivered files looking undelivered.
func (sd *sender) drain() {
	for {
		select {
		case r := <-sd.results:
			for _, r := range flatten(r) {
				if r.err == nil {
					sd.confirmed(sd.s.roots[r.j.k.root], r)
				}
			}
		default:
			return
		}
	}
}

func (sd *sender) note(root int, rel string, st writeState) {
	k := key{root, rel}
	sd.mu.Lock()
	sd.incoming[k] = noteVal{at: time.Now(), st: st}
	sd.mu.Unlock()
	if g, ok := sd.streams.Load(k); ok {
		g.(*growing).signal(st == closed)
	}
	sd.poke()
}

func (sd *sender) poke() {
	select {
	case sd.wake <- struct{}{}:
	default:
	}
}

func (sd *sender) requestRescan() {
	sd.mu.Lock()
	sd.rescan = true
	sd.mu.Unlock()
	sd.poke()
}

func (sd *sender) fatal(err error) {
	sd.mu.Lock()
	sd.fatalErr = err
	sd.mu.Unlock()
	sd.poke()
}

// loop is the dispatcher: it owns pending, inflight and the queue.
func (sd *sender) loop(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		var out chan job
		var next job
		var take int
		if len(sd.queue) > 0 {
			next, take = sd.next()
			if !next.small || sd.small < maxSmallInflight {
				out = sd.jobs
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sd.wake:
		case <-timer.C:
		case <-tick.C:
		case r := <-sd.results:
			sd.done(r)
		case out <- next:
			sd.queue = sd.queue[take:]
			if next.small {
				sd.small++
			}
			continue
		}
		if err := sd.merge(); err != nil {
			return err
		}
		now := time.Now()
		if !now.Before(sd.nextReconcile) && !sd.needReconcile {
			sd.needReconcile = true
		}
		if now.Before(sd.pauseUntil) {
			resetTimer(timer, sd.pauseUntil.Sub(now))
			sd.publishView(now)
			continue
		}
		if _, ok := sd.s.fence.ActiveEpoch(); !ok {
			// Not (or no longer) allowed to push: wait for roled to decide.
			sd.pauseUntil = now.Add(50 * time.Millisecond)
			resetTimer(timer, 50*time.Millisecond)
			sd.publishView(now)
			continue
		}
		if sd.needReconcile {
			if len(sd.inflight) > 0 {
				sd.publishView(now) // let the requests in flight finish first
				continue
			}
			sd.reconcile(ctx)
			now = time.Now()
		}
		if wait := sd.dispatch(now); wait > 0 {
			resetTimer(timer, wait)
		}
		sd.publishView(now)
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// merge moves watcher notes into pending.
func (sd *sender) merge() error {
	sd.mu.Lock()
	in, rescan, ferr := sd.incoming, sd.rescan, sd.fatalErr
	if len(in) > 0 {
		sd.incoming = map[key]noteVal{}
	} else {
		in = nil
	}
	sd.rescan = false
	sd.mu.Unlock()
	if ferr != nil {
		return ferr
	}
	for k, n := range in {
		p := sd.touch(k, n.at, false)
		switch n.st {
		case writing:
			p.writing, p.closed = true, false
		case closed:
			p.writing, p.closed = false, true
			p.last = n.at.Add(-sd.s.cfg.Debounce) // closed: nothing to wait for
		}
	}
	if rescan {
		sd.localRescan()
	}
	return nil
}

func (sd *sender) touch(k key, t time.Time, force bool) *pend {
	p := sd.pending[k]
	if p == nil {
		p = &pend{since: t}
		if f := sd.inflight[k]; f != nil {
			p.since = f.since
		}
		sd.pending[k] = p
	}
	p.last = t
	p.force = p.force || force
	p.notBefore = time.Time{}
	return p
}

// localRescan compares each tree with the record after lost events.
func (sd *sender) localRescan() {
	now := time.Now()
	for k := range sd.inflight {
		sd.touch(k, now, false) // its record entry is not written yet: look again after
	}
	for i, rt := range sd.s.roots {
		if err := sd.tree.add(i, ".", false); err != nil {
			sd.fatal(err)
			return
		}
		local, err := scanTree(rt.root, rt.ex)
		if err != nil {
			sd.s.noteError("scan", err)
			continue
		}
		for p, sc := range local {
			if e, ok := rt.rec.get(p); !ok || !e.same(sc.ent) {
				sd.touch(key{i, p}, now, false)
			}
		}
		rt.rec.mu.Lock()
		var gone []string
		for p := range rt.rec.m {
			if _, ok := local[p]; !ok {
				gone = append(gone, p)
			}
		}
		rt.rec.mu.Unlock()
		for _, p := range gone {
			sd.touch(key{i, p}, now, false)
		}
	}
}

// dispatch turns ready pending paths into jobs; it returns how long to wait
// for the next path to become ready (0: nothing waiting).
func (sd *sender) dispatch(now time.Time) time.Duration {
	deb := sd.s.cfg.Debounce
	var ready []key
	var wait time.Duration
	for k, p := range sd.pending {
		if sd.inflight[k] != nil {
			continue
		}
		at := p.last.Add(deb)
		if p.writing {
			if !now.Before(p.notBefore) && sd.startEarly(k, p, now) {
				ready = append(ready, k)
				continue
			}
			at = p.last.Add(holdOpen)
		}
		if p.notBefore.After(at) {
			at = p.notBefore
		}
		if d := at.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		ready = append(ready, k)
	}
	if len(ready) == 0 {
		return wait
	}
	sort.Slice(ready, func(a, b int) bool {
		if ready[a].root != ready[b].root {
			return ready[a].root < ready[b].root
		}
		return lessPath(ready[a].rel, ready[b].rel)
	})
	if w := sd.plan(ready, now); w > 0 && (wait == 0 || w < wait) {
		wait = w
	}
	return wait
}

// startEarly reports whether k, still being written, is big enough to be
// streamed now (grow.go), and marks it so. A file is looked at only once
// it has been written for earlyLook, and then every earlyLook: the small
// files of a burst are closed long before, and cost no stat here.
func (sd *sender) startEarly(k key, p *pend, now time.Time) bool {
	if p.early {
		return true
	}
	if sd.nEarly >= maxEarly || sd.noEarly[k] || now.Sub(p.since) < earlyLook || now.Sub(p.sized) < earlyLook {
		return false
	}
	p.sized = now
	fi, err := sd.s.roots[k.root].root.Lstat(k.rel)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < earlyMin {
		return false
	}
	p.early = true
	return true
}

// lessPath orders parents before children.
func lessPath(a, b string) bool {
	da, db := strings.Count(a, "/"), strings.Count(b, "/")
	if da != db {
		return da < db
	}
	return a < b
}

// plan looks at each ready path (the file system calls) and queues what
// planJobs decides.
func (sd *sender) plan(ready []key, now time.Time) time.Duration {
	obs := make([]observed, 0, len(ready))
	subs := subRoots{}
	defer subs.close()
	for _, k := range ready {
		p := sd.pending[k]
		delete(sd.pending, k)
		o := observed{k: k, p: p}
		rt := sd.s.roots[k.root]
		if fi, err := subs.lstat(rt, k); err == nil {
			if sc, ok := scanOne(rt.root, k.rel, fi); ok {
				o.ent, o.ok, o.tgt = sc.ent, true, sc.m.L
			}
		}
		// The read lease only where the plan may ask.
		if needsWriterCheck(o, now) {
			o.noWriter = noWriter(rt.root, k.rel)
		}
		obs = append(obs, o)
	}
	rec := func(root int, rel string) (entry, bool) { return sd.s.roots[root].rec.get(rel) }
	pl := planJobs(obs, rec, now, maxEarly-sd.nEarly)
	var wait time.Duration
	for _, h := range pl.holds {
		h.p.early = false
		h.p.notBefore = h.until
		sd.pending[h.k] = h.p
		if d := h.until.Sub(now); wait == 0 || d < wait {
			wait = d
		}
	}
	for _, j := range pl.jobs {
		if j.kind == jobPut || j.kind == jobMkdir || j.kind == jobSymlink {
			j.p.early = false
		}
		if j.early {
			j.grow = newGrowing()
			sd.streams.Store(j.k, j.grow)
			sd.nEarly++
		}
		sd.enqueue(j)
	}
	return wait
}

func (sd *sender) enqueue(j job) {
	j.queued = time.Now()
	sd.inflight[j.k] = j.p
	if j.kind == jobRename {
		sd.inflight[key{j.k.root, j.to}] = j.p2
	}
	sd.queue = append(sd.queue, j)
}

// maxSmallInflight bounds the small-file requests in flight. A lone change
// goes at once; in a burst the files pile up behind these few requests and
// leave in big batches, so the receiver commits its journal a few times
// instead of once per file (every commit stalls all writers on its disk).
const maxSmallInflight = 4

// next returns the job for the next free worker and how many queued jobs
// it takes: consecutive small puts of one root travel as one batch.
func (sd *sender) next() (job, int) {
	j := sd.queue[0]
	small := func(c job) bool { return c.kind == jobPut && c.ent.Size <= batchFileMax }
	if !small(j) {
		return j, 1
	}
	n, size := 1, j.ent.Size
	for n < len(sd.queue) && n < batchMaxFiles {
		c := sd.queue[n]
		if !small(c) || c.k.root != j.k.root || size+c.ent.Size > batchMaxBytes {
			break
		}
		size += c.ent.Size
		n++
	}
	if n == 1 {
		j.small = true
		return j, 1
	}
	// Capped: later appends to the queue never write into the batch.
	return job{kind: jobBatch, k: key{root: j.k.root}, batch: sd.queue[:n:n], small: true, queued: j.queued}, n
}

func flatten(r result) []result {
	if r.j.kind == jobBatch {
		return r.batch
	}
	return []result{r}
}

// done handles a finished request. A batch is handled file by file, but a
// failure of the whole request is logged and backed off once.
func (sd *sender) done(r result) {
	sd.trace(r)
	if r.j.small {
		sd.small--
	}
	if r.j.kind != jobBatch {
		if sd.finish(r, true) {
			sd.pausePeer()
		}
		return
	}
	peerWide := false
	for _, sub := range r.batch {
		peerWide = sd.finish(sub, !sub.echo) || peerWide
	}
	if peerWide {
		sd.pausePeer()
	}
}

// finish records one path's outcome; it reports a failure that concerns
// the peer as a whole.
func (sd *sender) finish(r result, note bool) bool {
	j := r.j
	rt := sd.s.roots[j.k.root]
	delete(sd.inflight, j.k)
	if j.kind == jobRename {
		delete(sd.inflight, key{j.k.root, j.to})
	}
	if j.grow != nil {
		sd.streams.Delete(j.k)
		sd.nEarly--
		if r.err != nil {
			sd.noEarly[j.k] = true
		}
	}
	if r.err == nil {
		sd.confirmed(rt, r)
		sd.backoff = 0
		return false
	}
	return sd.failed(r, note)
}

// pausePeer stops hammering a peer that is down or fencing us, and asks
// for a compare of everything once it answers again.
func (sd *sender) pausePeer() {
	sd.backoff = min(max(2*sd.backoff, sd.s.cfg.RetryMin), sd.s.cfg.RetryMax)
	sd.pauseUntil = time.Now().Add(jitter(sd.backoff))
	sd.needReconcile = true
}

func (sd *sender) confirmed(rt *rootState, r result) {
	j := r.j
	switch j.kind {
	case jobPut, jobMkdir, jobSymlink:
		rt.rec.set(j.k.rel, r.ent)
	case jobDelete:
		rt.rec.removeTree(j.k.rel)
	case jobRename:
		rt.rec.renameTree(j.k.rel, j.to)
		rt.rec.set(j.to, j.ent)
	}
	sd.s.countSent(int64(max(r.ent.Size, 0)) * boolInt(j.kind == jobPut))
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// failed puts the path(s) back with a delay; it reports peer-wide failures,
// which pause all sending. note=false: the caller logs the error once.
func (sd *sender) failed(r result, note bool) bool {
	j := r.j
	now := time.Now()
	requeue := func(k key, p *pend, force, noRename bool) {
		if p == nil {
			p = &pend{since: now, last: now}
		}
		if q := sd.pending[k]; q != nil { // changed again meanwhile
			q.since = minTime(q.since, p.since)
			q.force = q.force || force
			q.noRename = q.noRename || noRename
			return
		}
		p.attempts++
		p.force = p.force || force
		p.noRename = p.noRename || noRename
		p.notBefore = now.Add(sd.delay(p.attempts))
		sd.pending[k] = p
	}
	next := classifyFailure(r.err)
	switch next {
	case nextLookAgain:
		sd.touch(j.k, now, false)
		if j.kind == jobRename {
			sd.touch(key{j.k.root, j.to}, now, true)
		}
		return false
	case nextRequeue:
		requeue(j.k, j.p, false, false)
		if j.kind == jobRename {
			requeue(key{j.k.root, j.to}, j.p2, false, false)
		}
		return false
	case nextSourceChanged:
		q := sd.touch(j.k, now, false) // the change has its own event; look again
		if j.grow != nil && j.grow.closed.Load() && !q.writing {
			q.closed = true // streamed while written, then closed: no need to wait
		}
		return false
	case nextAsCopy:
		requeue(j.k, j.p, true, true)
		requeue(key{j.k.root, j.to}, j.p2, true, true)
		return false
	case nextGiveUp:
		sd.s.noteError("refused", r.err) // the peer will never take it: do not loop
		return false
	}
	if note {
		sd.s.noteError(sendErrKind(r.err), r.err)
	}
	requeue(j.k, j.p, false, false)
	if j.kind == jobRename {
		requeue(key{j.k.root, j.to}, j.p2, false, false)
	}
	return next == nextPausePeer
}

// next is what the sender does with a path whose request failed.
type next uint8

const (
	nextRetry         next = iota // back off and send again
	nextPausePeer                 // back off, and pause the whole peer (down, or fencing us)
	nextLookAgain                 // changed under us (a temp file come and gone): look at once
	nextRequeue                   // not active any more, or stopping: keep it for later
	nextSourceChanged             // changed while sent: its own event sends it again
	nextAsCopy                    // the peer's rename source is not ours: send both paths whole
	nextGiveUp                    // refused for good (400): never loop on it
)

func (n next) String() string {
	switch n {
	case nextRetry:
		return "retry"
	case nextPausePeer:
		return "pause-peer"
	case nextLookAgain:
		return "look-again"
	case nextRequeue:
		return "requeue"
	case nextSourceChanged:
		return "source-changed"
	case nextAsCopy:
		return "as-copy"
	case nextGiveUp:
		return "give-up"
	}
	return "unknown"
}

// classifyFailure decides, without I/O, what a failed request's error
// calls for; it reads the peer's answer by its typed Reason and status.
func classifyFailure(err error) next {
	var he *httpError
	peer := errors.As(err, &he)
	switch {
	case !peer && errors.Is(err, fs.ErrNotExist):
		return nextLookAgain
	case errors.Is(err, errNotActive), errors.Is(err, context.Canceled):
		return nextRequeue
	case errors.Is(err, errSourceChanged), peer && he.reason == ReasonSourceChanged:
		return nextSourceChanged
	case peer && he.reason == ReasonRenameSource:
		return nextAsCopy
	case peer && he.status == 400:
		return nextGiveUp
	case !peer, he.status == 409:
		return nextPausePeer
	}
	return nextRetry
}

func sendErrKind(err error) string {
	var he *httpError
	if errors.As(err, &he) {
		if he.reason != "" {
			return "peer-" + string(he.reason)
		}
		if he.status == 507 {
			return "peer-disk-full"
		}
		return "peer-error"
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESTALE) {
		return "local-vanished"
	}
	return "network"
}

func (sd *sender) delay(attempts int) time.Duration {
	d := sd.s.cfg.RetryMin
	for i := 1; i < attempts && d < sd.s.cfg.RetryMax; i++ {
		d *= 2
	}
	return jitter(min(d, sd.s.cfg.RetryMax))
}

func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// publishView updates queue depth and lag; it walks every queued path, so
// it runs at most every 100 ms.
func (sd *sender) publishView(now time.Time) {
	depth := len(sd.pending) + len(sd.inflight)
	if now.Sub(sd.published) < 100*time.Millisecond && depth != 0 {
		sd.s.m.queueDepth.Set(float64(depth))
		sd.s.publish(func(v *senderView) { v.queueDepth = depth })
		return
	}
	sd.published = now
	var oldest time.Time
	for _, p := range sd.pending {
		if oldest.IsZero() || p.since.Before(oldest) {
			oldest = p.since
		}
	}
	for _, p := range sd.inflight {
		if p != nil && (oldest.IsZero() || p.since.Before(oldest)) {
			oldest = p.since
		}
	}
	var lag time.Duration
	if !oldest.IsZero() {
		lag = now.Sub(oldest)
	}
	sd.s.m.queueDepth.Set(float64(depth))
	sd.s.m.lag.Set(lag.Seconds())
	sd.s.publish(func(v *senderView) { v.queueDepth, v.lag = depth, lag })
}

// reconcile compares every root with the peer and queues what differs.
func (sd *sender) reconcile(ctx context.Context) {
	start := time.Now()
	for i, rt := range sd.s.roots {
		if err := sd.reconcileRoot(ctx, i, rt); err != nil {
			// Whatever the cause, try again later, never in a tight loop.
			if errors.Is(err, errNotActive) || ctx.Err() != nil {
				sd.pauseUntil = time.Now().Add(50 * time.Millisecond)
				return
			}
			sd.s.noteError("reconcile", err)
			sd.backoff = min(max(2*sd.backoff, sd.s.cfg.RetryMin), sd.s.cfg.RetryMax)
			sd.pauseUntil = time.Now().Add(jitter(sd.backoff))
			return
		}
	}
	sd.needReconcile = false
	sd.nextReconcile = time.Now().Add(sd.s.cfg.ReconcileInterval)
	sd.s.m.reconciles.Inc()
	sd.s.st.reconciles.Add(1)
	depth := len(sd.pending) + len(sd.inflight)
	sd.s.publish(func(v *senderView) { v.lastReconcile, v.queueDepth = time.Now().UTC(), depth })
	sd.s.lg.Debug("sync reconcile done", zap.Duration("took", time.Since(start)))
}

func (sd *sender) reconcileRoot(ctx context.Context, i int, rt *rootState) error {
	local, err := scanTree(rt.root, rt.ex)
	if err != nil {
		return err
	}
	req := manifestReq{Entries: make([]mEntry, 0, len(local))}
	for _, sc := range local {
		req.Entries = append(req.Entries, sc.m)
	}
	sort.Slice(req.Entries, func(a, b int) bool { return req.Entries[a].P < req.Entries[b].P })
	resp, err := sd.s.sendManifest(ctx, rt, req)
	if err != nil {
		return err
	}
	now := time.Now()
	need := make(map[string]bool, len(resp.Need))
	for _, p := range resp.Need {
		need[p] = true
		sd.touch(key{i, p}, now, true)
	}
	for _, p := range resp.Extra {
		if _, ok := local[p]; !ok && !strings.HasPrefix(p, "/") && path.Clean(p) == p {
			sd.touch(key{i, p}, now, true)
		}
	}
	// What the peer has exactly as we do is confirmed; nothing else is.
	agreed := make(map[string]entry, len(local))
	for p, sc := range local {
		if !need[p] {
			agreed[p] = sc.ent
		}
	}
	rt.rec.replace(agreed)
	return nil
}
