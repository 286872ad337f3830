package syncdir

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Half-made directories (issue 16, finding 4). The installer makes the
// directories a change needs (parentOf) right before that change; a crash
// in between, or the change refused after them (the fence moved), leaves
// them empty: directories the sender never had. The receiver can only
// remove what it can prove it made and nothing used since, so it keeps a
// list per root (madeDirs, the file made-dirs-<root> in the state
// directory):
//
//	+ <inode> <ctime ns> "path"   made by the receiver, nothing in it yet
//	- "path"                      settled: a change was installed in or below it
//
// A directory is made under a temp name, listed by its inode, renamed
// into place and listed again with its ctime (makeDirAt), each line
// written (write(2), no fsync) before the next step, so whenever a
// receiver is killed, the directory is either a temp one (removed at start
// by its name, as temp files are) or listed; the list is emptied
// (truncated) whenever nothing is outstanding. At start, before serving,
// a listed directory is removed only if it is still the very inode that
// was made, its ctime unchanged (nothing was added, removed, renamed or
// chmod'ed in it since: every such change moves the ctime) and it holds
// nothing but other such directories; anything else is kept. What the
// list cannot see errs on the side of keeping: a power loss that drops a
// line leaves a directory behind, never removes one.

// madeDir is a directory as the receiver made it.
type madeDir struct {
	Ino uint64
	// Ctime (ns) is 0 while unknown: between the mkdir and the rename to
	// its name, or in a parent while a child is made. The inode is the
	// proof then.
	Ctime int64
}

// madeDirs is the list of one root; see the top of this file.
type madeDirs struct {
	mu   sync.Mutex
	file string
	f    *os.File // opened on the first write; O_APPEND
	size int64    // bytes in the file
	open map[string]madeDir
	n    atomic.Int64 // len(open), for the fast path of settle
}

// madeDirsCompactAt is the size from which the list is rewritten with only
// the directories still outstanding: it is truncated whenever none is, so
// this only matters while one is left over for a long time.
const madeDirsCompactAt = 1 << 20

func newMadeDirs(dir, root string) *madeDirs {
	return &madeDirs{file: path.Join(dir, "made-dirs-"+root), open: map[string]madeDir{}}
}

// made lists rel as made by the receiver just now, and refreshes the ctime
// of its parent when that is listed too (making rel changed the parent's
// ctime).
func (m *madeDirs) made(rel string, d madeDir, parent madeDir, parentSeen bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b []byte
	if p := path.Dir(rel); parentSeen && p != "." {
		if _, ok := m.open[p]; ok {
			m.open[p] = parent
			b = appendMadeLine(b, p, parent)
		}
	}
	m.open[rel] = d
	m.n.Store(int64(len(m.open)))
	return m.write(appendMadeLine(b, rel, d))
}

// loosenParent forgets the ctime of rel's parent when that is listed, and
// keeps its inode only: making rel is about to change it.
func (m *madeDirs) loosenParent(rel string) error {
	if m.n.Load() == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := path.Dir(rel)
	d, ok := m.open[p]
	if !ok || d.Ctime == 0 {
		return nil
	}
	d.Ctime = 0
	m.open[p] = d
	return m.write(appendMadeLine(nil, p, d))
}

// expect lists rel by the inode of the directory about to be renamed to
// it, unless another request listed rel first (it made the directory
// there, and this rename will fail).
func (m *madeDirs) expect(rel string, ino uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.open[rel]; ok {
		return nil
	}
	d := madeDir{Ino: ino}
	m.open[rel] = d
	m.n.Store(int64(len(m.open)))
	return m.write(appendMadeLine(nil, rel, d))
}

// forget takes rel off the list if it is listed with ino: that directory
// was not renamed to rel after all.
func (m *madeDirs) forget(rel string, ino uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.open[rel]; !ok || d.Ino != ino {
		return nil
	}
	delete(m.open, rel)
	m.n.Store(int64(len(m.open)))
	if len(m.open) == 0 {
		return m.truncate()
	}
	return m.write(appendSettledLine(nil, rel))
}

