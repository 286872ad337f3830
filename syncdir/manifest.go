package syncdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"sort"
)

// mEntry is one path of a manifest: the sender's view of its tree.
type mEntry struct {
	P string `json:"p"`
	K string `json:"k"` // "f", "d" or "l"
	S int64  `json:"s,omitempty"`
	M int64  `json:"m,omitempty"`
	O uint32 `json:"o,omitempty"`
	U uint32 `json:"u,omitempty"` // owner, compared only by a root receiver
	G uint32 `json:"g,omitempty"`
	L string `json:"l,omitempty"` // symlink target
}

type manifestReq struct {
	Entries []mEntry `json:"entries"`
}

// manifestResp names what the receiver lacks or has in a different state
// (Need) and what it has that the sender does not (Extra, topmost only).
type manifestResp struct {
	Need  []string `json:"need"`
	Extra []string `json:"extra"`
}

type scanned struct {
	m   mEntry
	ent entry
}

// scanTree lists root without following symlinks, skipping excluded and
// reserved paths.
func scanTree(root *os.Root, ex excluder) (map[string]scanned, error) {
	out := map[string]scanned{}
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if ex.match(p, d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // vanished while walking; the watcher will tell
		}
		sc, ok := scanOne(root, p, fi)
		if ok {
			out[p] = sc
		}
		return nil
	})
	return out, err
}

func scanOne(root *os.Root, p string, fi fs.FileInfo) (scanned, bool) {
	e := entryOf(fi)
	m := mEntry{P: p, O: e.Mode, U: e.Uid, G: e.Gid}
	switch {
	case fi.Mode().IsRegular():
		m.K, m.S, m.M = "f", e.Size, e.Mtime
	case fi.IsDir():
		m.K = "d"
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := root.Readlink(p)
		if err != nil {
			return scanned{}, false
		}
		m.K, m.L, m.O = "l", t, 0
	default:
		return scanned{}, false // sockets, fifos, devices do not travel
	}
	return scanned{m: m, ent: e}, true
}

// equal compares a local entry m with the sender's o; owners count only
// when this process can set them.
func (m mEntry) equal(o mEntry, owners bool) bool {
	if m.K != o.K || owners && (m.U != o.U || m.G != o.G) {
		return false
	}
	switch m.K {
	case "f":
		return m.S == o.S && m.M == o.M && m.O == o.O
	case "d":
		return m.O == o.O
	}
	return m.L == o.L
}

// asApplied is the sender's entry e as this receiver would have applied
// it (applyPolicy), so a mode or owner the policy changes does not make
// the file differ at every reconcile.
func (s *Syncer) asApplied(e mEntry) mEntry {
	if e.K != "l" {
		e.O = s.policyMode(e.O)
	}
	return e
}

// recvManifest compares the sender's manifest with the local tree. The
// body is decoded one entry at a time, bounded in entries and bytes
// (manifest-max-entries, manifest-max-bytes; finding 7): what is kept is
// the local scan (this node's own tree), the paths to answer, and a mark
// per local path the sender listed.
func (s *Syncer) recvManifest(w http.ResponseWriter, r *http.Request, rt *rootState, q request) error {
	local, err := scanTree(rt.root, rt.ex)
	if err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	sent := make(map[string]bool, len(local)) // local paths the sender listed
	resp := manifestResp{Need: []string{}, Extra: []string{}}
	var agreed []string
	err = s.readManifest(w, r, func(e mEntry) error {
		p, err := checkPath(e.P)
		if err != nil {
			return err
		}
		l, ok := local[p]
		if ok {
			sent[p] = true
		}
		// Equal attributes confirm a directory or a link (its target is
		// its content), but a file only if the record already proves it:
		// size and mtime are no proof of content (finding 3). An unproven
		// file is asked for again; install replaces it without quarantine
		// if it has the same bytes.
		if ok && l.m.equal(s.asApplied(e), s.wantOwner(e.U, e.G)) && (l.ent.Kind != 'f' || s.confirmed(rt, p, l.ent)) {
			agreed = append(agreed, p)
			return nil
		}
		if !rt.ex.matchAny(p, e.K == "d") {
			resp.Need = append(resp.Need, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Marking copies confirmed is a change too: only a fully read manifest
	// does it, inside the fence.
	release, err := s.holdFence(q)
	if err != nil {
		return err
	}
	for _, p := range agreed {
		rt.rec.set(p, local[p].ent) // both sides agree: this copy is confirmed
	}
	release()
	if err := rt.rec.commit(); err != nil {
		return err
	}
	for p := range local {
		if sent[p] {
			continue
		}
		// A local path is extra when its directory was listed (a path
		// whose directory is missing on the sender goes with it).
		if d := path.Dir(p); d == "." || sent[d] {
			resp.Extra = append(resp.Extra, p)
		}
	}
	sort.Strings(resp.Need)
	sort.Strings(resp.Extra)
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(resp)
}

// readManifest decodes the body {"entries":[...]} and calls each for
// every entry, in order, within the configured bounds.
func (s *Syncer) readManifest(w http.ResponseWriter, r *http.Request, each func(mEntry) error) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.ManifestMaxBytes))
	bad := func(err error) error {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return refuse(ReasonTooLarge, http.StatusRequestEntityTooLarge, "manifest over %d bytes", mbe.Limit)
		}
		return refuse(ReasonBadRequest, http.StatusBadRequest, "bad manifest: %v", err)
	}
	delim := func(want json.Delim) error {
		t, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		if d, ok := t.(json.Delim); !ok || d != want {
			return bad(fmt.Errorf("want %v, got %v", want, t))
		}
		return nil
	}
	if err := delim('{'); err != nil {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		if k, _ := t.(string); k != "entries" {
			return bad(fmt.Errorf("unknown field %v", t))
		}
		if err := delim('['); err != nil {
			return err
		}
		for n := 0; dec.More(); n++ {
			if n == s.cfg.ManifestMaxEntries {
				return refuse(ReasonTooLarge, http.StatusRequestEntityTooLarge, "manifest of more than %d entries", n)
			}
			var e mEntry
			if err := dec.Decode(&e); err != nil {
				return bad(err)
			}
			if err := each(e); err != nil {
				return err
			}
		}
		if err := delim(']'); err != nil {
			return err
		}
	}
	return delim('}')
}
