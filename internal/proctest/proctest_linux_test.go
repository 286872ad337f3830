package proctest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// parentEnv runs this test binary as a parent that starts `sleep`, prints
// its pid and waits to be killed; the value says whether it uses
// DieWithTest.
const parentEnv = "PROCTEST_PARENT"

func TestMain(m *testing.M) {
	if mode := os.Getenv(parentEnv); mode != "" {
		cmd := exec.Command("sleep", "600")
		if mode == "tied" {
			DieWithTest(cmd)
		}
		if err := cmd.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		select {} // until killed
	}
	os.Exit(m.Run())
}

// TestDieWithTest kills a parent with SIGKILL, as a test timeout's exit or
// a CI runner would, and looks at the sleep it started: gone when tied,
// still there when not (the control: what the helper changes).
func TestDieWithTest(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		wantGone bool
	}{{"tied", true}, {"untied", false}} {
		t.Run(tc.mode, func(t *testing.T) {
			child := startParentAndKill(t, tc.mode)
			// Tied: SIGKILL was sent as the parent exited, before its Wait
			// returned; 10 s is a regression guard, not a timing. Untied:
			// nothing signals the child, so one look decides.
			wait := time.Duration(0)
			if tc.wantGone {
				wait = 10 * time.Second
			}
			gone := exited(t, child, wait)
			if gone != tc.wantGone {
				t.Fatalf("child of a killed %s parent: gone %v, want %v", tc.mode, gone, tc.wantGone)
			}
		})
	}
}

// startParentAndKill runs the parent, reads its child's pid, kills the
// parent and reaps it; it returns a pidfd of the child (closed, and the
// child killed, at cleanup).
func startParentAndKill(t *testing.T, mode string) int {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), parentEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("parent said %q: %v %v", line, err, perr)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0)
		_ = unix.Close(pidfd)
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	return pidfd
}

// exited waits up to d for the process behind pidfd to end (readable
// pidfd: it has exited, reaped or not).
func exited(t *testing.T, pidfd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(d.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
}
