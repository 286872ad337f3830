package hosts

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestInheritedDescriptorsNotPassedOn: a descriptor this process got
// without close-on-exec (like the heavy lock of `flock FILE go test`) does
// not reach the containers it starts (a kept run held the lock).
func TestInheritedDescriptorsNotPassedOn(t *testing.T) {
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0) // no O_CLOEXEC, as an inherited one
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	probe := func() bool {
		err := exec.Command("sh", "-c", "test -e /proc/self/fd/"+strconv.Itoa(fd)).Run()
		return err == nil
	}
	if !probe() {
		t.Skip("the child does not see the descriptor even before: nothing to check")
	}
	closeInheritedOnExec()
	if probe() {
		out, _ := exec.Command("ls", "-l", "/proc/self/fd").CombinedOutput()
		t.Errorf("descriptor %d still passed on to a child:\n%s", fd, strings.TrimSpace(string(out)))
	}
}
