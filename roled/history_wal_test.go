package roled

import (
	"testing"
	"time"
)

func TestLSN(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"0/0", 0, false},
		{"0/4000000", 0x4000000, false},
		{"0/3000060", 50331744, false},
		{"1/0", 1 << 32, false},
		{"16/B374D848", 0x16B374D848, false},
		{"a/ff", 0xa<<32 | 0xff, false}, // PostgreSQL reads lower case too
		{" 0/10 ", 0x10, false},
		{"0", 0, true},
		{"/10", 0, true},
		{"0/", 0, true},
		{"0/G", 0, true},
		{"-1/0", 0, true},
		{"123456789/0", 0, true}, // more than 32 bits
		{"FFFFFFFF/FFFFFFFF", 0, true},
	} {
		got, err := ParseLSN(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseLSN(%q) = %#x, %v; want %#x, error %v", c.in, got, err, c.want, c.err)
		}
		if err == nil {
			if back, _ := ParseLSN(FormatLSN(got)); back != got {
				t.Errorf("FormatLSN(%#x) = %q does not parse back", got, FormatLSN(got))
			}
		}
	}
	if s := FormatLSN(0x4000000); s != "0/4000000" {
		t.Errorf("FormatLSN = %q", s)
	}
	if s := FormatLSN(0x16B374D848); s != "16/B374D848" {
		t.Errorf("FormatLSN = %q", s)
	}
}

