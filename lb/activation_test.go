package lb

import (
	"net"
	"testing"
)

// TestSameAddr: a passed socket matches the configured address when port and
// host agree, any unspecified host matching any other.
func TestSameAddr(t *testing.T) {
	for _, tc := range []struct {
		bound string
		want  string
		same  bool
	}{
		{"127.0.0.1:80", "127.0.0.1:80", true},
		{"0.0.0.0:80", ":80", true},
		{"0.0.0.0:80", "0.0.0.0:80", true},
		{"[::]:80", "0.0.0.0:80", true},
		{"127.0.0.1:80", "127.0.0.1:81", false},
		{"127.0.0.1:80", "10.0.0.1:80", false},
		{"0.0.0.0:80", "127.0.0.1:80", false},
		{"127.0.0.1:80", "not an address", false},
	} {
		a, err := net.ResolveTCPAddr("tcp", tc.bound)
		if err != nil {
			t.Fatal(err)
		}
		if got := sameAddr(a, tc.want); got != tc.same {
			t.Errorf("sameAddr(%s, %q) = %v, want %v", tc.bound, tc.want, got, tc.same)
		}
	}
}
