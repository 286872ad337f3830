package lab

import (
	"testing"
	"time"
)

func TestParseJitter(t *testing.T) {
	for _, tc := range []struct {
		loss, delay string
		want        JitterOptions
		bad         bool
	}{
		{"1%", "20ms±10ms", JitterOptions{Loss: 0.01, Delay: 20 * time.Millisecond, Jitter: 10 * time.Millisecond}, false},
		{"0.02", "20ms+-5ms", JitterOptions{Loss: 0.02, Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond}, false},
		{"", "30ms", JitterOptions{Delay: 30 * time.Millisecond}, false},
		{"100%", "", JitterOptions{}, true},
		{"x", "", JitterOptions{}, true},
		{"", "20ms±30ms", JitterOptions{}, true},
		{"", "soon", JitterOptions{}, true},
	} {
		got, err := ParseJitter(tc.loss, tc.delay)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseJitter(%q, %q) accepted", tc.loss, tc.delay)
			}
			continue
		}
		got.StressEvery, got.StressFor = 0, 0
		if err != nil || got != tc.want {
			t.Errorf("ParseJitter(%q, %q) = %+v, %v; want %+v", tc.loss, tc.delay, got, err, tc.want)
		}
	}
}
