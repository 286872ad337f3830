package roled

import "time"

// The standby's recovery timeline: how long a returning node spent in each
// phase from the moment it stopped being ready (or its roled started, after
// a kill) until it was ready again. The PASSIVE roled keeps it from its own
// readiness reasons and publishes it in /role and its heartbeat; the ACTIVE's
// roled copies it into the history event when the standby is ready.

// StandbyPhase groups the not-ready reasons by what the returning node is
// doing.
type StandbyPhase string

// The phases, in the order a returning node usually goes through them.
const (
	// PhaseStart: Patroni and PostgreSQL starting (crash recovery included),
	// before any sign of a divergence.
	PhaseStart StandbyPhase = "start"
	// PhaseRewind: its timeline diverged from the leader's: no WAL receiver
	// can stream (or another timeline or sender), Patroni stopping
	// PostgreSQL for pg_rewind, running it and starting it again.
	PhaseRewind StandbyPhase = "rewind"
	// PhaseWALCatchup: a WAL receiver runs but does not stream yet, or
	// replay lags beyond the readiness bounds.
	PhaseWALCatchup StandbyPhase = "wal_catchup"
	// PhaseFileSync: the database is ready, the files are not (receiver,
	// sender, sync lag, quarantine).
	PhaseFileSync StandbyPhase = "file_sync"
	// PhaseWaiting: nothing the standby can do: no Patroni leader, the
	// leader's member key unknown, etcd view stale, tagged nofailover.
	PhaseWaiting StandbyPhase = "waiting"
)

// phaseSample is what standbyPhase looks at: the reason and the two facts
// the reason alone does not carry.
type phaseSample struct {
	Reason       StandbyReason
	PatroniState string // Patroni's state ("running", "stopped", "starting"…)
	Receiver     string // pg_stat_wal_receiver.status, "" when none runs
	// For the node's own WAL end before a rewind (not used by
	// standbyPhase): pg_last_wal_replay_lsn() and Patroni's timeline (a
	// replica's own, from IDENTIFY_SYSTEM).
	ReplayLSN int64
	Timeline  int64
}

// phaseMemory is what standbyPhase remembers within one not-ready episode.
type phaseMemory struct {
	Ran     bool // Patroni reported PostgreSQL running in this episode
	Rewound bool // a divergence was seen: later restarts belong to the rewind
}

// standbyPhase maps one readiness sample to its phase (pure). relabel is
// true when this sample shows, in hindsight, that the WAL catch-up counted
// since Patroni first ran was the wait for a rewind: Patroni 3.0.2 starts a
// diverged former primary as a `running` replica whose receiver fails, then
// stops it to run pg_rewind.
//
// Limits (README, "Failover history"): a rewind Patroni runs before it ever
// starts PostgreSQL (found in pg_controldata) counts as start; a healthy
// replica's first instant without a WAL receiver counts as rewind.
func standbyPhase(s phaseSample, m phaseMemory) (p StandbyPhase, next phaseMemory, relabel bool) {
	running := s.PatroniState == "running" || s.PatroniState == "streaming"
	next = m
	switch s.Reason {
	case StandbySyncReceiver, StandbyQuarantine, StandbySyncUnknown, StandbySyncLag:
		p, next.Rewound = PhaseFileSync, false
	case StandbyLagBytes, StandbyLagTime:
		p, next.Rewound = PhaseWALCatchup, false
	case StandbyTimeline, StandbyWrongSender:
		p, next.Rewound = PhaseRewind, true
	case StandbyNotStreaming:
		if s.Receiver == "" {
			p, next.Rewound = PhaseRewind, true
		} else {
			p = PhaseWALCatchup
		}
	case StandbyNotRunning:
		if !running && m.Ran && !m.Rewound {
			next.Rewound, relabel = true, true // stopped after running, not yet streaming: for pg_rewind
		}
		p = PhaseStart
		if next.Rewound {
			p = PhaseRewind
		}
	case StandbyPatroniDown, StandbyPostgresDown, StandbyNotInRecovery, StandbyNotReplica, StandbyPendingRestart:
		p = PhaseStart
		if m.Rewound {
			p = PhaseRewind
		}
	default: // etcd, leader, member key, nofailover, unchecked
		p = PhaseWaiting
	}
	// Ran counts PostgreSQL running as a replica only: a demoted primary
	// still runs as one until Patroni stops it to restart it as a replica,
	// and that stop is a demotion, not a stop for pg_rewind.
	if running && s.Reason != StandbyNotReplica && s.Reason != StandbyNotInRecovery && s.Reason != StandbyIsLeader {
		next.Ran = true
	}
	return p, next, relabel
}

// PhaseSplit is the time spent per phase, in seconds.
type PhaseSplit struct {
	Start      float64 `json:"start_seconds"`
	Rewind     float64 `json:"rewind_seconds"`
	WALCatchup float64 `json:"wal_catchup_seconds"`
	FileSync   float64 `json:"file_sync_seconds"`
	Waiting    float64 `json:"waiting_seconds"`
}

func (s *PhaseSplit) add(p StandbyPhase, secs float64) {
	switch p {
	case PhaseStart:
		s.Start += secs
	case PhaseRewind:
		s.Rewind += secs
	case PhaseWALCatchup:
		s.WALCatchup += secs
	case PhaseFileSync:
		s.FileSync += secs
	case PhaseWaiting:
		s.Waiting += secs
	}
}

