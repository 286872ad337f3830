package witness

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics follow hapair_<part>_<what>_<unit> and counters end in _total.
// (promtool check metrics on a live /metrics is in bench/witness.)
func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) < 6 {
		t.Fatalf("gathered %d families, want at least 6", len(mfs))
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "hapair_witness_") {
			t.Errorf("%s: want prefix hapair_witness_", name)
		}
		if counter := mf.GetType().String() == "COUNTER"; counter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s: counters, and only counters, end in _total", name)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help", name)
		}
	}
}
