package ctl

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDurabilityLine: hung commits and a set or pending database fence, as
// roled's /role publishes them, reach the status table; a quiet node adds
// no line.
func TestDurabilityLine(t *testing.T) {
	cases := []struct {
		name, role string
		want       []string
	}{
		{"quiet", `{"node":"nodea","postgres":{"durability":"sync","commits":{"checked":true},"fence":{"state":"off","roles":["app"]}}}`, nil},
		{"older roled", `{"node":"nodea"}`, nil},
		{"hung, strict", `{"node":"nodea","postgres":{"durability":"sync-strict","commits":{"checked":true,"hung":true,"hung_for_seconds":3.2,"holds_role":true}}}`,
			[]string{"COMMITS HANG on nodea for 3.2 s (durability sync-strict), held PASSIVE"}},
		{"fence set", `{"node":"nodeb","postgres":{"fence":{"state":"set","roles":["app","worker"],"set_after_seconds":0.031}}}`,
			[]string{"db fence set on nodeb (app, worker read-only, 0.03 s after leaving ACTIVE)"}},
		{"fence pending", `{"node":"nodeb","postgres":{"fence":{"state":"pending","roles":["app"],"attempts":4,"error":"postgres connect: refused"}}}`,
			[]string{"DB FENCE PENDING on nodeb (4 attempts: postgres connect: refused)"}},
	}
	for _, tc := range cases {
		var r RoledNode
		if err := json.Unmarshal([]byte(tc.role), &r); err != nil {
			t.Fatal(err)
		}
		got := durabilityLine(r)
		if len(tc.want) == 0 && got != "" {
			t.Errorf("%s: line %q, want none", tc.name, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: line %q, want %q", tc.name, got, w)
			}
		}
	}
}