// StandbyRecovery is one not-ready episode of the standby: in progress
// (ReadyAt zero) or the last one completed.
type StandbyRecovery struct {
	// Started: the first not-ready evaluation (after a kill: roled's own
	// start, a few hundred ms after the node's).
	Started time.Time    `json:"started"`
	ReadyAt time.Time    `json:"ready_at,omitzero"`
	Seconds float64      `json:"seconds"`         // Started → ReadyAt (or → now, in progress)
	Phase   StandbyPhase `json:"phase,omitempty"` // current phase, in progress only
	Phases  PhaseSplit   `json:"phases"`
	// OwnWALEnd: the highest replay position PostgreSQL reached in this
	// episode while it ran without streaming and before Patroni stopped it
	// for pg_rewind: a returning former primary's own WAL end, which the
	// rewind then throws away. Diverged: that end against where its
	// timeline ends in the cluster's history (Patroni GET /history), the
	// WAL this node had that the leader's timeline does not.
	OwnWALEnd *WALPosition `json:"own_wal_end,omitempty"`
	Diverged  *DivergedWAL `json:"diverged,omitempty"`
}

// DivergedWAL is WAL a node has on its own timeline beyond the point where
// that timeline ends in the cluster's history: written after the other node
// was promoted, lost to the rewind.
type DivergedWAL struct {
	Timeline int64  `json:"timeline"`
	From     string `json:"from"` // where the timeline ends on the leader's history
	To       string `json:"to"`   // this node's own WAL end
	Bytes    int64  `json:"bytes"`
}

// divergedRange compares a node's own WAL end with the cluster's timeline
// history (pure); nil while the history has no line for its timeline (it is
// the newest: nothing diverged, or the history is not written yet).
func divergedRange(own WALPosition, hist []TimelineSwitch) *DivergedWAL {
	for _, s := range hist {
		if s.Timeline == own.Timeline {
			return &DivergedWAL{Timeline: own.Timeline, From: FormatLSN(s.LSN), To: FormatLSN(own.LSN), Bytes: max(0, own.LSN-s.LSN)}
		}
	}
	return nil
}

// recoveryTracker folds readiness evaluations into the episode; owned by the
// poll goroutine.
type recoveryTracker struct {
	on        bool
	started   time.Time
	startedAt time.Duration
	lastAt    time.Duration
	phase     StandbyPhase
	mem       phaseMemory
	split     PhaseSplit
	catchup   float64 // WAL catch-up counted since Patroni first ran (relabel)
	done      *StandbyRecovery
	stopped   bool         // Patroni stopped PostgreSQL after it ran: own WAL end final
	own       *WALPosition // see StandbyRecovery.OwnWALEnd
	diverged  *DivergedWAL
	histAt    time.Duration // when the history was last asked for own
}

// wantHistory says whether the cluster's timeline history should be read
// now for the diverged range (at most every 2 s, until found).
func (t *recoveryTracker) wantHistory(now time.Duration) bool {
	return t.on && t.own != nil && t.diverged == nil && (t.histAt == 0 || now-t.histAt >= 2*time.Second)
}

// noteHistory folds in the cluster's timeline history read at now.
func (t *recoveryTracker) noteHistory(h []TimelineSwitch, now time.Duration) {
	t.histAt = now
	if t.own != nil {
		t.diverged = divergedRange(*t.own, h)
	}
}

// track folds one evaluation in and returns what to publish: the episode in
// progress, the last completed one while ready, nil while ACTIVE.
func (t *recoveryTracker) track(r Readiness, s phaseSample, now time.Duration, wall time.Time) *StandbyRecovery {
	if r.Reason == StandbyIsActive {
		*t = recoveryTracker{}
		return nil
	}
	if t.on {
		dt := (now - t.lastAt).Seconds()
		t.split.add(t.phase, dt)
		if t.phase == PhaseWALCatchup && t.mem.Ran {
			t.catchup += dt
		}
	}
	if r.Ready {
		if t.on || t.done == nil {
			rec := &StandbyRecovery{Started: t.started, ReadyAt: wall, Seconds: (now - t.startedAt).Seconds(), Phases: t.split,
				OwnWALEnd: t.own, Diverged: t.diverged}
			if !t.on {
				rec.Started, rec.Seconds = wall, 0
			}
			t.done, t.on = rec, false
		}
		return t.done
	}
	if !t.on {
		*t = recoveryTracker{on: true, started: wall, startedAt: now}
	}
	p, mem, relabel := standbyPhase(s, t.mem)
	if relabel {
		t.split.WALCatchup -= t.catchup
		t.split.Rewind += t.catchup
		t.catchup = 0
	}
	running := s.PatroniState == "running" || s.PatroniState == "streaming"
	if relabel || (t.mem.Ran && !running && s.Reason == StandbyNotRunning) {
		t.stopped = true
	}
	if running && !t.stopped && s.Receiver != "streaming" && s.ReplayLSN > 0 && s.Timeline > 0 &&
		(t.own == nil || s.ReplayLSN > t.own.LSN || s.Timeline != t.own.Timeline) {
		t.own, t.diverged, t.histAt = &WALPosition{LSN: s.ReplayLSN, Timeline: s.Timeline, At: wall}, nil, 0
	}
	t.phase, t.mem, t.lastAt = p, mem, now
	return &StandbyRecovery{Started: t.started, Seconds: (now - t.startedAt).Seconds(), Phase: p, Phases: t.split,
		OwnWALEnd: t.own, Diverged: t.diverged}
}

// divergedBytes is the diverged WAL of the episode, 0 when none is known.
func (r *StandbyRecovery) divergedBytes() int64 {
	if r == nil || r.Diverged == nil {
		return 0
	}
	return r.Diverged.Bytes
}
