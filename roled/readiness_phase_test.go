package roled

import (
	"testing"
	"time"
)

func TestStandbyPhase(t *testing.T) {
	cases := []struct {
		name    string
		s       phaseSample
		m       phaseMemory
		want    StandbyPhase
		next    phaseMemory
		relabel bool
	}{
		{"Patroni not answering yet", phaseSample{Reason: StandbyPatroniDown}, phaseMemory{}, PhaseStart, phaseMemory{}, false},
		{"Patroni stopped before any start", phaseSample{Reason: StandbyNotRunning, PatroniState: "stopped"}, phaseMemory{}, PhaseStart, phaseMemory{}, false},
		{"PostgreSQL starting", phaseSample{Reason: StandbyNotRunning, PatroniState: "starting"}, phaseMemory{}, PhaseStart, phaseMemory{}, false},
		{"running, receiver connecting", phaseSample{Reason: StandbyNotStreaming, PatroniState: "running", Receiver: "startup"}, phaseMemory{},
			PhaseWALCatchup, phaseMemory{Ran: true}, false},
		{"running, no receiver: diverged", phaseSample{Reason: StandbyNotStreaming, PatroniState: "running"}, phaseMemory{Ran: true},
			PhaseRewind, phaseMemory{Ran: true, Rewound: true}, false},
		{"stopped after running: stopped for pg_rewind", phaseSample{Reason: StandbyNotRunning, PatroniState: "stopped"}, phaseMemory{Ran: true},
			PhaseRewind, phaseMemory{Ran: true, Rewound: true}, true},
		{"stopped again after a divergence: no second relabel", phaseSample{Reason: StandbyNotRunning, PatroniState: "stopped"}, phaseMemory{Ran: true, Rewound: true},
			PhaseRewind, phaseMemory{Ran: true, Rewound: true}, false},
		{"starting after the rewind", phaseSample{Reason: StandbyPostgresDown, PatroniState: "starting"}, phaseMemory{Ran: true, Rewound: true},
			PhaseRewind, phaseMemory{Ran: true, Rewound: true}, false},
		{"timeline differs", phaseSample{Reason: StandbyTimeline, PatroniState: "running", Receiver: "streaming"}, phaseMemory{},
			PhaseRewind, phaseMemory{Ran: true, Rewound: true}, false},
		{"streaming, replay behind", phaseSample{Reason: StandbyLagBytes, PatroniState: "running", Receiver: "streaming"}, phaseMemory{Ran: true, Rewound: true},
			PhaseWALCatchup, phaseMemory{Ran: true}, false},
		{"files behind", phaseSample{Reason: StandbySyncLag, PatroniState: "running", Receiver: "streaming"}, phaseMemory{Ran: true},
			PhaseFileSync, phaseMemory{Ran: true}, false},
		{"sync receiver down", phaseSample{Reason: StandbySyncReceiver, PatroniState: "running", Receiver: "streaming"}, phaseMemory{Ran: true},
			PhaseFileSync, phaseMemory{Ran: true}, false},
		{"no leader", phaseSample{Reason: StandbyNoLeader, PatroniState: "running"}, phaseMemory{}, PhaseWaiting, phaseMemory{Ran: true}, false},
		{"Patroni died after running: not a rewind", phaseSample{Reason: StandbyPatroniDown}, phaseMemory{Ran: true}, PhaseStart, phaseMemory{Ran: true}, false},
		// A switchover: the old primary still runs as one, then Patroni
		// stops it to start it as a replica: a restart, not a rewind.
		{"demoted primary still running", phaseSample{Reason: StandbyNotReplica, PatroniState: "running"}, phaseMemory{}, PhaseStart, phaseMemory{}, false},
		{"demoted primary stopped", phaseSample{Reason: StandbyNotRunning, PatroniState: "stopped"}, phaseMemory{}, PhaseStart, phaseMemory{}, false},
	}
	for _, c := range cases {
		p, next, relabel := standbyPhase(c.s, c.m)
		if p != c.want || next != c.next || relabel != c.relabel {
			t.Errorf("%s: got %s %+v relabel %v, want %s %+v relabel %v", c.name, p, next, relabel, c.want, c.next, c.relabel)
		}
	}
}

