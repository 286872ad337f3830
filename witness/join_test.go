package witness

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
)

func TestPlanJoin(t *testing.T) {
	self := []string{"https://10.0.0.3:2380"}
	a := &etcdserverpb.Member{ID: 1, Name: "nodeA", PeerURLs: []string{"https://10.0.0.1:2380"}}
	b := &etcdserverpb.Member{ID: 2, Name: "nodeB", PeerURLs: []string{"https://10.0.0.2:2380"}}
	cases := []struct {
		name    string
		members []*etcdserverpb.Member
		wantID  uint64
		wantAdd bool
		wantErr string
	}{
		{"fresh", []*etcdserverpb.Member{a, b}, 0, true, ""},
		{"added before a crash", []*etcdserverpb.Member{a, b, {ID: 3, PeerURLs: self}}, 3, false, ""},
		{"name taken with another URL", []*etcdserverpb.Member{a, b, {ID: 3, Name: "witness", PeerURLs: []string{"https://10.0.0.9:2380"}}}, 0, false, "already exists"},
		{"started before, data lost", []*etcdserverpb.Member{a, b, {ID: 3, Name: "witness", PeerURLs: self}}, 0, false, "data-dir is empty"},
		{"URL used by another member", []*etcdserverpb.Member{a, {ID: 2, Name: "nodeB", PeerURLs: self}}, 0, false, "overlap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, add, err := planJoin(tc.members, "witness", self)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || id != tc.wantID || add != tc.wantAdd {
				t.Fatalf("planJoin = %d, %v, %v; want %d, %v, nil", id, add, err, tc.wantID, tc.wantAdd)
			}
		})
	}
}

func TestInitialClusterFor(t *testing.T) {
	members := []*etcdserverpb.Member{
		{ID: 1, Name: "nodeA", PeerURLs: []string{"https://10.0.0.1:2380"}},
		{ID: 0xab, PeerURLs: []string{"https://10.0.0.4:2380"}},
		{ID: 3, PeerURLs: []string{"https://10.0.0.3:2380"}},
	}
	got := initialClusterFor(members, 3, "witness")
	want := "nodeA=https://10.0.0.1:2380,unstarted-ab=https://10.0.0.4:2380,witness=https://10.0.0.3:2380"
	if got != want {
		t.Fatalf("initialClusterFor = %q, want %q", got, want)
	}
}
