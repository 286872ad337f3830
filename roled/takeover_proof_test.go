package roled

import (
	"strings"
	"testing"
)

// The takeover guard's proof, row by row: it acknowledges only when no other
// node has been ACTIVE since this one last was and nothing is in quarantine.
func TestProveTakeover(t *testing.T) {
	acq := func(node string, rev int64) LastActive { return LastActive{Node: node, Kind: "acquired", Rev: rev} }
	trk := func(node string, rev int64) LastActive { return LastActive{Node: node, Kind: "tracking", Rev: rev} }
	for _, tc := range []struct {
		name    string
		records []LastActive
		quar    int64
		want    GuardVerdict
		detail  string
	}{
		{"other never ACTIVE (record from its start, older)", []LastActive{acq("nodea", 40), trk("nodeb", 12)}, 0, GuardProved, "epoch 40"},
		{"other ACTIVE before us", []LastActive{acq("nodea", 40), acq("nodeb", 30)}, 0, GuardProved, "no other node ACTIVE since"},
		{"other ACTIVE after us: its writes may be lost", []LastActive{acq("nodea", 40), acq("nodeb", 55)}, 0, GuardOtherActiveLater, "nodeb was ACTIVE at epoch 55"},
		{"other's roled started after our epoch", []LastActive{acq("nodea", 40), trk("nodeb", 41)}, 0, GuardOtherUnknown, "starts at revision 41"},
		{"other has no record (older roled)", []LastActive{acq("nodea", 40)}, 0, GuardOtherUnknown, "no other node's record"},
		{"we were never ACTIVE on record", []LastActive{trk("nodea", 5), trk("nodeb", 6)}, 0, GuardSelfUnknown, ""},
		{"we have no record at all", []LastActive{acq("nodeb", 6)}, 0, GuardSelfUnknown, ""},
		{"files in quarantine", []LastActive{acq("nodea", 40), trk("nodeb", 12)}, 3, GuardQuarantine, "3 files"},
		{"quarantine unknown", []LastActive{acq("nodea", 40), trk("nodeb", 12)}, -1, GuardQuarantineUnknown, ""},
		{"a later ACTIVE wins over quarantine", []LastActive{acq("nodea", 40), acq("nodeb", 55)}, 3, GuardOtherActiveLater, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, detail := proveTakeover(GuardProof{Self: "nodea", Records: tc.records, Quarantined: tc.quar})
			if got != tc.want || !strings.Contains(detail, tc.detail) {
				t.Fatalf("proveTakeover = %s (%q), want %s containing %q", got, detail, tc.want, tc.detail)
			}
		})
	}
}
