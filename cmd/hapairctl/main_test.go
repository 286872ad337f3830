package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/roled"
)

func runCtl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), &env{stdout: &out, stderr: &errb}, args)
	return code, out.String(), errb.String()
}

func TestCheck(t *testing.T) {
	role := "active"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/role" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(roled.Status{Node: "A", Role: role, Epoch: 42, Reason: "primary"})
	}))
	defer srv.Close()
	if code, out, _ := runCtl(t, "check", "--url", srv.URL); code != 0 || !strings.Contains(out, "epoch 42") {
		t.Fatalf("active: exit %d, out %q", code, out)
	}
	role = "passive"
	if code, _, _ := runCtl(t, "check", "--url", srv.URL, "-q"); code != 1 {
		t.Fatalf("passive: exit %d, want 1", code)
	}
	srv.Close()
	code, _, errs := runCtl(t, "check", "--url", srv.URL)
	if code != 1 || !strings.Contains(errs, "cannot reach roled") {
		t.Fatalf("unreachable: exit %d, stderr %q", code, errs)
	}
	if code, _, _ := runCtl(t, "nosuch"); code != 2 {
		t.Fatalf("unknown command: exit %d, want 2", code)
	}
}

// TestConfigSections checks that ctl.yaml may hold other subcommands'
// sections next to the keys check and ack use.
func TestConfigSections(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ctl.yaml")
	doc := "cluster: prod\netcd: {endpoints: [\"http://10.0.0.1:2379\"]}\nlb: {admin: \"http://127.0.0.1:7480\"}\n"
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	f := ctlFlags{path: p}
	cfg, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.prefix() != "/hapair/prod/" || cfg.Etcd.Endpoints[0] != "http://10.0.0.1:2379" {
		t.Fatalf("cfg = %+v", cfg)
	}
	var lb struct {
		Admin string `yaml:"admin"`
	}
	if err := cfg.Section("lb", &lb); err != nil || lb.Admin != "http://127.0.0.1:7480" {
		t.Fatalf("lb section = %+v, %v", lb, err)
	}
}

func TestAck(t *testing.T) {
	if testing.Short() {
		t.Skip("real etcd; skipped with -short")
	}
	c := etcdtest.New(t)
	cli := c.Client(t)
	eps := strings.Join(c.Endpoints(), ",")
	if code, _, errs := runCtl(t, "ack", "--endpoints", eps, "--node", "A"); code != 1 || !strings.Contains(errs, "no unacknowledged") {
		t.Fatalf("no alarm: exit %d, stderr %q", code, errs)
	}
	a := roled.TakeoverAlarm{Member: "A", PreviousValue: "B", LeaderKey: "/service/hapair/leader",
		CreateRevision: 32, ModRevision: 67, Version: 2, DetectedBy: "B", DetectedAt: time.Now()}
	b, _ := json.Marshal(a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := roled.AlarmPrefix(roled.Prefix("hapair")) + "A"
	if _, err := cli.Put(ctx, key, string(b)); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCtl(t, "ack", "--endpoints", eps, "--node", "A")
	if code != 0 || !strings.Contains(out, "A took Patroni's leader key from B") {
		t.Fatalf("ack: exit %d, out %q, stderr %q", code, out, errs)
	}
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("alarm key after ack: %v", err)
	}
	var got roled.TakeoverAlarm
	if err := json.Unmarshal(resp.Kvs[0].Value, &got); err != nil || !got.Acked || got.AckedBy == "" {
		t.Fatalf("alarm after ack = %+v (%v)", got, err)
	}
	if code, _, _ := runCtl(t, "ack", "--endpoints", eps); code != 1 {
		t.Fatalf("second ack: exit %d, want 1 (nothing left)", code)
	}
}

// The drill kills nodes: without --yes it asks, and anything but "yes" (or
// no terminal at all) stops it before any command runs.
func TestDrillAsksFirst(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "stopped")
	p := filepath.Join(dir, "ctl.yaml")
	cfg := "nodes:\n" +
		"  - {name: a, patroni-url: \"http://127.0.0.1:1\", stop-command: \"touch " + marker + "\", start-command: \"true\"}\n" +
		"  - {name: b, patroni-url: \"http://127.0.0.1:1\", stop-command: \"touch " + marker + "\", start-command: \"true\"}\n"
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, stdin := range []io.Reader{nil, strings.NewReader("no\n"), strings.NewReader("y\n")} {
		var out bytes.Buffer
		code := run(context.Background(), &env{stdin: stdin, stdout: &out, stderr: &out}, []string{"drill", "--config", p})
		if code != 1 || !strings.Contains(out.String(), "not confirmed") {
			t.Errorf("stdin %v: exit %d, %q", stdin, code, out.String())
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a stop command ran without confirmation")
	}
}

// TestCheckConfig: --check-config accepts a good ctl.yaml, and a bad one
// exits 2 naming the field (Ansible's validate: relies on both).
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	doc := "cluster: hapair\netcd: {endpoints: [\"http://127.0.0.1:2379\"]}\n" +
		"nodes:\n  - {name: A, patroni-url: \"http://127.0.0.1:8008\", roled-url: \"http://127.0.0.1:7400\"}\n"
	if err := os.WriteFile(good, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCtl(t, "--config", good, "--check-config"); code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("good file: exit %d, out %q, err %q", code, out, errs)
	}
	if code, _, _ := runCtl(t, "-t", "--config", good); code != 0 {
		t.Fatalf("-t: exit %d", code)
	}
	for name, body := range map[string]string{
		"nodes[0].patroni-url": "cluster: hapair\nnodes:\n  - {name: A, patroni-url: \"ftp://x\"}\n",
		"nosuch":               "cluster: hapair\nnosuch: 1\n",
		"cluster":              "cluster: \"\"\n",
	} {
		p := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, errs := runCtl(t, "--config", p, "--check-config")
		if code != 2 || !strings.Contains(errs, name) {
			t.Errorf("bad %s: exit %d, stderr %q (want 2 naming the field)", name, code, errs)
		}
	}
	if code, _, _ := runCtl(t, "--config", good); code != 2 {
		t.Errorf("--config without --check-config: exit %d, want 2 (usage)", code)
	}
	if code, _, _ := runCtl(t, "--check-config", "--config", filepath.Join(dir, "missing.yaml")); code != 2 {
		t.Errorf("missing file: exit %d, want 2", code)
	}
}
