package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// keepalived itself checks the lab's VRRP configuration (keepalived -t),
// for both nodes and both balancers of the pair.
func TestKeepalivedConfigParses(t *testing.T) {
	bin, err := exec.LookPath("keepalived")
	if err != nil {
		t.Skip("keepalived not installed (Debian package keepalived)")
	}
	dir := t.TempDir()
	confs := map[string]string{LB: keepalivedLBConfig(LB), LB2: keepalivedLBConfig(LB2)}
	for _, h := range DataNodes {
		confs[h] = keepalivedConfig(h, "/usr/bin/true")
	}
	for h, conf := range confs {
		path := filepath.Join(dir, h+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-t", "-f", path).CombinedOutput()
		if err != nil {
			t.Errorf("%s: keepalived -t: %v\n%s", h, err, out)
		}
	}
}

func TestVIPPeerOption(t *testing.T) {
	if _, err := NewLab(Options{VIPPeer: "vrrpd", SelfExe: "/x"}, nil); err == nil || !strings.Contains(err.Error(), "vip peer") {
		t.Errorf("unknown peer: err %v, want one naming the vip peer", err)
	}
	l, err := NewLab(Options{VIPPeer: VIPPeerKeepalived, SelfExe: "/x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Opt.VIP {
		t.Errorf("vip peer keepalived without VIP")
	}
}
