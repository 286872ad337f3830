package roled

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParseLSN reads a PostgreSQL LSN as PostgreSQL prints it ("0/4000000":
// the high and low 32 bits in hex) into a byte position.
func ParseLSN(s string) (int64, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok || hi == "" || lo == "" || len(hi) > 8 || len(lo) > 8 {
		return 0, fmt.Errorf("lsn %q: want X/Y, each at most 8 hex digits", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("lsn %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("lsn %q: %w", s, err)
	}
	v := h<<32 | l
	if v > 1<<63-1 {
		return 0, fmt.Errorf("lsn %q: beyond 2^63", s)
	}
	return int64(v), nil
}

// FormatLSN prints a byte position as PostgreSQL does ("0/4000000").
func FormatLSN(v int64) string { return fmt.Sprintf("%X/%X", uint64(v)>>32, uint32(v)) }

// WALPosition is an ACTIVE node's WAL end as its roled last saw it (Patroni's
// xlog.location on the primary: pg_current_wal_lsn()), published in its
// heartbeat so the next ACTIVE can say how much WAL a failover lost. It is a
// lower bound of the old primary's real end: it is as old as the heartbeat
// (heartbeat-interval, plus the reader's reread-interval).
type WALPosition struct {
	LSN      int64     `json:"lsn"`      // bytes
	Timeline int64     `json:"timeline"` // Patroni's timeline
	At       time.Time `json:"at"`       // when roled read it from Patroni
}

// TimelineSwitch is one line of Patroni's GET /history: timeline Timeline
// ended at LSN (the next timeline starts there).
type TimelineSwitch struct {
	Timeline  int64
	LSN       int64
	Reason    string
	Timestamp string // promotion time, when Patroni knows it
	NewLeader string // who was promoted, when Patroni knows it
}

// parsePatroniHistory reads GET /history: a JSON list of [timeline, lsn,
// reason, timestamp, new_leader] (the last two only where Patroni recorded
// them; lsn in bytes).
func parsePatroniHistory(b []byte) ([]TimelineSwitch, error) {
	var lines [][]any
	if err := json.Unmarshal(b, &lines); err != nil {
		return nil, fmt.Errorf("patroni history: %w", err)
	}
	out := make([]TimelineSwitch, 0, len(lines))
	for i, l := range lines {
		if len(l) < 2 {
			return nil, fmt.Errorf("patroni history line %d: %d fields", i, len(l))
		}
		tl, ok1 := l[0].(float64)
		lsn, ok2 := l[1].(float64)
		if !ok1 || !ok2 || tl < 1 || lsn < 0 {
			return nil, fmt.Errorf("patroni history line %d: timeline %v, lsn %v: not numbers", i, l[0], l[1])
		}
		s := TimelineSwitch{Timeline: int64(tl), LSN: int64(lsn)}
		str := func(j int) string {
			if j < len(l) {
				if v, ok := l[j].(string); ok {
					return v
				}
			}
			return ""
		}
		s.Reason, s.Timestamp, s.NewLeader = str(2), str(3), str(4)
		out = append(out, s)
	}
	return out, nil
}

// History asks GET /history: the timeline switches Patroni keeps in the DCS.
func (c *patroniClient) History(ctx context.Context) ([]TimelineSwitch, error) {
	code, body, err := c.get(ctx, http.MethodGet, "/history")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("patroni /history: status %d", code)
	}
	return parsePatroniHistory(body)
}

// WALBasis says how wal_lost_bytes was found, or why it is not known.
type WALBasis string

// The bases.
const (
	// WALMeasured: the old ACTIVE's last published WAL end minus the point
	// where its timeline ends in the new primary's history, at least 0. A
	// lower bound (WALPosition).
	WALMeasured WALBasis = "lower_bound"
	// WALSameNode: the same node took the role again on its own timeline.
	WALSameNode WALBasis = "same_node"
	// WALPlanned: a switchover whose figures could not be read; Patroni's
	// planned switchover hands over only a caught-up replica, so 0.
	WALPlanned WALBasis = "planned"
	// WALUnknown: not known (Note says why).
	WALUnknown WALBasis = "unknown"
	// WALReturning: the returning old ACTIVE's own WAL end, read by its
	// roled before Patroni rewound it, against the same switch point: what
	// its PostgreSQL had replayed (all it had flushed), so no longer a
	// lower bound by a heartbeat period.
	WALReturning WALBasis = "returning_node"
	// WALPending: not known yet; roled still waits for the new primary's
	// Patroni history (at most a minute).
	WALPending WALBasis = "pending"
)

// WALLoss is how much WAL the old ACTIVE had that the new timeline does not.
type WALLoss struct {
	Basis       WALBasis  `json:"basis"`
	Note        string    `json:"note,omitempty"`
	Bytes       int64     `json:"bytes"`
	OldLSN      string    `json:"old_lsn,omitempty"` // the old ACTIVE's last published WAL end
	OldTimeline int64     `json:"old_timeline,omitempty"`
	OldLSNAt    time.Time `json:"old_lsn_at,omitzero"`  // when the old ACTIVE's roled read it
	SwitchLSN   string    `json:"switch_lsn,omitempty"` // where the old timeline ends in the new primary's history
	NewTimeline int64     `json:"new_timeline,omitempty"`
	// ReturningEnd: the returning old ACTIVE's own WAL end before its
	// rewind (basis returning_node).
	ReturningEnd string `json:"returning_end,omitempty"`
}

// Known is true when Bytes is a figure (exact or lower bound).
func (w WALLoss) Known() bool {
	return w.Basis == WALMeasured || w.Basis == WALSameNode || w.Basis == WALPlanned || w.Basis == WALReturning
}

// withDiverged improves w with the returning old ACTIVE's own diverged
// range (pure): same timeline only, and never below the lower bound.
func withDiverged(w WALLoss, dv DivergedWAL) WALLoss {
	if w.OldTimeline != 0 && dv.Timeline != w.OldTimeline {
		return w
	}
	b := dv.Bytes
	if w.Basis == WALMeasured {
		b = max(b, w.Bytes)
	}
	w.Basis, w.Note, w.Bytes = WALReturning, "", b
	w.OldTimeline, w.SwitchLSN, w.ReturningEnd = dv.Timeline, dv.From, dv.To
	return w
}

// walLoss is the pure WAL arithmetic of a role change: the old ACTIVE's last
// WAL position (nil if it never published one), the new primary's timeline
// and its Patroni history. retry is true while the answer may still come
// (the new primary's Patroni writes the history one HA loop after the
// promotion).
func walLoss(kind HistoryKind, sameNode bool, old *WALPosition, newTL int64, hist []TimelineSwitch) (w WALLoss, retry bool) {
	w = WALLoss{Basis: WALUnknown, NewTimeline: newTL}
	planned := func(note string) (WALLoss, bool) {
		if kind == KindSwitchover {
			w.Basis, w.Bytes, w.Note = WALPlanned, 0, note
			return w, false
		}
		w.Note = note
		return w, false
	}
	if sameNode {
		// The same node took the role again (a short quorum loss, a roled
		// restart): its PostgreSQL never stopped being the primary.
		w.Basis = WALSameNode
		return w, false
	}
	if old == nil || old.LSN <= 0 || old.Timeline <= 0 {
		return planned("the old ACTIVE published no WAL position")
	}
	w.OldLSN, w.OldTimeline, w.OldLSNAt = FormatLSN(old.LSN), old.Timeline, old.At
	switch {
	case newTL <= 0:
		return w, true // the local Patroni's timeline not read yet
	case old.Timeline >= newTL:
		// A promoted replica always starts a new timeline; the same (or a
		// lower) number on the new primary means it was promoted onto a
		// number the old primary had used itself (Patroni 3.0.2 without
		// check_timeline): the two WAL streams are not comparable.
		return planned(fmt.Sprintf("old timeline %d, new %d: not comparable", old.Timeline, newTL))
	}
	for _, s := range hist {
		if s.Timeline == old.Timeline {
			w.SwitchLSN = FormatLSN(s.LSN)
			w.Basis, w.Bytes = WALMeasured, max(0, old.LSN-s.LSN)
			return w, false
		}
	}
	w.Note = fmt.Sprintf("timeline %d not in the new primary's history yet", old.Timeline)
	return w, true
}
