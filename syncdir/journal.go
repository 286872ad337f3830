package syncdir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// journal is the append-only tail of a record: one line per change since
// the record file was last rewritten, in files <prefix><generation>.
//
//	s <record line>      set (the record file's line format)
//	r "path"             removeTree
//	m "from" "to"        renameTree
//
// Lines are gathered in memory as the record changes (under record.mu)
// and written and fdatasync'ed by commit, which the receiver calls before
// it answers; callers that find their lines already written by another
// commit share its fdatasync. A rewrite of the record (flush) drops the
// lines not written yet: the record file holds them, and commit waits for
// it (record.fmu). The sender never commits: its lines wait for the flush. A torn last line (a crash mid-write) ends
// the replay: what it held was never answered.
type journal struct {
	dir, prefix string

	// All but pending are guarded by record.fmu.
	gen     uint64   // generation written to now
	f       *os.File // its file, opened on the first write
	pending []byte   // lines not written yet; guarded by record.mu
}

func (j *journal) logSet(p string, e entry) {
	j.pending = append(j.pending, 's', ' ')
	j.pending = appendRecordLine(j.pending, p, e)
}

func (j *journal) logRemove(p string) {
	j.pending = append(j.pending, 'r', ' ')
	j.pending = strconv.AppendQuote(j.pending, p)
	j.pending = append(j.pending, '\n')
}

func (j *journal) logRename(from, to string) {
	j.pending = append(j.pending, 'm', ' ')
	j.pending = strconv.AppendQuote(j.pending, from)
	j.pending = append(j.pending, ' ')
	j.pending = strconv.AppendQuote(j.pending, to)
	j.pending = append(j.pending, '\n')
}

// take and putBack move the pending lines out and (after a failed write)
// back in front; under record.mu.
func (j *journal) take() []byte {
	b := j.pending
	j.pending = nil
	return b
}

func (j *journal) putBack(b []byte) { j.pending = append(b, j.pending...) }

// write appends b to the current generation and makes it durable.
func (j *journal) write(b []byte) error {
	if err := j.writeNoSync(b); err != nil || len(b) == 0 {
		return err
	}
	return unix.Fdatasync(int(j.f.Fd()))
}

// writeNoSync appends b without making it durable: for a caller whose
// syncfs of the same file system follows (record.commitWith).
func (j *journal) writeNoSync(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if j.f == nil {
		f, err := os.OpenFile(j.name(j.gen), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		if err := syncDir(j.dir); err != nil { // the new file's name
			f.Close()
			return err
		}
		j.f = f
	}
	_, err := j.f.Write(b)
	return err
}

// rotate starts a new generation, drops the pending lines and returns the
// last generation the caller's snapshot of the record holds; under
// record.fmu and record.mu.
func (j *journal) rotate() uint64 {
	j.pending = nil
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
	j.gen++
	return j.gen - 1
}

// drop removes the journals up to generation upTo, now held by the record.
func (j *journal) drop(upTo uint64) {
	gens, _ := j.generations()
	for _, g := range gens {
		if g <= upTo {
			os.Remove(j.name(g))
		}
	}
}

func (j *journal) name(gen uint64) string {
	return filepath.Join(j.dir, j.prefix+strconv.FormatUint(gen, 10))
}

// generations lists the journal files present, oldest first.
func (j *journal) generations() ([]uint64, error) {
	des, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, err
	}
	var gens []uint64
	for _, de := range des {
		s, ok := strings.CutPrefix(de.Name(), j.prefix)
		if !ok {
			continue
		}
		if g, err := strconv.ParseUint(s, 10, 64); err == nil && strconv.FormatUint(g, 10) == s {
			gens = append(gens, g)
		}
	}
	sort.Slice(gens, func(a, b int) bool { return gens[a] < gens[b] })
	return gens, nil
}

// replay applies the journals present to m, oldest first, and makes the
// next write go to a new generation; it reports whether any was found.
func (j *journal) replay(m map[string]entry) (bool, error) {
	gens, err := j.generations()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("syncdir: read record journals: %w", err)
	}
	for _, g := range gens {
		b, err := os.ReadFile(j.name(g))
		if err != nil {
			return false, fmt.Errorf("syncdir: read record journal: %w", err)
		}
		applyJournal(m, b)
		j.gen = g + 1
	}
	return len(gens) > 0, nil
}

// applyJournal applies the lines of b to m up to the first one that does
// not parse (a torn tail).
func applyJournal(m map[string]entry, b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return // torn: never completed, never answered
		}
		line := string(b[:i])
		b = b[i+1:]
		if !applyJournalLine(m, line) {
			return
		}
	}
}

func applyJournalLine(m map[string]entry, line string) bool {
	op, rest, ok := strings.Cut(line, " ")
	if !ok {
		return false
	}
	switch op {
	case "s":
		one, err := decodeRecord([]byte(rest))
		if err != nil || len(one) != 1 {
			return false
		}
		for p, e := range one {
			m[p] = e
		}
	case "r":
		p, err := strconv.Unquote(rest)
		if err != nil {
			return false
		}
		removeTree(m, p)
	case "m":
		q, err := strconv.QuotedPrefix(rest)
		if err != nil || len(rest) < len(q)+2 || rest[len(q)] != ' ' {
			return false
		}
		from, err1 := strconv.Unquote(q)
		to, err2 := strconv.Unquote(rest[len(q)+1:])
		if err1 != nil || err2 != nil {
			return false
		}
		renameTree(m, from, to)
	default:
		return false
	}
	return true
}
