package roled

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestNotePatroniRelease: a Patroni release that raises a low ttl (3.2.0
// and later run ttl < 20 s as 20 s, while /config shows the value set) is
// named in the log once, and the metric says the ttl it runs.
func TestNotePatroniRelease(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ttl      time.Duration
		versions []string
		runs     float64 // seconds
		errors   int
	}{
		{"3.0.2 runs ttl 5 s", 5 * time.Second, []string{"3.0.2", "3.0.2"}, 5, 0},
		{"3.2.2 raises ttl 5 s", 5 * time.Second, []string{"3.2.2", "3.2.2", "3.2.2"}, 20, 1},
		{"4.0.4 raises hapair's default 10 s", 10 * time.Second, []string{"4.0.4"}, 20, 1},
		{"3.2.2 keeps ttl 30 s", 30 * time.Second, []string{"3.2.2"}, 30, 0},
		{"an upgrade under a running roled", 5 * time.Second, []string{"3.0.2", "3.2.2", "3.2.2"}, 20, 1},
		{"no version yet", 5 * time.Second, []string{""}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			d := &Daemon{lg: zap.New(core), m: NewMetrics(prometheus.NewRegistry()), ttlChecked: tc.ttl}
			for _, v := range tc.versions {
				d.notePatroniRelease(v)
			}
			if got := testutil.ToFloat64(d.m.patroniTTL.WithLabelValues("release")); got != tc.runs {
				t.Errorf("hapair_roled_patroni_ttl_seconds{source=release} = %v, want %v", got, tc.runs)
			}
			if got, want := testutil.ToFloat64(d.m.patroniTTL.WithLabelValues("config")), tc.ttl.Seconds(); tc.runs != 0 && got != want {
				t.Errorf("hapair_roled_patroni_ttl_seconds{source=config} = %v, want %v", got, want)
			}
			if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != tc.errors {
				t.Errorf("%d errors logged, want %d: %v", n, tc.errors, logs.All())
			}
		})
	}
}