// parentListed reports whether the parent of rel is outstanding (made
// wants its new ctime then).
func (m *madeDirs) parentListed(rel string) bool {
	if m.n.Load() == 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.open[path.Dir(rel)]
	return ok
}

// settle marks rel and every directory above it as used: a change was
// installed there. It costs nothing while no directory is outstanding.
func (m *madeDirs) settle(rel string) error {
	if m.n.Load() == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var b []byte
	for p := rel; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if _, ok := m.open[p]; ok {
			delete(m.open, p)
			b = appendSettledLine(b, p)
		}
	}
	if b == nil {
		return nil
	}
	m.n.Store(int64(len(m.open)))
	if len(m.open) == 0 {
		return m.truncate()
	}
	return m.write(b)
}

// write appends b to the list (under mu), compacting it once it is big.
func (m *madeDirs) write(b []byte) error {
	if m.f == nil {
		f, err := os.OpenFile(m.file, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("syncdir: made-dirs list: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("syncdir: made-dirs list: %w", err)
		}
		m.f, m.size = f, fi.Size()
	}
	if m.size+int64(len(b)) > madeDirsCompactAt {
		return m.compact()
	}
	n, err := m.f.Write(b)
	m.size += int64(n)
	if err != nil {
		return fmt.Errorf("syncdir: made-dirs list: %w", err)
	}
	return nil
}

// truncate empties the list: nothing is outstanding (under mu).
func (m *madeDirs) truncate() error {
	if m.f == nil || m.size == 0 {
		return nil
	}
	if err := m.f.Truncate(0); err != nil {
		return fmt.Errorf("syncdir: made-dirs list: %w", err)
	}
	m.size = 0
	return nil
}

// compact rewrites the list with the outstanding directories only (under
// mu): a new file renamed into place, so a crash leaves the old or the new.
func (m *madeDirs) compact() error {
	var b []byte
	for _, p := range sortedPaths(m.open) {
		b = appendMadeLine(b, p, m.open[p])
	}
	if err := writeFileSync(m.file, b); err != nil {
		return fmt.Errorf("syncdir: made-dirs list: %w", err)
	}
	m.f.Close()
	m.f = nil
	f, err := os.OpenFile(m.file, os.O_WRONLY|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("syncdir: made-dirs list: %w", err)
	}
	m.f, m.size = f, int64(len(b))
	return nil
}

// load reads the list a previous run left: the directories outstanding
// when it stopped.
func (m *madeDirs) load() (map[string]madeDir, error) {
	b, err := os.ReadFile(m.file)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]madeDir{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("syncdir: made-dirs list: %w", err)
	}
	return parseMadeDirs(b), nil
}

// reset empties the list and forgets every directory (the sweep at start
// has dealt with them).
func (m *madeDirs) reset() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.open)
	m.n.Store(0)
	var err error
	if m.f != nil {
		err = m.f.Truncate(0)
		m.size = 0
	} else if err = os.Truncate(m.file, 0); errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("syncdir: made-dirs list: %w", err)
	}
	return nil
}

func (m *madeDirs) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.f != nil {
		m.f.Close()
		m.f = nil
	}
}

func appendMadeLine(b []byte, p string, d madeDir) []byte {
	b = strconv.AppendUint(append(b, "+ "...), d.Ino, 10)
	b = strconv.AppendInt(append(b, ' '), d.Ctime, 10)
	return append(strconv.AppendQuote(append(b, ' '), p), '\n')
}

func appendSettledLine(b []byte, p string) []byte {
	return append(strconv.AppendQuote(append(b, "- "...), p), '\n')
}

