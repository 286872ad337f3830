package hosts

import (
	"strings"
	"testing"
)

// TestImageKey: the cache is reused while the package list is the same (in
// any order) and rebuilt when it changes.
func TestImageKey(t *testing.T) {
	a := DefaultImage()
	b := DefaultImage()
	b.Packages = append([]string{b.Packages[len(b.Packages)-1]}, b.Packages[:len(b.Packages)-1]...)
	if a.Key() != b.Key() {
		t.Errorf("reordered packages: key %s != %s", b.Key(), a.Key())
	}
	c := DefaultImage()
	c.Packages = append(c.Packages, "jq")
	if a.Key() == c.Key() {
		t.Errorf("an added package kept the key %s", a.Key())
	}
	d := DefaultImage()
	d.Suite = "trixie"
	if a.Key() == d.Key() || !strings.Contains(d.CacheDir(), "trixie") {
		t.Errorf("another suite: key %s, dir %s", d.Key(), d.CacheDir())
	}
	if !strings.HasPrefix(a.CacheDir(), "/var/tmp/hapair-rootfs-bookworm-") {
		t.Errorf("cache dir %s", a.CacheDir())
	}
}
