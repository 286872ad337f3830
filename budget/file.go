package budget

import (
	"fmt"
	"time"
)

// Duration is a time.Duration written as "250ms", "2s" in JSON and YAML.
type Duration time.Duration

// MarshalText writes the duration as Go does ("1.5s").
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads "250ms", "2s".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// File is a plan as hapairctl plan --json prints it and as plan --check
// (and the Ansible play) reads it back: one section per part, each key the
// part's own configuration key, so a value can be copied as it is.
type File struct {
	Target  Duration     `json:"target,omitempty" yaml:"target,omitempty"`
	Etcd    EtcdFile     `json:"etcd" yaml:"etcd"`
	Patroni PatroniFile  `json:"patroni" yaml:"patroni"`
	Roled   RoledFile    `json:"roled" yaml:"roled"`
	LB      LBFile       `json:"lb" yaml:"lb"`
	Outages []OutageFile `json:"outages,omitempty" yaml:"outages,omitempty"`
}

// EtcdFile is hapair-witness's raft timing (witness.yaml).
type EtcdFile struct {
	HeartbeatInterval Duration `json:"heartbeat-interval" yaml:"heartbeat-interval"`
	ElectionTimeout   Duration `json:"election-timeout" yaml:"election-timeout"`
}

// PatroniFile is Patroni's dynamic configuration, in whole seconds as
// patronictl edit-config and PATCH /config take it.
type PatroniFile struct {
	TTL          int `json:"ttl" yaml:"ttl"`
	LoopWait     int `json:"loop_wait" yaml:"loop_wait"`
	RetryTimeout int `json:"retry_timeout" yaml:"retry_timeout"`
	// Version is the release the plan is for (not a Patroni setting: the
	// Ansible play reads ttl, loop_wait and retry_timeout one by one).
	Version string `json:"version,omitempty" yaml:"version,omitempty"`
}

// RoledFile is roled.yaml's timing (sync.* is its syncdir section).
type RoledFile struct {
	LeaseTTL            Duration `json:"lease-ttl" yaml:"lease-ttl"`
	SafetyMargin        Duration `json:"safety-margin" yaml:"safety-margin"`
	KeepAliveInterval   Duration `json:"keepalive-interval" yaml:"keepalive-interval"`
	RereadInterval      Duration `json:"reread-interval" yaml:"reread-interval"`
	PollInterval        Duration `json:"patroni.poll-interval" yaml:"patroni.poll-interval"`
	FastPollInterval    Duration `json:"patroni.fast-poll-interval" yaml:"patroni.fast-poll-interval"`
	PatroniTimeout      Duration `json:"patroni.timeout" yaml:"patroni.timeout"`
	PatroniTTL          Duration `json:"patroni.ttl" yaml:"patroni.ttl"`
	PostgresTimeout     Duration `json:"postgres.timeout" yaml:"postgres.timeout"`
	QuorumLossAfter     Duration `json:"quorum-loss-after" yaml:"quorum-loss-after"`
	QuorumCheckInterval Duration `json:"quorum-check-interval" yaml:"quorum-check-interval"`
	SyncRetryMin        Duration `json:"sync.retry-min" yaml:"sync.retry-min"`
	SyncRetryMax        Duration `json:"sync.retry-max" yaml:"sync.retry-max"`
}

// LBFile is lb.yaml's active-passive backend timing.
type LBFile struct {
	CheckInterval Duration `json:"check.interval" yaml:"check.interval"`
	CheckTimeout  Duration `json:"check.timeout" yaml:"check.timeout"`
	CheckFall     int      `json:"check.fall" yaml:"check.fall"`
	CheckRise     int      `json:"check.rise" yaml:"check.rise"`
	HoldTimeout   Duration `json:"hold-timeout" yaml:"hold-timeout"`
	FastPath      bool     `json:"etcd-fast-path" yaml:"etcd-fast-path"`
}

// OutageFile is one fault's arithmetic.
type OutageFile struct {
	Fault   string     `json:"fault" yaml:"fault"`
	Typical Duration   `json:"typical" yaml:"typical"`
	Worst   Duration   `json:"worst" yaml:"worst"`
	Outside string     `json:"outside,omitempty" yaml:"outside,omitempty"` // why it is not held to the target
	Steps   []StepFile `json:"steps" yaml:"steps"`
}

// StepFile is one stage of an outage.
type StepFile struct {
	Stage   string   `json:"stage" yaml:"stage"`
	Typical Duration `json:"typical" yaml:"typical"`
	Worst   Duration `json:"worst" yaml:"worst"`
	Why     string   `json:"why" yaml:"why"`
}