// parseMadeDirs replays the lines of a list, the last line of a path
// winning, up to the first line that does not parse (a torn tail: the
// receiver was killed in the middle of writing it).
func parseMadeDirs(b []byte) map[string]madeDir {
	out := map[string]madeDir{}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		line := string(b[:i])
		b = b[i+1:]
		op, rest, ok := strings.Cut(line, " ")
		if !ok {
			break
		}
		switch op {
		case "+":
			f := strings.SplitN(rest, " ", 3)
			if len(f) != 3 {
				return out
			}
			ino, err1 := strconv.ParseUint(f[0], 10, 64)
			ctime, err2 := strconv.ParseInt(f[1], 10, 64)
			p, err3 := strconv.Unquote(f[2])
			if err1 != nil || err2 != nil || err3 != nil || checkMadePath(p) != nil {
				return out
			}
			out[p] = madeDir{Ino: ino, Ctime: ctime}
		case "-":
			p, err := strconv.Unquote(rest)
			if err != nil {
				return out
			}
			delete(out, p)
		default:
			return out
		}
	}
	return out
}

// checkMadePath refuses what the receiver never lists: the list is its
// own, but a path from a file is still not followed out of the root.
func checkMadePath(p string) error {
	if p == "" || p == "." || path.IsAbs(p) || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("syncdir: bad made-dirs path %q", p)
	}
	return nil
}

func sortedPaths[V any](m map[string]V) []string {
	ps := make([]string, 0, len(m))
	for p := range m {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// dirSeen is a listed directory as the sweep at start finds it.
type dirSeen struct {
	exists bool // something is at the name
	isDir  bool
	now    madeDir  // its inode and ctime now
	names  []string // its entries (a directory)
}

// dirVerdict is what the sweep at start does with one listed directory.
type dirVerdict uint8

const (
	// dirRemove: the directory made, untouched since, holding nothing but
	// directories removed with it.
	dirRemove dirVerdict = iota
	// dirGone: nothing is at the name any more.
	dirGone
	// dirReplaced: the name holds another inode, or not a directory.
	dirReplaced
	// dirChanged: the same directory, but its ctime moved: something was
	// put in it, removed from it, or it was renamed or chmod'ed.
	dirChanged
	// dirInUse: it holds something that stays.
	dirInUse
)

func (v dirVerdict) String() string {
	switch v {
	case dirRemove:
		return "remove"
	case dirGone:
		return "gone"
	case dirReplaced:
		return "replaced"
	case dirChanged:
		return "changed"
	case dirInUse:
		return "in-use"
	}
	return "unknown"
}

// judgeMadeDirs decides, without I/O, what becomes of each directory a
// previous run listed (list) given what is found there now (seen, by the
// same paths): only dirRemove is removed. A directory holding only
// listed directories that are removed is removed too (a whole chain made
// for one file that never came).
func judgeMadeDirs(list map[string]madeDir, seen map[string]dirSeen) map[string]dirVerdict {
	out := make(map[string]dirVerdict, len(list))
	var judge func(p string) dirVerdict
	judge = func(p string) dirVerdict {
		if v, ok := out[p]; ok {
			return v
		}
		out[p] = dirInUse // a cycle cannot happen in a tree; in doubt, keep
		s, rec := seen[p], list[p]
		var v dirVerdict
		switch {
		case !s.exists:
			v = dirGone
		case !s.isDir || s.now.Ino != rec.Ino:
			v = dirReplaced
		case rec.Ctime != 0 && s.now.Ctime != rec.Ctime:
			v = dirChanged
		default:
			v = dirRemove
			for _, name := range s.names {
				c := path.Join(p, name)
				if _, listed := list[c]; !listed || judge(c) != dirRemove {
					v = dirInUse
					break
				}
			}
		}
		out[p] = v
		return v
	}
	for p := range list {
		judge(p)
	}
	return out
}

// removalOrder is the directories to remove, each after everything below it.
func removalOrder(verdicts map[string]dirVerdict) []string {
	var ps []string
	for p, v := range verdicts {
		if v == dirRemove {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, j int) bool {
		if a, b := strings.Count(ps[i], "/"), strings.Count(ps[j], "/"); a != b {
			return a > b
		}
		return ps[i] < ps[j]
	})
	return ps
}
