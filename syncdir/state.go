package syncdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// epochStore keeps the highest fencing epoch this node has seen, on disk,
// so a restarted receiver still refuses an old ACTIVE.
type epochStore struct {
	// gate orders changes against epochs: every change to a root holds it
	// shared (holdFence), raising the highest epoch holds it exclusively,
	// so once a higher epoch is recorded no change of a lower one is still
	// being made, and none starts.
	gate    sync.RWMutex
	mu      sync.Mutex
	file    string
	highest int64
}

func openEpochStore(dir string) (*epochStore, error) {
	e := &epochStore{file: filepath.Join(dir, "epoch")}
	b, err := os.ReadFile(e.file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return e, nil
	case err != nil:
		return nil, fmt.Errorf("syncdir: read epoch: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("syncdir: %s holds %q, not an epoch", e.file, b)
	}
	e.highest = n
	return e, nil
}

func (e *epochStore) get() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.highest
}

// admit reports whether epoch may act (not below the highest), and records
// it durably when it is higher before anyone is answered.
func (e *epochStore) admit(epoch int64) (bool, error) {
	if h := e.get(); epoch <= h {
		return epoch == h, nil
	}
	e.gate.Lock()
	defer e.gate.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if epoch < e.highest {
		return false, nil
	}
	if epoch == e.highest {
		return true, nil
	}
	if err := writeFileSync(e.file, []byte(strconv.FormatInt(epoch, 10)+"\n")); err != nil {
		return false, fmt.Errorf("syncdir: record epoch: %w", err)
	}
	e.highest = epoch
	return true, nil
}

// writeFileSync replaces file atomically and durably.
func writeFileSync(file string, b []byte) error {
	tmp := file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// entry is what this node knows both sides agreed on for one path: a file
// received from the peer, or a local file the peer confirmed. A local file
// that does not match its entry was written here and never delivered.
type entry struct {
	Kind  byte // 'f' file, 'd' dir, 'l' symlink
	Size  int64
	Mtime int64
	Mode  uint32
	Ino   uint64
	// Ctime is the inode's change time (ns) as this node last saw it. No
	// writer can set it back (cp -p and touch -r restore mtime only), so
	// with Ino it tells the very file the receiver installed from any
	// later local change, whatever its size and mtime (finding 3). 0 for
	// directories, and in records written before it was kept.
	Ctime int64
	// Uid and Gid are the owner; OwnerKnown is false in records written
	// before the owner was kept, and same then ignores it. A chown alone
	// changes neither size, mtime nor mode, so without the owner in the
	// record a file chowned after it was sent kept its old owner on the
	// peer (CI of 2779663: a symlink lchowned just after it was created).
	Uid, Gid   uint32
	OwnerKnown bool
}

func entryOf(fi fs.FileInfo) entry {
	e := entry{Size: fi.Size(), Mtime: fi.ModTime().UnixNano(), Mode: unixMode(fi.Mode())}
	switch {
	case fi.Mode().IsDir():
		e.Kind, e.Size, e.Mtime = 'd', 0, 0
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Kind = 'l'
	default:
		e.Kind = 'f'
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Ino, e.Uid, e.Gid, e.OwnerKnown = st.Ino, st.Uid, st.Gid, true
		if e.Kind != 'd' {
			e.Ctime = st.Ctim.Nano()
		}
	}
	return e
}

// proves reports whether the recorded e shows that local is exactly what
// was delivered: the same inode, unchanged since (Ctime). A record from
// before Ctime was kept falls back to size and mtime.
func (e entry) proves(local entry) bool {
	if e.Kind != local.Kind || e.Size != local.Size || e.Mtime != local.Mtime {
		return false
	}
	return e.Ctime == 0 || e.Ino == local.Ino && e.Ctime == local.Ctime
}

// same reports whether the attributes the peer is sent match: content,
// mode and, where both know it, owner (inode ignored).
func (e entry) same(o entry) bool {
	if e.OwnerKnown && o.OwnerKnown && (e.Uid != o.Uid || e.Gid != o.Gid) {
		return false
	}
	return e.Kind == o.Kind && e.Size == o.Size && e.Mtime == o.Mtime && e.Mode == o.Mode
}

// sameContent ignores the mode: a chmod alone is not a lost write.
func (e entry) sameContent(o entry) bool {
	return e.Kind == o.Kind && e.Size == o.Size && e.Mtime == o.Mtime
}

// record is the per-root map of agreed paths. Every change is also put in
// a journal (journal.go), which the receiver makes durable before it
// answers (commit), so a crash never forgets a delivery (issue 16,
// finding 5); the whole map is rewritten every few seconds (flush), which
// starts a new journal and drops the old one.
type record struct {
	fmu   sync.Mutex // serialises flushes and commits; taken before mu
	mu    sync.Mutex
	file  string
	m     map[string]entry
	dirty bool
	j     journal
}

func openRecord(dir, root string) (*record, error) {
	r := &record{file: filepath.Join(dir, "record-"+root), m: map[string]entry{}}
	r.j.dir, r.j.prefix = dir, "journal-"+root+"."
	b, err := os.ReadFile(r.file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("syncdir: read record: %w", err)
	default:
		if m, err := decodeRecord(b); err == nil {
			r.m = m
		} // else: a corrupt record only costs extra quarantine; do not refuse to start
	}
	replayed, err := r.j.replay(r.m)
	if err != nil {
		return nil, err
	}
	r.dirty = replayed // the next flush folds the journals into the record
	return r, nil
}

// The record file is one line per path: kind size mtime mode inode ctime
// uid gid "path". Plain text, no reflection: it is rewritten every few
// seconds while busy. Older records lack uid gid, or ctime uid gid; the
// path is the first field that starts with a quote, so all three read.
func encodeRecord(m map[string]entry) []byte {
	b := make([]byte, 0, len(m)*64)
	for p, e := range m {
		b = appendRecordLine(b, p, e)
	}
	return b
}

func appendRecordLine(b []byte, p string, e entry) []byte {
	b = append(b, e.Kind, ' ')
	b = strconv.AppendInt(b, e.Size, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.Mtime, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.Mode), 8)
	b = append(b, ' ')
	b = strconv.AppendUint(b, e.Ino, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.Ctime, 10)
	if e.OwnerKnown {
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(e.Uid), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(e.Gid), 10)
	}
	b = append(b, ' ')
	b = strconv.AppendQuote(b, p)
	return append(b, '\n')
}