// The false "rejoined", as a timeline: the killed former primary
// comes back as a `running` replica whose receiver keeps failing, Patroni
// stops it for pg_rewind, starts it, it streams, replay catches up, the files
// follow. The split puts the "running but diverged" seconds under rewind.
func TestRecoveryTracker(t *testing.T) {
	wall0 := time.Unix(5000, 0)
	var tr recoveryTracker
	now := time.Duration(0)
	step := func(d time.Duration, r Readiness, s phaseSample) *StandbyRecovery {
		now += d
		s.Reason = r.Reason
		return tr.track(r, s, now, wall0.Add(now))
	}
	not := func(reason StandbyReason) Readiness { return Readiness{Reason: reason} }
	if rec := step(0, not(StandbyIsActive), phaseSample{}); rec != nil {
		t.Fatalf("ACTIVE: %+v", rec)
	}
	step(time.Second, not(StandbyPatroniDown), phaseSample{})                                                // roled up, Patroni not yet
	step(2*time.Second, not(StandbyNotRunning), phaseSample{PatroniState: "stopped"})                        // 2 s start
	step(3*time.Second, not(StandbyNotStreaming), phaseSample{PatroniState: "running", Receiver: "startup"}) // 3 s start
	rec := step(time.Second, not(StandbyNotRunning), phaseSample{PatroniState: "stopped"})                   // 1 s catch-up → rewind
	if rec.Phase != PhaseRewind || rec.Phases.WALCatchup != 0 || rec.Phases.Rewind != 1 || rec.Phases.Start != 5 {
		t.Fatalf("after the stop for pg_rewind: %+v", rec)
	}
	step(4*time.Second, not(StandbyNotRunning), phaseSample{PatroniState: "starting"})                                                   // 4 s rewind
	step(1*time.Second, not(StandbyNotStreaming), phaseSample{PatroniState: "running", Receiver: "startup"})                             // 1 s rewind
	step(2*time.Second, not(StandbyLagBytes), phaseSample{PatroniState: "running", Receiver: "streaming"})                               // 2 s catch-up
	step(1*time.Second, not(StandbySyncLag), phaseSample{PatroniState: "running", Receiver: "streaming"})                                // 1 s catch-up
	rec = step(3*time.Second, Readiness{Ready: true, Reason: StandbyReady}, phaseSample{PatroniState: "running", Receiver: "streaming"}) // 3 s files
	want := PhaseSplit{Start: 5, Rewind: 6, WALCatchup: 3, FileSync: 3}
	if rec == nil || rec.Phases != want || rec.Seconds != 17 || !rec.Started.Equal(wall0.Add(time.Second)) ||
		!rec.ReadyAt.Equal(wall0.Add(18*time.Second)) || rec.Phase != "" {
		t.Fatalf("done: %+v, want phases %+v over 17 s", rec, want)
	}
	// Ready stays ready: the same completed episode is published.
	if again := step(time.Second, Readiness{Ready: true, Reason: StandbyReady}, phaseSample{}); again != rec {
		t.Fatalf("ready again: %+v", again)
	}
	// Not ready again: a new episode.
	rec = step(time.Second, not(StandbyLagTime), phaseSample{PatroniState: "running", Receiver: "streaming"})
	if rec.ReadyAt.IsZero() == false || rec.Seconds != 0 || rec.Phase != PhaseWALCatchup {
		t.Fatalf("new episode: %+v", rec)
	}
	// Ready at the very first evaluation: an empty episode.
	var tr2 recoveryTracker
	if r := tr2.track(Readiness{Ready: true, Reason: StandbyReady}, phaseSample{}, time.Second, wall0); r == nil || r.Seconds != 0 || !r.ReadyAt.Equal(wall0) {
		t.Fatalf("ready at once: %+v", r)
	}
}

// The returning former primary's own WAL end is what it replayed while it
// ran without streaming, before Patroni stopped it for pg_rewind; the
// rewind's later positions do not count.
func TestRecoveryOwnWALEnd(t *testing.T) {
	wall0 := time.Unix(5000, 0)
	var tr recoveryTracker
	now := time.Duration(0)
	step := func(r StandbyReason, s phaseSample) *StandbyRecovery {
		now += time.Second
		s.Reason = r
		return tr.track(Readiness{Reason: r, Ready: r == StandbyReady}, s, now, wall0.Add(now))
	}
	step(StandbyNotRunning, phaseSample{PatroniState: "starting"})
	step(StandbyNotStreaming, phaseSample{PatroniState: "running", ReplayLSN: 0x3000080, Timeline: 1})
	if !tr.wantHistory(now) {
		t.Fatal("no history wanted for the own WAL end")
	}
	tr.noteHistory([]TimelineSwitch{{Timeline: 1, LSN: 0x3000060}}, now)
	rec := step(StandbyNotStreaming, phaseSample{PatroniState: "running", ReplayLSN: 0x3000100, Timeline: 1})
	if rec.OwnWALEnd == nil || rec.OwnWALEnd.LSN != 0x3000100 || rec.Diverged != nil {
		t.Fatalf("own end moved on: %+v (diverged %+v: must be read again)", rec.OwnWALEnd, rec.Diverged)
	}
	tr.noteHistory([]TimelineSwitch{{Timeline: 1, LSN: 0x3000060}}, now)
	step(StandbyNotRunning, phaseSample{PatroniState: "stopped"}) // stopped for pg_rewind
	step(StandbyNotStreaming, phaseSample{PatroniState: "running", ReplayLSN: 0x5000000, Timeline: 2})
	rec = step(StandbyReady, phaseSample{PatroniState: "running", Receiver: "streaming", ReplayLSN: 0x5000100, Timeline: 2})
	want := DivergedWAL{Timeline: 1, From: "0/3000060", To: "0/3000100", Bytes: 0xa0}
	if rec.OwnWALEnd == nil || rec.OwnWALEnd.LSN != 0x3000100 || rec.Diverged == nil || *rec.Diverged != want || rec.divergedBytes() != 0xa0 {
		t.Fatalf("done: own %+v diverged %+v, want %+v", rec.OwnWALEnd, rec.Diverged, want)
	}
	if tr.wantHistory(now) {
		t.Error("history wanted after the episode")
	}
}
