package witness

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// soloConfig is a single-member cluster on loopback with fast raft timing.
func soloConfig(t *testing.T) Config {
	t.Helper()
	peer, client := "http://"+freeAddr(t), "http://"+freeAddr(t)
	cfg := DefaultConfig()
	cfg.Name, cfg.Role, cfg.Insecure = "solo", RoleMember, true
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.ListenPeerURLs, cfg.AdvertisePeerURLs = []string{peer}, []string{peer}
	cfg.ListenClientURLs, cfg.AdvertiseClientURLs = []string{client}, []string{client}
	cfg.InitialCluster = []string{"solo=" + peer}
	cfg.HeartbeatInterval, cfg.ElectionTimeout = 20*time.Millisecond, 200*time.Millisecond
	return cfg
}

// A single-member cluster in-process: Ready closes, the metrics listener
// serves etcd's /health and both registries, Close stops Run, and a second
// Run restarts the member from its data dir.
func TestMemberRunReadyClose(t *testing.T) {
	cfg := soloConfig(t)
	cfg.MetricsListen = freeAddr(t)
	cfg.CheckInterval = 100 * time.Millisecond

	for run := 1; run <= 2; run++ { // the second run restarts from the data dir
		m, err := New(cfg, zaptest.NewLogger(t).Named(fmt.Sprint("run", run)), NewMetrics(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- m.Run(context.Background()) }()
		select {
		case <-m.Ready():
		case err := <-errc:
			t.Fatalf("run %d: Run returned before ready: %v", run, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("run %d: not ready within 20s", run)
		}
		body := get(t, "http://"+cfg.MetricsListen+"/health")
		if !strings.Contains(body, `"health":"true"`) {
			t.Fatalf("run %d: /health = %s", run, body)
		}
		metrics := get(t, "http://"+cfg.MetricsListen+"/metrics")
		for _, want := range []string{"hapair_witness_ready 1", "etcd_server_has_leader 1"} {
			if !strings.Contains(metrics, want) {
				t.Fatalf("run %d: /metrics lacks %q", run, want)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("run %d: Run after Close = %v, want nil", run, err)
		}
		if ok, _ := hasMemberData(cfg.DataDir); !ok {
			t.Fatalf("run %d: no member data after a run", run)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