func TestParsePatroniHistory(t *testing.T) {
	// Patroni 3.0.2's GET /history after two failovers (the newest line has
	// the promotion time and the new leader).
	body := `[[1, 50331744, "no recovery target specified"], [2, 67109024, "no recovery target specified", "2026-11-30T03:20:01.123456+00:00", "nodeb"]]`
	h, err := parsePatroniHistory([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := []TimelineSwitch{{Timeline: 1, LSN: 50331744, Reason: "no recovery target specified"},
		{Timeline: 2, LSN: 67109024, Reason: "no recovery target specified", Timestamp: "2026-11-30T03:20:01.123456+00:00", NewLeader: "nodeb"}}
	if len(h) != 2 || h[0] != want[0] || h[1] != want[1] {
		t.Fatalf("got %+v", h)
	}
	for _, bad := range []string{`{}`, `[[1]]`, `[["1", 2, "x"]]`, `[[0, 2, "x"]]`, `[[1, -2, "x"]]`, `nope`} {
		if _, err := parsePatroniHistory([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if h, err := parsePatroniHistory([]byte(`[]`)); err != nil || len(h) != 0 {
		t.Errorf("empty: %v %v", h, err)
	}
}

func TestWALLoss(t *testing.T) {
	at := time.Unix(1000, 0)
	old := &WALPosition{LSN: 0x3000100, Timeline: 1, At: at}
	hist := []TimelineSwitch{{Timeline: 1, LSN: 0x3000060}}
	cases := []struct {
		name     string
		kind     HistoryKind
		same     bool
		old      *WALPosition
		newTL    int64
		hist     []TimelineSwitch
		want     WALLoss
		retry    bool
		wantSize int64
	}{
		{"failover: old ahead of the switch point", KindFailover, false, old, 2, hist,
			WALLoss{Basis: WALMeasured, Bytes: 0xa0, OldLSN: "0/3000100", OldTimeline: 1, OldLSNAt: at, SwitchLSN: "0/3000060", NewTimeline: 2}, false, 0xa0},
		{"old's last heartbeat before the switch point: 0 (lower bound)", KindFailover, false,
			&WALPosition{LSN: 0x3000000, Timeline: 1, At: at}, 2, hist,
			WALLoss{Basis: WALMeasured, OldLSN: "0/3000000", OldTimeline: 1, OldLSNAt: at, SwitchLSN: "0/3000060", NewTimeline: 2}, false, 0},
		{"switchover measured", KindSwitchover, false, &WALPosition{LSN: 0x3000060, Timeline: 1, At: at}, 2, hist,
			WALLoss{Basis: WALMeasured, OldLSN: "0/3000060", OldTimeline: 1, OldLSNAt: at, SwitchLSN: "0/3000060", NewTimeline: 2}, false, 0},
		{"two timelines later: the old one's end in the history", KindFailover, false,
			&WALPosition{LSN: 0x5000000, Timeline: 2, At: at}, 4,
			[]TimelineSwitch{{Timeline: 1, LSN: 0x3000060}, {Timeline: 2, LSN: 0x4000000}, {Timeline: 3, LSN: 0x6000000}},
			WALLoss{Basis: WALMeasured, Bytes: 0x1000000, OldLSN: "0/5000000", OldTimeline: 2, OldLSNAt: at, SwitchLSN: "0/4000000", NewTimeline: 4}, false, 0x1000000},
		{"history not written yet: retry", KindFailover, false, old, 2, nil,
			WALLoss{Basis: WALUnknown, Note: "timeline 1 not in the new primary's history yet", OldLSN: "0/3000100", OldTimeline: 1, OldLSNAt: at, NewTimeline: 2}, true, 0},
		{"local timeline not read yet: retry", KindFailover, false, old, 0, hist,
			WALLoss{Basis: WALUnknown, OldLSN: "0/3000100", OldTimeline: 1, OldLSNAt: at}, true, 0},
		{"no WAL position from the old ACTIVE", KindFailover, false, nil, 2, hist,
			WALLoss{Basis: WALUnknown, Note: "the old ACTIVE published no WAL position", NewTimeline: 2}, false, 0},
		{"switchover without figures: planned, 0", KindSwitchover, false, nil, 2, hist,
			WALLoss{Basis: WALPlanned, Note: "the old ACTIVE published no WAL position", NewTimeline: 2}, false, 0},
		{"same node again (a short quorum loss), no WAL position of its own", KindDemotion, true, nil, 2, hist,
			WALLoss{Basis: WALSameNode, NewTimeline: 2}, false, 0},
		{"timeline number reused by the promoted node: not comparable", KindFailover, false,
			&WALPosition{LSN: 0x3000100, Timeline: 2, At: at}, 2, hist,
			WALLoss{Basis: WALUnknown, Note: "old timeline 2, new 2: not comparable", OldLSN: "0/3000100", OldTimeline: 2, OldLSNAt: at, NewTimeline: 2}, false, 0},
	}
	for _, c := range cases {
		got, retry := walLoss(c.kind, c.same, c.old, c.newTL, c.hist)
		if got != c.want || retry != c.retry {
			t.Errorf("%s:\n got %+v retry %v\nwant %+v retry %v", c.name, got, retry, c.want, c.retry)
		}
		if got.Known() && got.Bytes != c.wantSize {
			t.Errorf("%s: %d bytes, want %d", c.name, got.Bytes, c.wantSize)
		}
	}
}

func TestDivergedRange(t *testing.T) {
	hist := []TimelineSwitch{{Timeline: 1, LSN: 0x3000060}, {Timeline: 2, LSN: 0x5000000}}
	cases := []struct {
		own  WALPosition
		want *DivergedWAL
	}{
		{WALPosition{LSN: 0x3000100, Timeline: 1}, &DivergedWAL{Timeline: 1, From: "0/3000060", To: "0/3000100", Bytes: 0xa0}},
		{WALPosition{LSN: 0x3000000, Timeline: 1}, &DivergedWAL{Timeline: 1, From: "0/3000060", To: "0/3000000", Bytes: 0}},
		{WALPosition{LSN: 0x6000000, Timeline: 2}, &DivergedWAL{Timeline: 2, From: "0/5000000", To: "0/6000000", Bytes: 0x1000000}},
		{WALPosition{LSN: 0x6000000, Timeline: 3}, nil}, // the newest timeline: nothing diverged
	}
	for _, c := range cases {
		got := divergedRange(c.own, hist)
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("%+v: got %+v, want %+v", c.own, got, c.want)
		}
	}
	lb := WALLoss{Basis: WALMeasured, Bytes: 0x50, OldLSN: "0/30000B0", OldTimeline: 1, SwitchLSN: "0/3000060", NewTimeline: 2}
	dv := DivergedWAL{Timeline: 1, From: "0/3000060", To: "0/3000100", Bytes: 0xa0}
	want := lb
	want.Basis, want.Bytes, want.ReturningEnd = WALReturning, 0xa0, "0/3000100"
	if got := withDiverged(lb, dv); got != want {
		t.Errorf("withDiverged: %+v, want %+v", got, want)
	}
	if got := withDiverged(lb, DivergedWAL{Timeline: 2, Bytes: 9}); got != lb {
		t.Errorf("another timeline changed it: %+v", got)
	}
	unknown := WALLoss{Basis: WALUnknown, Note: "the old ACTIVE published no WAL position", NewTimeline: 2}
	if got := withDiverged(unknown, dv); got.Basis != WALReturning || got.Bytes != 0xa0 || got.Note != "" || got.SwitchLSN != "0/3000060" {
		t.Errorf("from unknown: %+v", got)
	}
}
