package syncdir

import (
	"strings"
	"time"
)

// The sender's planning is a pure function, as roled's decide is: from
// what was seen of each ready path (observed, gathered by sender.plan with
// the file system calls) and the record of what the peer confirmed, to
// the requests that make the peer match (issue 16, "shape"). No I/O, no
// clock, no sender state.

// observed is one ready path as the sender saw it just now.
type observed struct {
	k   key
	p   *pend  // its pending state; read only here
	ent entry  // local state, when ok
	ok  bool   // it exists (a file, a directory or a link)
	tgt string // a link's target
	// noWriter: nobody has the file open for writing (a read lease was
	// granted); asked only for a file changed within holdOpen without a
	// close seen.
	noWriter bool
}

// planned is the outcome of planJobs.
type planned struct {
	jobs []job // in order; early puts have early set
	// holds are files changed moments ago with no close seen and maybe
	// still written: they wait until until, then are looked at again.
	holds []hold
	// rest are paths with nothing to send (unchanged, or never synced and
	// gone again).
	rest []key
}

type hold struct {
	k     key
	p     *pend
	until time.Time
}

// recordView reads the record of one root.
type recordView func(root int, rel string) (entry, bool)

// planJobs decides the requests for obs. earlySlots is how many more
// files may be streamed while written. A vanished path and a new one with
// its inode become one rename, so a moved tree is not sent again.
func planJobs(obs []observed, rec recordView, now time.Time, earlySlots int) planned {
	var out planned
	gone := map[[2]uint64]int{} // (root, inode) -> index in obs of a vanished path
	for i, o := range obs {
		if !o.ok && !o.p.noRename {
			if e, ok := rec(o.k.root, o.k.rel); ok && e.Ino != 0 {
				gone[[2]uint64{uint64(o.k.root), e.Ino}] = i
			}
		}
	}
	renamed := map[int]bool{}
	var movedDirs [][2]string
	for i, o := range obs {
		if !o.ok || o.p.noRename {
			continue
		}
		if _, known := rec(o.k.root, o.k.rel); known {
			continue
		}
		g, ok := gone[[2]uint64{uint64(o.k.root), o.ent.Ino}]
		if !ok || renamed[g] {
			continue
		}
		if old, _ := rec(obs[g].k.root, obs[g].k.rel); old.Kind != o.ent.Kind || (old.Kind == 'f' && !old.sameContent(o.ent)) {
			continue
		}
		renamed[g], renamed[i] = true, true
		if o.ent.Kind == 'd' {
			movedDirs = append(movedDirs, [2]string{obs[g].k.rel, o.k.rel})
		}
		out.jobs = append(out.jobs, job{kind: jobRename, k: obs[g].k, to: o.k.rel, ent: o.ent, p: obs[g].p, p2: o.p})
	}
	for i, o := range obs {
		if renamed[i] {
			continue
		}
		if !o.ok {
			if _, known := rec(o.k.root, o.k.rel); !known && !o.p.force {
				out.rest = append(out.rest, o.k) // never synced and gone again
				continue
			}
			out.jobs = append(out.jobs, job{kind: jobDelete, k: o.k, p: o.p})
			continue
		}
		if !o.p.force && unchangedFor(rec, o.k, o.ent, movedDirs) {
			out.rest = append(out.rest, o.k)
			continue
		}
		early := o.p.early && o.ent.Kind == 'f' && !o.p.closed && o.ent.Size >= earlyMin && earlySlots > 0
		if o.ent.Kind == 'f' && !o.p.closed && !early {
			// Modified moments ago and no close seen (a reconcile found it, or
			// the events are still on their way): give the writer time,
			// unless no writer has it open any more.
			if until := time.Unix(0, o.ent.Mtime).Add(holdOpen); now.Before(until) && !o.noWriter {
				out.holds = append(out.holds, hold{k: o.k, p: o.p, until: until})
				continue
			}
		}
		j := job{k: o.k, ent: o.ent, p: o.p, target: o.tgt, early: early}
		if early {
			earlySlots--
		}
		switch o.ent.Kind {
		case 'f':
			j.kind = jobPut
		case 'd':
			j.kind = jobMkdir
		case 'l':
			j.kind = jobSymlink
		}
		out.jobs = append(out.jobs, j)
	}
	return out
}

// needsWriterCheck reports whether planJobs may ask o.noWriter: a file
// changed within holdOpen with no close seen.
func needsWriterCheck(o observed, now time.Time) bool {
	return o.ok && o.ent.Kind == 'f' && !o.p.closed && now.Before(time.Unix(0, o.ent.Mtime).Add(holdOpen))
}

// unchangedFor reports whether the peer already has rel as it is,
// directly or as a child of a directory being renamed in the same plan.
func unchangedFor(rec recordView, k key, e entry, moved [][2]string) bool {
	if r, ok := rec(k.root, k.rel); ok && r.same(e) {
		return true
	}
	for _, m := range moved {
		if rest, ok := strings.CutPrefix(k.rel, m[1]+"/"); ok {
			if r, ok := rec(k.root, m[0]+"/"+rest); ok && r.same(e) {
				return true
			}
		}
	}
	return false
}
