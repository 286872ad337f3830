package roled

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The takeover guard resolves itself only where roled can prove that the
// member that took Patroni's leader key holds every write the other node
// acknowledged (issue 19 item 5). The proof rests on one fact etcd keeps for
// us: every node's last acquisition of the active key, written in the same
// transaction as the acquisition (lastActiveKey), so it cannot be missed,
// lost to compaction or written late.
//
// Writes are acknowledged through hapair only by the ACTIVE node (the
// balancer sends to it alone; the database fence keeps the application's
// roles read-only elsewhere), and only one active key exists at a time. So if
// every other node's last acquisition is older than this node's own, no
// other node has been ACTIVE since this node last was: everything
// acknowledged since was acknowledged here, and the takeover loses nothing of
// the other's. Acknowledging is then safe. If the other node was ACTIVE after
// us (the usual case of Patroni 3.0.2's overwrite after a partition or a
// pause: the other node was promoted, served, and the stale node took the key
// back), its writes are on a timeline this node never streamed, and the
// guard keeps holding for a person, as before.

// lastActiveKey is where a node's last acquisition of the active key is
// recorded (no lease: it outlives the node's roled). Its ModRevision is that
// acquisition's epoch; a record written by roled's start (kind "tracking",
// only when none exists) says that the node's roled keeps the record, and
// its ModRevision bounds the node's last acquisition from above.
func lastActiveKey(prefix, node string) string { return prefix + "last-active/" + node }

// LastActivePrefix is where every node's last-active record lives.
func LastActivePrefix(prefix string) string { return prefix + "last-active/" }

// lastActiveValue is the JSON of a last-active record.
type lastActiveValue struct {
	Node   string `json:"node"`
	Member string `json:"member"`
	// Kind: "acquired" (written with an acquisition) or "tracking"
	// (written at roled's first start, no acquisition yet).
	Kind string `json:"kind"`
}

// LastActive is one node's record as read: Rev is the record's ModRevision.
type LastActive struct {
	Node   string
	Member string
	Kind   string
	Rev    int64
}

func parseLastActive(key string, prefix string, value []byte, rev int64) LastActive {
	la := LastActive{Node: strings.TrimPrefix(key, LastActivePrefix(prefix)), Rev: rev}
	var v lastActiveValue
	if json.Unmarshal(value, &v) == nil {
		la.Member, la.Kind = v.Member, v.Kind
	}
	return la
}

// GuardVerdict says whether a takeover alarm may be acknowledged by roled.
type GuardVerdict string

// The verdicts: one proof, and why a person is needed otherwise.
const (
	// GuardProved: no other node has been ACTIVE since this node last was,
	// and nothing waits in this node's quarantine.
	GuardProved GuardVerdict = "proved_no_loss"
	// GuardOtherActiveLater: another node acquired the active key after
	// this node's last acquisition: it may have acknowledged writes this
	// node does not hold.
	GuardOtherActiveLater GuardVerdict = "other_active_later"
	// GuardOtherUnknown: a node has no last-active record (a roled that
	// predates the record, or never started): it cannot be ruled out.
	GuardOtherUnknown GuardVerdict = "other_record_missing"
	// GuardSelfUnknown: this node has no acquisition on record (never
	// ACTIVE since the record exists): there is no "since" to prove.
	GuardSelfUnknown GuardVerdict = "self_record_missing"
	// GuardQuarantine: files wait in this node's quarantine: content it
	// received conflicts with what it holds, which a person should see.
	GuardQuarantine GuardVerdict = "files_in_quarantine"
	// GuardQuarantineUnknown: the file sync runs but cannot count its
	// quarantine.
	GuardQuarantineUnknown GuardVerdict = "quarantine_unknown"
)

// GuardProof is everything proveTakeover looks at; read in one etcd
// transaction with the alarm, no I/O.
type GuardProof struct {
	Self    string       // this node (the taker's roled)
	Records []LastActive // every last-active record
	// Quarantined: files waiting in this node's quarantine; -1 when the
	// sync runs but cannot say; 0 also when there is no file sync.
	Quarantined int64
}

// proveTakeover is the takeover guard's self-resolution as a pure
// decision: GuardProved with what was proved, or the reason a person must
// acknowledge. It says nothing about writes made straight into the other
// node's PostgreSQL by roles the fence does not cover (the superuser), or
// by application roles on a promoted standby the fence never reached (a
// partition cut the fence off before it replicated); see the README.
func proveTakeover(p GuardProof) (GuardVerdict, string) {
	var self *LastActive
	for i := range p.Records {
		if p.Records[i].Node == p.Self {
			self = &p.Records[i]
		}
	}
	if self == nil || self.Kind != "acquired" {
		return GuardSelfUnknown, "this node has no ACTIVE period on record"
	}
	others := 0
	for _, r := range p.Records {
		if r.Node == p.Self {
			continue
		}
		others++
		if r.Rev > self.Rev {
			if r.Kind == "acquired" {
				return GuardOtherActiveLater, fmt.Sprintf("%s was ACTIVE at epoch %d, after this node's epoch %d", r.Node, r.Rev, self.Rev)
			}
			// A tracking record newer than our acquisition: that roled
			// started after it, and whether it was ACTIVE before its
			// record existed is unknown.
			return GuardOtherUnknown, fmt.Sprintf("%s's record starts at revision %d, after this node's epoch %d", r.Node, r.Rev, self.Rev)
		}
	}
	if others == 0 {
		return GuardOtherUnknown, "no other node's record (its roled never ran with the record)"
	}
	switch {
	case p.Quarantined < 0:
		return GuardQuarantineUnknown, "the file sync cannot count its quarantine"
	case p.Quarantined > 0:
		return GuardQuarantine, fmt.Sprintf("%d files in quarantine", p.Quarantined)
	}
	return GuardProved, fmt.Sprintf("no other node ACTIVE since this node's epoch %d, nothing in quarantine", self.Rev)
}