// FileOf is the file form of timers t with their arithmetic; target may be 0.
func FileOf(target time.Duration, t Timers) File {
	f := File{
		Target: Duration(target),
		Etcd:   EtcdFile{Duration(t.EtcdHeartbeat), Duration(t.EtcdElection)},
		Patroni: PatroniFile{TTL: int(t.PatroniTTL / time.Second), LoopWait: int(t.PatroniLoopWait / time.Second),
			RetryTimeout: int(t.PatroniRetryTimeout / time.Second), Version: t.PatroniVersion},
		Roled: RoledFile{
			LeaseTTL: Duration(t.LeaseTTL), SafetyMargin: Duration(t.SafetyMargin),
			KeepAliveInterval: Duration(t.KeepAliveInterval), RereadInterval: Duration(t.RereadInterval),
			PollInterval: Duration(t.PollInterval), FastPollInterval: Duration(t.FastPollInterval),
			PatroniTimeout: Duration(t.PatroniTimeout), PatroniTTL: Duration(t.PatroniTTL),
			PostgresTimeout: Duration(t.PostgresTimeout),
			QuorumLossAfter: Duration(t.QuorumLossAfter), QuorumCheckInterval: Duration(t.QuorumCheckInterval),
			SyncRetryMin: Duration(t.SyncRetryMin), SyncRetryMax: Duration(t.SyncRetryMax),
		},
		LB: LBFile{CheckInterval: Duration(t.CheckInterval), CheckTimeout: Duration(t.CheckTimeout),
			CheckFall: t.CheckFall, CheckRise: t.CheckRise, HoldTimeout: Duration(t.HoldTimeout), FastPath: t.FastPath},
	}
	for _, o := range Arithmetic(t) {
		of := OutageFile{Fault: o.Fault.String(), Typical: Duration(o.Typical), Worst: Duration(o.Worst), Outside: o.Outside}
		for _, s := range o.Steps {
			of.Steps = append(of.Steps, StepFile{s.Stage.String(), Duration(s.Typical), Duration(s.Worst), s.Why})
		}
		f.Outages = append(f.Outages, of)
	}
	return f
}

// File is the plan's file form.
func (p Plan) File() File { return FileOf(p.Target, p.Timers) }

// Timers reads the file's timers back, naming each field by its section
// ("roled lease-ttl") prefixed with from (a file name; may be empty).
// roled's patroni.ttl, when set, must equal Patroni's ttl: it is roled's
// copy of the same value.
func (f File) Timers(from string) (Timers, error) {
	pre := from
	if pre != "" {
		pre += ": "
	}
	t := Timers{
		EtcdHeartbeat: time.Duration(f.Etcd.HeartbeatInterval), EtcdElection: time.Duration(f.Etcd.ElectionTimeout),
		PatroniTTL:          time.Duration(f.Patroni.TTL) * time.Second,
		PatroniLoopWait:     time.Duration(f.Patroni.LoopWait) * time.Second,
		PatroniRetryTimeout: time.Duration(f.Patroni.RetryTimeout) * time.Second,
		PatroniVersion:      f.Patroni.Version,
		LeaseTTL:            time.Duration(f.Roled.LeaseTTL), SafetyMargin: time.Duration(f.Roled.SafetyMargin),
		KeepAliveInterval: time.Duration(f.Roled.KeepAliveInterval), RereadInterval: time.Duration(f.Roled.RereadInterval),
		PollInterval: time.Duration(f.Roled.PollInterval), FastPollInterval: time.Duration(f.Roled.FastPollInterval),
		PatroniTimeout: time.Duration(f.Roled.PatroniTimeout), PostgresTimeout: time.Duration(f.Roled.PostgresTimeout),
		QuorumLossAfter: time.Duration(f.Roled.QuorumLossAfter), QuorumCheckInterval: time.Duration(f.Roled.QuorumCheckInterval),
		SyncRetryMin: time.Duration(f.Roled.SyncRetryMin), SyncRetryMax: time.Duration(f.Roled.SyncRetryMax),
		CheckInterval: time.Duration(f.LB.CheckInterval), CheckTimeout: time.Duration(f.LB.CheckTimeout),
		CheckFall: f.LB.CheckFall, CheckRise: f.LB.CheckRise, HoldTimeout: time.Duration(f.LB.HoldTimeout),
		FastPath: f.LB.FastPath,
		Names:    map[Key]string{},
	}
	for k := Key(0); k < numKeys; k++ {
		section := map[Key]string{EtcdHeartbeat: "etcd", EtcdElection: "etcd", PatroniTTL: "patroni",
			PatroniLoopWait: "patroni", PatroniRetryTimeout: "patroni", CheckInterval: "lb", CheckTimeout: "lb",
			CheckFall: "lb", CheckRise: "lb", HoldTimeout: "lb"}[k]
		if section == "" {
			section = "roled"
		}
		t.Names[k] = pre + section + "." + k.String()
	}
	if t.PatroniVersion != "" {
		if _, err := FloorsFor(t.PatroniVersion); err != nil {
			return t, fmt.Errorf("%spatroni.version: %w", pre, err)
		}
	}
	if rt := time.Duration(f.Roled.PatroniTTL); rt != 0 && t.PatroniTTL != 0 && rt != t.PatroniTTL {
		return t, t.violation(RuleLeaseBelowTTL, PatroniTTL, rt, "roled's patroni.ttl (%s) differs from Patroni's ttl (%s)", rt, t.PatroniTTL).Err
	}
	if t.PatroniTTL == 0 {
		t.PatroniTTL = time.Duration(f.Roled.PatroniTTL)
	}
	return t, nil
}

// String is a short summary for logs.
func (f File) String() string {
	return fmt.Sprintf("ttl %ds loop_wait %ds retry_timeout %ds lease %s", f.Patroni.TTL, f.Patroni.LoopWait,
		f.Patroni.RetryTimeout, time.Duration(f.Roled.LeaseTTL))
}
