package config

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/etcdtest"
)

// A client whose member was away for 45 s answers again within a second or
// so of the member's return (reconnectBackoff: measured 0.84 s), not after
// gRPC's default backoff (by then 21–32 s between attempts; 11.8 s after a
// 30 s absence). The bound, 9 s, is 10 × the measured figure and still far
// below what the default backoff gives.
func TestClientReconnectsSoonAfterItsMemberReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("45 s with a member away; skipped with -short")
	}
	c := etcdtest.New(t, etcdtest.WithSize(1))
	cli, err := Etcd{Endpoints: []string{c.Member(0).Endpoint()}, DialTimeout: 2 * time.Second}.NewClient(zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	get := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := cli.Get(ctx, "k", clientv3.WithSerializable(), clientv3.WithCountOnly())
		return err
	}
	if err := get(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.Stop(0)
	for away := time.Now(); time.Since(away) < 45*time.Second; {
		if get(800*time.Millisecond) == nil {
			t.Fatal("a read succeeded while the member was stopped")
		}
	}
	c.Restart(0)
	back := time.Now()
	for get(800*time.Millisecond) != nil {
		if time.Since(back) > 60*time.Second {
			t.Fatal("no answer 60 s after the member's return")
		}
	}
	took := time.Since(back)
	t.Logf("first answer %s after the member's return", took.Round(time.Millisecond))
	if took > 9*time.Second {
		t.Errorf("first answer %s after the member's return, want within 9 s", took.Round(time.Millisecond))
	}
}
