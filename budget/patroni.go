package budget

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultPatroni is the Patroni release a plan is for when none is given:
// Debian 12's, the one the lab and the deployment tests run.
const DefaultPatroni = "3.0.2"

// PatroniFloors are the least ttl, loop_wait and retry_timeout a Patroni
// release runs with.
type PatroniFloors struct {
	Release  string        // the version they are for ("3.0.2")
	TTL      time.Duration // least ttl
	LoopWait time.Duration // least loop_wait
	Retry    time.Duration // least retry_timeout
	// Raises: the release runs a lower value at the floor instead, saying
	// so in its own log. GET /config shows the raised value only where
	// such a release bootstrapped the cluster; a value set later (PATCH
	// /config, patronictl edit-config: how a budget changes on a running
	// cluster) is shown as set and run raised.
	Raises bool
}

// raisingRelease is the first Patroni that raises low timers: 3.2.0,
// patroni/config.py _validate_and_adjust_timeouts (commit 9283ebda,
// "Enforce loop_wait/retry_timeout/ttl rule (#2869)"): ttl below 20 s runs
// as 20 s, retry_timeout below 3 s as 3 s, and loop_wait is cut until
// loop_wait + 2 × retry_timeout ≤ ttl. Its code, given 5/1/2, runs 20/1/3;
// given hapair's defaults 10/2/3, 20/2/3.
var raisingRelease = [3]int{3, 2, 0}

// FloorsFor returns the floors of Patroni release version ("3.0.2",
// "v3.2.2", "patroni 4.0.4"). Before 3.2.0 the floors are hapair's own
// rules (RulePatroniRetry, RulePatroniLoop): retry_timeout 2 s, loop_wait
// 1 s, so ttl 5 s.
func FloorsFor(version string) (PatroniFloors, error) {
	v, err := parseRelease(version)
	if err != nil {
		return PatroniFloors{}, err
	}
	f := PatroniFloors{Release: fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]), TTL: minTTL, LoopWait: time.Second, Retry: minRetry}
	if !releaseBefore(v, raisingRelease) {
		f.TTL, f.Retry, f.Raises = 20*time.Second, 3*time.Second, true
	}
	return f, nil
}

// parseRelease reads the first word of s that is "X.Y[.Z]" (after an
// optional "v"): `patroni --version` prints "patroni 3.0.2".
func parseRelease(s string) ([3]int, error) {
	bad := fmt.Errorf("patroni version %q: want X.Y.Z", s)
	for _, w := range strings.Fields(s) {
		w = strings.TrimPrefix(w, "v")
		if w == "" || w[0] < '0' || w[0] > '9' {
			continue
		}
		parts := strings.Split(w, ".")
		if len(parts) < 2 || len(parts) > 3 {
			return [3]int{}, bad
		}
		var v [3]int
		for i, p := range parts {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 {
				return [3]int{}, bad
			}
			v[i] = n
		}
		return v, nil
	}
	return [3]int{}, bad
}

func releaseBefore(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// Running is t as its Patroni release runs it: ttl and retry_timeout
// raised to the release's floors (the arithmetic speaks of those).
func (t Timers) Running() Timers {
	f, err := FloorsFor(t.PatroniVersion)
	if t.PatroniVersion == "" || err != nil || !f.Raises {
		return t
	}
	t.PatroniTTL = max(t.PatroniTTL, f.TTL)
	t.PatroniRetryTimeout = max(t.PatroniRetryTimeout, f.Retry)
	return t
}

// floorViolations are the timers a release would raise (RulePatroniFloor).
func (t Timers) floorViolations() []*Violation {
	if t.PatroniVersion == "" {
		return nil
	}
	f, err := FloorsFor(t.PatroniVersion)
	if err != nil || !f.Raises { // the version was checked where it was read

		return nil
	}
	var out []*Violation
	for _, c := range []struct {
		k     Key
		floor time.Duration
	}{{PatroniTTL, f.TTL}, {PatroniRetryTimeout, f.Retry}, {PatroniLoopWait, f.LoopWait}} {
		if d, ok := t.get(c.k); ok && d < c.floor {
			out = append(out, t.violation(RulePatroniFloor, c.k, d,
				"Patroni %s runs %s below %s as %s, saying so only in its own log: the budget's arithmetic would not hold; hapairctl plan --patroni %s derives timers it keeps",
				f.Release, c.k, c.floor, c.floor, f.Release))
		}
	}
	return out
}