func decodeRecord(b []byte) (map[string]entry, error) {
	m := map[string]entry{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		q := strings.IndexByte(line, '"')
		if q < 1 || line[q-1] != ' ' {
			return nil, fmt.Errorf("bad record line %q", line)
		}
		f := strings.Split(line[:q-1], " ")
		if len(f[0]) != 1 || len(f) != 5 && len(f) != 6 && len(f) != 8 {
			return nil, fmt.Errorf("bad record line %q", line)
		}
		var e entry
		var err [7]error
		e.Kind = f[0][0]
		e.Size, err[0] = strconv.ParseInt(f[1], 10, 64)
		e.Mtime, err[1] = strconv.ParseInt(f[2], 10, 64)
		mode, err2 := strconv.ParseUint(f[3], 8, 32)
		e.Mode, err[2] = uint32(mode), err2
		e.Ino, err[3] = strconv.ParseUint(f[4], 10, 64)
		if len(f) >= 6 {
			e.Ctime, err[4] = strconv.ParseInt(f[5], 10, 64)
		}
		if len(f) == 8 {
			var u, g uint64
			u, err[5] = strconv.ParseUint(f[6], 10, 32)
			g, err[6] = strconv.ParseUint(f[7], 10, 32)
			e.Uid, e.Gid, e.OwnerKnown = uint32(u), uint32(g), true
		}
		p, perr := strconv.Unquote(line[q:])
		if err := errors.Join(append(err[:], perr)...); err != nil {
			return nil, fmt.Errorf("bad record line %q: %w", line, err)
		}
		m[p] = e
	}
	return m, nil
}

func (r *record) get(p string) (entry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[p]
	return e, ok
}

