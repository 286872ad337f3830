package syncdir

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// planJobs, the sender's decision, table-tested like roled's decide.
func TestPlanJobs(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	old := now.Add(-time.Hour).UnixNano()
	recent := now.Add(-holdOpen / 2).UnixNano()
	file := func(size int64, mtime int64, ino uint64) entry {
		return entry{Kind: 'f', Size: size, Mtime: mtime, Mode: 0o644, Ino: ino}
	}
	type rec map[string]entry
	obs := func(rel string, p pend, e entry) observed {
		return observed{k: key{0, rel}, p: &p, ent: e, ok: e.Kind != 0}
	}
	gone := func(rel string, p pend) observed { return observed{k: key{0, rel}, p: &p} }
	for _, c := range []struct {
		name  string
		rec   rec
		obs   []observed
		slots int
		want  string // jobs | holds | rest
	}{
		{"new closed file", nil, []observed{obs("a", pend{closed: true}, file(3, old, 1))}, 4,
			"put a |  | "},
		{"new file, maybe still written", nil, []observed{obs("a", pend{}, file(3, recent, 1))}, 4,
			" | a | "},
		{"new file, no writer left", nil, []observed{func() observed {
			o := obs("a", pend{}, file(3, recent, 1))
			o.noWriter = true
			return o
		}()}, 4, "put a |  | "},
		{"old file without close", nil, []observed{obs("a", pend{}, file(3, old, 1))}, 4,
			"put a |  | "},
		{"unchanged", rec{"a": file(3, old, 1)}, []observed{obs("a", pend{closed: true}, file(3, old, 1))}, 4,
			" |  | a"},
		{"unchanged, forced", rec{"a": file(3, old, 1)}, []observed{obs("a", pend{closed: true, force: true}, file(3, old, 1))}, 4,
			"put a |  | "},
		{"mode changed", rec{"a": file(3, old, 1)}, []observed{obs("a", pend{closed: true}, entry{Kind: 'f', Size: 3, Mtime: old, Mode: 0o600, Ino: 1})}, 4,
			"put a |  | "},
		{"vanished, synced", rec{"a": file(3, old, 1)}, []observed{gone("a", pend{})}, 4,
			"delete a |  | "},
		{"vanished, never synced", nil, []observed{gone("a", pend{})}, 4,
			" |  | a"},
		{"vanished, never synced, forced", nil, []observed{gone("a", pend{force: true})}, 4,
			"delete a |  | "},
		{"moved file", rec{"a": file(3, old, 7)}, []observed{gone("a", pend{}), obs("b", pend{closed: true}, file(3, old, 7))}, 4,
			"rename a->b |  | "},
		{"moved file, changed on the way", rec{"a": file(3, old, 7)}, []observed{gone("a", pend{}), obs("b", pend{closed: true}, file(4, old, 7))}, 4,
			"delete a,put b |  | "},
		{"moved, but no rename asked", rec{"a": file(3, old, 7)}, []observed{gone("a", pend{noRename: true}), obs("b", pend{closed: true}, file(3, old, 7))}, 4,
			"delete a,put b |  | "},
		{"moved directory, child comes along", rec{"d": {Kind: 'd', Mode: 0o755, Ino: 9}, "d/x": file(1, old, 10)},
			[]observed{gone("d", pend{}), obs("e", pend{}, entry{Kind: 'd', Mode: 0o755, Ino: 9}), obs("e/x", pend{closed: true}, file(1, old, 10))}, 4,
			"rename d->e |  | e/x"},
		{"big file being written goes early", nil, []observed{obs("big", pend{early: true}, file(earlyMin, recent, 1))}, 1,
			"put big early |  | "},
		{"no slot to go early", nil, []observed{obs("big", pend{early: true}, file(earlyMin, recent, 1))}, 0,
			" | big | "},
		{"one slot, two early candidates", nil, []observed{
			obs("b1", pend{early: true}, file(earlyMin, recent, 1)), obs("b2", pend{early: true}, file(earlyMin, recent, 2))}, 1,
			"put b1 early | b2 | "},
		{"directory and link", nil, []observed{
			obs("d", pend{}, entry{Kind: 'd', Mode: 0o755, Ino: 1}), obs("l", pend{}, entry{Kind: 'l', Ino: 2})}, 4,
			"mkdir d,symlink l |  | "},
	} {
		t.Run(c.name, func(t *testing.T) {
			view := func(_ int, rel string) (entry, bool) { e, ok := c.rec[rel]; return e, ok }
			pl := planJobs(c.obs, view, now, c.slots)
			var jobs, holds, rest []string
			for _, j := range pl.jobs {
				s := map[jobKind]string{jobPut: "put", jobMkdir: "mkdir", jobSymlink: "symlink", jobDelete: "delete", jobRename: "rename"}[j.kind] + " " + j.k.rel
				if j.kind == jobRename {
					s += "->" + j.to
				}
				if j.early {
					s += " early"
				}
				jobs = append(jobs, s)
			}
			for _, h := range pl.holds {
				if want := time.Unix(0, recent).Add(holdOpen); !h.until.Equal(want) {
					t.Errorf("hold of %s until %v, want %v (holdOpen after its mtime)", h.k.rel, h.until, want)
				}
				holds = append(holds, h.k.rel)
			}
			for _, k := range pl.rest {
				rest = append(rest, k.rel)
			}
			slices.Sort(rest)
			got := fmt.Sprintf("%s | %s | %s", strings.Join(jobs, ","), strings.Join(holds, ","), strings.Join(rest, ","))
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}
