package lab

import (
	"testing"
	"time"

	"github.com/hapair/hapair/ctl"
)

func TestSteady(t *testing.T) {
	t0 := time.Now()
	w := func(ok bool, took time.Duration) ctl.Sample {
		return ctl.Sample{OK: ok, Start: t0, End: t0.Add(took)}
	}
	fast, slow := 5*time.Millisecond, 400*time.Millisecond
	cases := []struct {
		name string
		in   []ctl.Sample
		want bool
	}{
		{"too few", []ctl.Sample{w(true, fast)}, false},
		{"last four fast", []ctl.Sample{w(true, slow), w(true, fast), w(true, fast), w(true, fast), w(true, fast)}, true},
		{"a slow one among the last four", []ctl.Sample{w(true, fast), w(true, slow), w(true, fast), w(true, fast)}, false},
		{"a failed one among the last four", []ctl.Sample{w(true, fast), w(true, fast), w(false, fast), w(true, fast)}, false},
	}
	for _, c := range cases {
		if got := steady(c.in, 4, 100*time.Millisecond); got != c.want {
			t.Errorf("%s: steady = %v, want %v", c.name, got, c.want)
		}
	}
}