func (r *record) set(p string, e entry) {
	r.mu.Lock()
	if old, ok := r.m[p]; ok && old == e {
		// Already recorded (written, or pending for the next commit): a
		// reconcile that confirms an unchanged tree writes nothing and its
		// commit costs no fdatasync (the no-change re-run's figure).
		r.mu.Unlock()
		return
	}
	r.m[p] = e
	r.dirty = true
	r.j.logSet(p, e)
	r.mu.Unlock()
}

// removeTree forgets p and everything below it.
func (r *record) removeTree(p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.j.logRemove(p)
	removeTree(r.m, p)
	r.dirty = true
}

func removeTree(m map[string]entry, p string) {
	delete(m, p)
	pre := p + "/"
	for k := range m {
		if strings.HasPrefix(k, pre) {
			delete(m, k)
		}
	}
}

// renameTree moves the entries of from (and below) to to.
func (r *record) renameTree(from, to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.j.logRename(from, to)
	renameTree(r.m, from, to)
	r.dirty = true
}

func renameTree(m map[string]entry, from, to string) {
	pre := from + "/"
	moved := map[string]entry{}
	for k, e := range m {
		if k == from {
			moved[to] = e
			delete(m, k)
		} else if rest, ok := strings.CutPrefix(k, pre); ok {
			moved[to+"/"+rest] = e
			delete(m, k)
		}
	}
	for k := range m {
		if k == to || strings.HasPrefix(k, to+"/") {
			delete(m, k)
		}
	}
	for k, e := range moved {
		m[k] = e
	}
}

// flush rewrites the whole record and drops the journals it now holds.
// Changes made meanwhile go to a new journal: replaying a journal over a
// record that already holds it changes nothing, so a crash at any point
// loses nothing.
func (r *record) flush() error {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	r.mu.Lock()
	if !r.dirty {
		r.mu.Unlock()
		return nil
	}
	b := encodeRecord(r.m)
	r.dirty = false
	upTo := r.j.rotate() // the lines not written yet are in b
	r.mu.Unlock()
	if err := writeFileSync(r.file, b); err != nil {
		r.mu.Lock()
		r.dirty = true
		r.mu.Unlock()
		return fmt.Errorf("syncdir: write record: %w", err)
	}
	r.j.drop(upTo)
	return nil
}

// replace puts m in place of the whole record (the sender, after a
// reconcile); it is on disk with the next flush.
func (r *record) replace(m map[string]entry) {
	r.mu.Lock()
	r.m, r.dirty = m, true
	r.j.pending = nil // the old map's changes must not be replayed over m
	r.mu.Unlock()
}

// commit makes every change recorded so far durable (journal.go); a
// commit waiting for a flush finds its changes in the rewritten record.
func (r *record) commit() error { return r.commitThen(nil) }

// commitWith makes every change recorded so far durable by syncfs, a
// syncfs(2) of the file system the journal is on that the caller runs
// anyway (a big batch's): the lines are written first and the syncfs makes
// them durable with everything else, one journal commit instead of a
// syncfs beside an fdatasync. fmu is held until syncfs returns, so a
// commit whose lines this one took returns only once they are durable.
// A failed syncfs fails the commit; the lines, written, are covered by the
// journal's next fdatasync.
func (r *record) commitWith(syncfs func() error) error { return r.commitThen(syncfs) }

// commitThen writes the pending lines, then makes them durable: by the
// journal's own fdatasync when syncfs is nil, else by syncfs.
func (r *record) commitThen(syncfs func() error) error {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	r.mu.Lock()
	b := r.j.take()
	r.mu.Unlock()
	write := r.j.write
	if syncfs != nil {
		write = r.j.writeNoSync
	}
	if err := write(b); err != nil {
		r.mu.Lock()
		r.j.putBack(b)
		r.mu.Unlock()
		return fmt.Errorf("syncdir: write record journal: %w", err)
	}
	if syncfs != nil {
		return syncfs()
	}
	return nil
}

// unixMode converts Go's mode bits to the chmod(2) number sent on the wire.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// fileMode is the inverse of unixMode.
func fileMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}
